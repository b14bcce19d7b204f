package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/adminapi"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/serving"
)

// named answers 200 with its name, so that a test sees which handler a route reached.
func named(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(name)) })
}

// serve sends a POST to path through h and returns the status and body.
func serve(h http.Handler, path string) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}")))
	return rec.Code, rec.Body.String()
}

// Issue 26, item 8: the operator API's bearer secret travelled on the admission port, which
// every pod reaches. The admission server must answer 404 for its routes; only the operator
// API's own listener serves them.
func TestAPIServersKeepTheOperatorAPIOffTheAdmissionPort(t *testing.T) {
	h := serving.Handlers{API: named("api"), Revoked: named("revoked"), Relay: named("relay")}
	type answer struct {
		Server, Path string
		Status       int
		Body         string
	}
	paths := []string{httpapi.PathPrefix, adminapi.PathRevoke, adminapi.PathRevokePod, adminapi.PathSweep, adminapi.PathReconcile}
	cases := map[string]struct {
		flags managerFlags
		want  []answer
	}{
		"with a secret": {
			flags: managerFlags{apiAddr: ":8082", adminAddr: "127.0.0.1:8083", adminSecret: "s"},
			want: []answer{
				{":8082", httpapi.PathPrefix, 200, "api"},
				{":8082", adminapi.PathRevoke, 404, "404 page not found\n"},
				{":8082", adminapi.PathRevokePod, 404, "404 page not found\n"},
				{":8082", adminapi.PathSweep, 404, "404 page not found\n"},
				{":8082", adminapi.PathReconcile, 404, "404 page not found\n"},
				{"127.0.0.1:8083", httpapi.PathPrefix, 404, "404 page not found\n"},
				{"127.0.0.1:8083", adminapi.PathRevoke, 200, "admin"},
				{"127.0.0.1:8083", adminapi.PathRevokePod, 200, "admin"},
				{"127.0.0.1:8083", adminapi.PathSweep, 200, "admin"},
				{"127.0.0.1:8083", adminapi.PathReconcile, 200, "admin"},
			},
		},
		"without a secret: no operator listener": {
			flags: managerFlags{apiAddr: ":8082", adminAddr: "127.0.0.1:8083"},
			want: []answer{
				{":8082", httpapi.PathPrefix, 200, "api"},
				{":8082", adminapi.PathRevoke, 404, "404 page not found\n"},
				{":8082", adminapi.PathRevokePod, 404, "404 page not found\n"},
				{":8082", adminapi.PathSweep, 404, "404 page not found\n"},
				{":8082", adminapi.PathReconcile, 404, "404 page not found\n"},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got []answer
			for _, srv := range apiServers(tc.flags, h, named("admin")) {
				for _, p := range paths {
					status, body := serve(srv.Handler, p)
					got = append(got, answer{srv.Addr, p, status, body})
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("answers (-want +got):\n%s", diff)
			}
		})
	}
}

func TestValidateAdminAddr(t *testing.T) {
	cases := map[string]struct {
		secret, admin, api string
		wantErr            string
	}{
		"no secret, no address":         {api: ":8082"},
		"no secret, the admission port": {admin: ":8082", api: ":8082"},
		"the loopback default":          {secret: "s", admin: "127.0.0.1:8083", api: ":8082"},
		"a secret without an address":   {secret: "s", api: ":8082", wantErr: "--admin-secret needs --admin-bind-address"},
		"the admission port":            {secret: "s", admin: ":8082", api: ":8082", wantErr: "needs a port of its own"},
		"the admission port, loopback":  {secret: "s", admin: "127.0.0.1:8082", api: ":8082", wantErr: "needs a port of its own"},
		"no port":                       {secret: "s", admin: "127.0.0.1", api: ":8082", wantErr: "--admin-bind-address"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := validateAdminAddr(tc.secret, tc.admin, tc.api)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("validateAdminAddr() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
