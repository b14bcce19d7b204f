package liveapi

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
)

// TestStoreErrorsCarryNoInternalText: a tenant reads the live API's errors, so the driver's
// text (hosts, topology) and a definition's documents go to the manager's log under a
// correlation id that the answer names, never into the answer (issue 42, finding 5).
func TestStoreErrorsCarryNoInternalText(t *testing.T) {
	const driver = "server selection error: current topology: { Type: ReplicaSetNoPrimary, Servers: [{ Addr: mongo-0.mongo.lease-store.svc:27017 }] }"
	cases := map[string]struct {
		err      error
		isStatus func(error) bool
		says     string
	}{
		"store down": {err: lease.Unavailable("listing holders", errors.New(driver)),
			isStatus: apierrors.IsServiceUnavailable, says: "listing holders: the lease store is unavailable"},
		"definition broken": {err: lease.Unavailable("resolving", &definition.UnavailableError{Name: "tex", Source: "lease-system/tex-a", Err: errors.New(driver)}),
			isStatus: apierrors.IsServiceUnavailable, says: `listing holders: the definition of lease "tex" is unavailable`},
		"unexpected": {err: errors.New(driver), isStatus: apierrors.IsInternalError, says: "listing holders failed"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var logged []string
			log := funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{})
			got := storeError(log, "listing holders", tc.err)
			if !tc.isStatus(got) {
				t.Fatalf("storeError() = %v, not the wanted status", got)
			}
			msg := got.Error()
			if strings.Contains(msg, "mongo-0") || strings.Contains(msg, "topology") || strings.Contains(msg, "tex-a") {
				t.Errorf("answer %q carries internal text", msg)
			}
			m := regexp.MustCompile(`correlation id ([0-9a-f]{16}) in the manager's log`).FindStringSubmatch(msg)
			if !strings.Contains(msg, tc.says) || m == nil {
				t.Fatalf("answer %q: want %q and a correlation id", msg, tc.says)
			}
			if len(logged) != 1 || !strings.Contains(logged[0], m[1]) || !strings.Contains(logged[0], "mongo-0") {
				t.Errorf("log %q: want one line with the cause and the id %s", logged, m[1])
			}
		})
	}
}
