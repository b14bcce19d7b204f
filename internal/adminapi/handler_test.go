package adminapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vancetope/lease-operator/internal/adminapi"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/opsview"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
	"github.com/vancetope/lease-operator/internal/testutil/tokenscan"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

var sortStrings = cmpopts.SortSlices(func(a, b string) bool { return a < b })

func TestRevokeFreesTheSlot(t *testing.T) {
	s := newStore(t)
	f := newFixture(t, s, secret)
	ctx := ctxT(t)
	req := request("acme", "u", podA, caps(1, 1, 1, 1))
	h := mustAcquire(t, s, req)
	if _, err := s.Acquire(ctx, req); !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("second acquire before the revoke = %v, want busy", err)
	}

	rec := f.post(t, adminapi.PathRevoke, fmt.Sprintf(`{"token":%q}`, h.Token))
	if rec.Code != http.StatusOK {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body)
	}
	got := decode[opsview.RevokeResult](t, rec)
	want := opsview.RevokeResult{Revoked: true, Holder: opsview.HolderView{
		ID: h.ID, State: "HELD", Lease: "tex", Resource: "tex2pdf", Type: "tex",
		Tenant: "acme", Project: "p", User: "u", HolderRef: "job-1",
		Pod: "ns/pod-a", PodUID: "uid-a", PodBound: true, Payload: map[string]string{"jobId": "42"},
		Levels: []string{"tex2pdf|user|acme/u", "tex2pdf|project|acme/p", "tex2pdf|tenant|acme", "tex2pdf|global|*"},
		Fence:  h.Fence,
	}}
	if diff := cmp.Diff(want, got, sortStrings, cmpopts.IgnoreFields(opsview.HolderView{}, "AcquiredAt", "LastSeenAt")); diff != "" {
		t.Errorf("revoke answer (-want +got):\n%s", diff)
	}
	if got.Holder.AcquiredAt.IsZero() || got.Holder.LastSeenAt.IsZero() {
		t.Errorf("revoked holder without its server times: %+v", got.Holder)
	}

	// The state of the world: holder gone, every booked level returned, the handler queued.
	if _, err := s.GetHolder(ctx, h.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("holder after revoke: %v, want LEASE_LOST", err)
	}
	for key, v := range counters(t, s) {
		if v != [2]int{0, 0} {
			t.Errorf("counter %s after revoke: count %d, booked %d; want 0, 0", key, v[0], v[1])
		}
	}
	if _, err := s.Acquire(ctx, req); err != nil {
		t.Errorf("acquire after revoke: %v; the slot should be free", err)
	}
	if diff := cmp.Diff([]call{{Reason: "revoke", Tokens: []string{h.Token}}}, f.listener.got()); diff != "" {
		t.Errorf("listener (-want +got):\n%s", diff)
	}
	if n := f.listener.cancelledContexts(); n != 0 {
		t.Errorf("listener got %d contexts cancelled with the request; its work is asynchronous", n)
	}

	// The answer names the holder by its ID and carries no token.
	if strings.Contains(rec.Body.String(), h.Token) {
		t.Errorf("revoke answer carries the token: %s", rec.Body)
	}

	// Revoked is gone: the second revoke (by ID) finds nothing and dispatches nothing.
	expectError(t, f.post(t, adminapi.PathRevoke, fmt.Sprintf(`{"id":%q}`, h.ID)), http.StatusNotFound, httpjson.CodeNotFound)
	if n := len(f.listener.got()); n != 1 {
		t.Errorf("listener called %d times after a second revoke, want 1", n)
	}
}

func TestRevokeBindsTheTenant(t *testing.T) {
	cases := []struct {
		name        string
		tenant      string
		wantStatus  int
		wantRevoked bool
	}{
		{name: "other tenant", tenant: "globex", wantStatus: http.StatusNotFound},
		{name: "system tenant is no wildcard", tenant: "_vance", wantStatus: http.StatusNotFound},
		{name: "own tenant", tenant: "acme", wantStatus: http.StatusOK, wantRevoked: true},
		{name: "no tenant", tenant: "", wantStatus: http.StatusOK, wantRevoked: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			f := newFixture(t, s, secret)
			h := mustAcquire(t, s, request("acme", "u", podA, caps(1, 1, 1, 1)))
			body := fmt.Sprintf(`{"token":%q,"tenant":%q}`, h.Token, tc.tenant)

			rec := f.post(t, adminapi.PathRevoke, body)
			wantHolders, wantCalls := []string{h.Token}, []call(nil)
			if tc.wantRevoked {
				if rec.Code != tc.wantStatus {
					t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
				}
				wantHolders, wantCalls = []string{}, []call{{Reason: "revoke", Tokens: []string{h.Token}}}
			} else {
				e := expectError(t, rec, tc.wantStatus, httpjson.CodeNotFound)
				if !strings.Contains(e.Message, tc.tenant) {
					t.Errorf("message %q does not name the tenant %q", e.Message, tc.tenant)
				}
			}
			if diff := cmp.Diff(wantHolders, holderTokens(t, s)); diff != "" {
				t.Errorf("holders (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantCalls, f.listener.got(), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("listener (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRevokePodRevokesEveryHolderOfThePod(t *testing.T) {
	s := newStore(t)
	f := newFixture(t, s, secret)
	wide := caps(5, 5, 5, 5)
	a1 := mustAcquire(t, s, request("acme", "u1", podA, wide))
	a2 := mustAcquire(t, s, request("globex", "u2", podA, wide))
	recreated := mustAcquire(t, s, request("acme", "u3", podA2, wide)) // same name, other UID
	b := mustAcquire(t, s, request("acme", "u4", podB, wide))

	rec := f.post(t, adminapi.PathRevokePod, `{"namespace":"ns","name":"pod-a"}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("revoke-pod: %d %s", rec.Code, rec.Body)
	}
	got := decode[opsview.RevokePodResult](t, rec)
	var gotTokens []string
	for _, h := range got.Holders {
		gotTokens = append(gotTokens, h.ID)
		if h.Pod != "ns/pod-a" {
			t.Errorf("revoked holder %s of pod %q", h.ID, h.Pod)
		}
	}
	wantTokens := []string{a1.ID, a2.ID, recreated.ID}
	if got.Revoked != 3 {
		t.Errorf("revoked %d, want 3", got.Revoked)
	}
	if diff := cmp.Diff(wantTokens, gotTokens, sortStrings); diff != "" {
		t.Errorf("revoked holders (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{b.Token}, holderTokens(t, s)); diff != "" {
		t.Errorf("holders left (-want +got):\n%s", diff)
	}
	calls := f.listener.got()
	if len(calls) != 1 || calls[0].Reason != "revoke" {
		t.Fatalf("listener calls %+v, want one with reason revoke", calls)
	}
	if diff := cmp.Diff([]string{a1.Token, a2.Token, recreated.Token}, calls[0].Tokens, sortStrings); diff != "" {
		t.Errorf("listener tokens (-want +got):\n%s", diff)
	}
	// Counters equal the booked holders at rest: only pod-b's holder books anything.
	for key, v := range counters(t, s) {
		if v[0] != v[1] {
			t.Errorf("counter %s drifts after revoke-pod: count %d, booked %d", key, v[0], v[1])
		}
		if v[0] > 1 {
			t.Errorf("counter %s still counts %d", key, v[0])
		}
	}

	// Again: nothing left on the pod, nothing dispatched.
	rec = f.post(t, adminapi.PathRevokePod, `{"namespace":"ns","name":"pod-a"}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("second revoke-pod: %d %s", rec.Code, rec.Body)
	}
	if diff := cmp.Diff(opsview.RevokePodResult{Revoked: 0, Holders: []opsview.HolderView{}}, decode[opsview.RevokePodResult](t, rec)); diff != "" {
		t.Errorf("second revoke-pod (-want +got):\n%s", diff)
	}
	if n := len(f.listener.got()); n != 1 {
		t.Errorf("listener called %d times, want 1", n)
	}
}

func TestAuthorization(t *testing.T) {
	s := newStore(t)
	h := mustAcquire(t, s, request("acme", "u", podA, caps(1, 1, 1, 1)))
	revoke := fmt.Sprintf(`{"token":%q}`, h.Token)
	cases := []struct {
		name          string
		secret        string
		method, path  string
		authorization string
		wantStatus    int
		wantCode      string
	}{
		{"disabled without credentials", "", http.MethodPost, adminapi.PathRevoke, "", http.StatusForbidden, adminapi.CodeDisabled},
		{"disabled even with an empty bearer", "", http.MethodPost, adminapi.PathRevoke, "Bearer ", http.StatusForbidden, adminapi.CodeDisabled},
		{"disabled on every route", "", http.MethodPost, adminapi.PathSweep, "Bearer " + secret, http.StatusForbidden, adminapi.CodeDisabled},
		{"disabled on unknown routes", "", http.MethodGet, adminapi.PathPrefix + "nope", "", http.StatusForbidden, adminapi.CodeDisabled},
		{"missing header", secret, http.MethodPost, adminapi.PathRevoke, "", http.StatusUnauthorized, httpjson.CodeUnauthorized},
		{"wrong secret", secret, http.MethodPost, adminapi.PathRevoke, "Bearer wrong", http.StatusUnauthorized, httpjson.CodeUnauthorized},
		{"secret prefix", secret, http.MethodPost, adminapi.PathRevoke, "Bearer " + secret[:4], http.StatusUnauthorized, httpjson.CodeUnauthorized},
		{"secret with suffix", secret, http.MethodPost, adminapi.PathRevoke, "Bearer " + secret + "x", http.StatusUnauthorized, httpjson.CodeUnauthorized},
		{"basic scheme", secret, http.MethodPost, adminapi.PathRevoke, "Basic " + secret, http.StatusUnauthorized, httpjson.CodeUnauthorized},
		{"bare secret", secret, http.MethodPost, adminapi.PathRevoke, secret, http.StatusUnauthorized, httpjson.CodeUnauthorized},
		{"unknown route needs auth first", secret, http.MethodPost, adminapi.PathPrefix + "nope", "", http.StatusUnauthorized, httpjson.CodeUnauthorized},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, s, tc.secret)
			rec := f.do(t, tc.method, tc.path, revoke, tc.authorization)
			expectError(t, rec, tc.wantStatus, tc.wantCode)
			if tc.wantStatus == http.StatusUnauthorized && !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without a Bearer challenge: %q", rec.Header().Get("WWW-Authenticate"))
			}
			if diff := cmp.Diff([]string{h.Token}, holderTokens(t, s)); diff != "" {
				t.Errorf("holders after a refused request (-want +got):\n%s", diff)
			}
			if calls := f.listener.got(); len(calls) != 0 || f.sweeper.count() != 0 {
				t.Errorf("refused request reached listener %v / sweeper %d", calls, f.sweeper.count())
			}
		})
	}

	t.Run("scheme is case-insensitive", func(t *testing.T) {
		f := newFixture(t, s, secret)
		rec := f.do(t, http.MethodPost, adminapi.PathReconcile, "", "bearer "+secret)
		if rec.Code != http.StatusOK {
			t.Errorf("status %d: %s", rec.Code, rec.Body)
		}
	})
}

func TestBadRequests(t *testing.T) {
	s := newStore(t)
	f := newFixture(t, s, secret, adminapi.WithMaxBodyBytes(256))
	h := mustAcquire(t, s, request("acme", "u", podA, caps(1, 1, 1, 1)))
	cases := []struct {
		name      string
		path      string
		body      string
		wantField string
	}{
		{"unknown field", adminapi.PathRevoke, fmt.Sprintf(`{"token":%q,"force":true}`, h.Token), "force"},
		{"misspelt field", adminapi.PathRevoke, fmt.Sprintf(`{"tokn":%q}`, h.Token), "tokn"},
		{"missing token", adminapi.PathRevoke, `{}`, "token"},
		{"short token", adminapi.PathRevoke, `{"token":"abc"}`, "token"},
		{"uppercase token", adminapi.PathRevoke, fmt.Sprintf(`{"token":%q}`, strings.ToUpper(h.Token)), "token"},
		{"token with a space", adminapi.PathRevoke, fmt.Sprintf(`{"token":%q}`, " "+h.Token), "token"},
		{"non-hex token", adminapi.PathRevoke, `{"token":"zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"}`, "token"},
		{"token as number", adminapi.PathRevoke, `{"token":5}`, "token"},
		{"bad tenant", adminapi.PathRevoke, fmt.Sprintf(`{"token":%q,"tenant":"a/b"}`, h.Token), "tenant"},
		{"empty body", adminapi.PathRevoke, ``, "body"},
		{"malformed", adminapi.PathRevoke, `{"token":`, "body"},
		{"not an object", adminapi.PathRevoke, `["x"]`, "body"},
		{"two objects", adminapi.PathRevoke, fmt.Sprintf(`{"token":%q}{}`, h.Token), "body"},
		{"token as id", adminapi.PathRevoke, fmt.Sprintf(`{"id":%q}`, h.Token), "id"},
		{"id and token", adminapi.PathRevoke, fmt.Sprintf(`{"id":%q,"token":%q}`, h.ID, h.Token), "id"},
		{"too large", adminapi.PathRevoke, fmt.Sprintf(`{"token":%q,"tenant":"%s"}`, h.Token, strings.Repeat("a", 300)), "body"},
		{"missing namespace", adminapi.PathRevokePod, `{"name":"pod-a"}`, "namespace"},
		{"missing name", adminapi.PathRevokePod, `{"namespace":"ns"}`, "name"},
		{"bad namespace", adminapi.PathRevokePod, `{"namespace":"NS","name":"pod-a"}`, "namespace"},
		{"bad name", adminapi.PathRevokePod, `{"namespace":"ns","name":"pod_a"}`, "name"},
		{"pod with uid", adminapi.PathRevokePod, `{"namespace":"ns","name":"pod-a","uid":"x"}`, "uid"},
		{"sweep with a field", adminapi.PathSweep, `{"dryRun":true}`, "dryRun"},
		{"reconcile with junk", adminapi.PathReconcile, `nope`, "body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := f.post(t, tc.path, tc.body)
			// A refused token or ID is not echoed: it may be a token in disguise (another
			// case, a space, in the id field), a bearer secret (docs/security.md, "Tokens").
			if hits := tokenscan.Text(strings.ToLower(rec.Body.String()), h.Token); len(hits) > 0 {
				t.Errorf("the answer echoes the token: %v", hits)
			}
			e := expectError(t, rec, http.StatusBadRequest, httpjson.CodeInvalid)
			if e.Field != tc.wantField {
				t.Errorf("field %q, want %q (message %q)", e.Field, tc.wantField, e.Message)
			}
		})
	}
	if diff := cmp.Diff([]string{h.Token}, holderTokens(t, s)); diff != "" {
		t.Errorf("holders after bad requests (-want +got):\n%s", diff)
	}
	if calls := f.listener.got(); len(calls) != 0 || f.sweeper.count() != 0 {
		t.Errorf("bad requests reached listener %v / sweeper %d", calls, f.sweeper.count())
	}
}

func TestRoutes(t *testing.T) {
	f := newFixture(t, newStore(t), secret)
	cases := []struct {
		name       string
		method     string
		path       string
		wantStatus int
		wantCode   string
	}{
		{"GET revoke", http.MethodGet, adminapi.PathRevoke, http.StatusMethodNotAllowed, httpjson.CodeMethodNotAllowed},
		{"DELETE revoke-pod", http.MethodDelete, adminapi.PathRevokePod, http.StatusMethodNotAllowed, httpjson.CodeMethodNotAllowed},
		{"GET sweep", http.MethodGet, adminapi.PathSweep, http.StatusMethodNotAllowed, httpjson.CodeMethodNotAllowed},
		{"unknown route", http.MethodPost, adminapi.PathPrefix + "list", http.StatusNotFound, httpjson.CodeUnknownRoute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := f.do(t, tc.method, tc.path, "", "Bearer "+secret)
			expectError(t, rec, tc.wantStatus, tc.wantCode)
			if tc.wantStatus == http.StatusMethodNotAllowed && rec.Header().Get("Allow") != http.MethodPost {
				t.Errorf("Allow %q, want POST", rec.Header().Get("Allow"))
			}
		})
	}
}

func TestStoreDownIsUnavailable(t *testing.T) {
	f := newFixture(t, downStore(t), secret)
	cases := []struct {
		name string
		path string
		body string
	}{
		{"revoke", adminapi.PathRevoke, `{"token":"0123456789abcdef0123456789abcdef"}`},
		{"revoke with tenant", adminapi.PathRevoke, `{"token":"0123456789abcdef0123456789abcdef","tenant":"acme"}`},
		{"revoke-pod", adminapi.PathRevokePod, `{"namespace":"ns","name":"pod-a"}`},
		{"reconcile", adminapi.PathReconcile, ``},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			expectError(t, f.post(t, tc.path, tc.body), http.StatusServiceUnavailable, httpjson.CodeUnavailable)
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("answered after %v; the store's operation timeout should bound it", d)
			}
		})
	}
	if calls := f.listener.got(); len(calls) != 0 {
		t.Errorf("listener got %v from a store that is down", calls)
	}
}

// partialError is an error body whose result is decoded as T.
type partialError[T any] struct {
	Error   string `json:"error"`
	Message string `json:"message"`
	Result  *T     `json:"result"`
}

func TestSweep(t *testing.T) {
	partial := sweeper.Result{Idle: 2, Reconcile: leasestore.ReconcileResult{Skipped: 1}}
	cases := []struct {
		name       string
		body       string
		res        sweeper.Result
		err        error
		wantStatus int
		wantCode   string
		want       opsview.SweepView
	}{
		{
			name:       "round",
			res:        sweeper.Result{Idle: 2, Pod: 1, Reconcile: leasestore.ReconcileResult{Corrected: 1, Deleted: 3, Repaired: 4, Skipped: 5}},
			wantStatus: http.StatusOK,
			want:       opsview.SweepView{Idle: 2, Pod: 1, Reconcile: opsview.ReconcileView{Corrected: 1, Deleted: 3, Repaired: 4, Skipped: 5}},
		},
		{name: "empty object body", body: `{}`, wantStatus: http.StatusOK},
		{
			name: "store failed mid-round", res: partial,
			err:        fmt.Errorf("reaping pods: %w", lease.ErrUnavailable),
			wantStatus: http.StatusServiceUnavailable, wantCode: httpjson.CodeUnavailable,
			want: opsview.SweepView{Idle: 2, Reconcile: opsview.ReconcileView{Skipped: 1}},
		},
		{
			name: "API server failed mid-round", res: partial,
			err:        errors.New("confirming pod death: connection refused"),
			wantStatus: http.StatusInternalServerError, wantCode: httpjson.CodeInternal,
			want: opsview.SweepView{Idle: 2, Reconcile: opsview.ReconcileView{Skipped: 1}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, downStore(t), secret) // a sweep does not touch the admin API's store
			f.sweeper.res, f.sweeper.err = tc.res, tc.err
			rec := f.post(t, adminapi.PathSweep, tc.body)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			var got opsview.SweepView
			if tc.err == nil {
				got = decode[opsview.SweepView](t, rec)
			} else {
				e := decode[partialError[opsview.SweepView]](t, rec)
				if e.Error != tc.wantCode || e.Result == nil {
					t.Fatalf("error %q with result %v, want %q with the partial round", e.Error, e.Result, tc.wantCode)
				}
				got = *e.Result
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("sweep (-want +got):\n%s", diff)
			}
			if f.sweeper.count() != 1 {
				t.Errorf("sweeper ran %d rounds, want 1", f.sweeper.count())
			}
			if calls := f.listener.got(); len(calls) != 0 {
				t.Errorf("the admin API dispatched %v itself; the sweeper dispatches its round", calls)
			}
		})
	}
}

// TestPartialRevokeStillDispatchesAndTheSweepFinishesIt: a revoke that released the holder and
// then failed to give its slots back (a crash window of docs/design.md) has revoked: the handler
// must run, the answer says what happened, and the sweep gives the slots back once the released
// holder expires. Reconcile through the admin API removes entries whose holder is gone.
func TestPartialRevokeStillDispatchesAndTheSweepFinishesIt(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	var failDecrement leasestore.FaultFunc = func(step leasestore.Step, _ string) error {
		if step == leasestore.StepHolderReleased {
			return errors.New("network cut after the release")
		}
		return nil
	}
	// A released holder expires its operation timeout and a second after it was written.
	faulty := newFixture(t, newStoreAt(t, uri, db, leasestore.WithOpTimeout(300*time.Millisecond), leasestore.WithFault(failDecrement)), secret)
	careful := newFixture(t, newStoreAt(t, uri, db), secret)

	wide := caps(2, 2, 2, 2)
	kept := mustAcquire(t, careful.store, request("acme", "u", podA, wide))
	lost := mustAcquire(t, careful.store, request("acme", "u", podA, wide))

	rec := faulty.post(t, adminapi.PathRevoke, fmt.Sprintf(`{"token":%q}`, lost.Token))
	e := decode[partialError[opsview.RevokeResult]](t, rec)
	if rec.Code != http.StatusServiceUnavailable || e.Error != httpjson.CodeUnavailable {
		t.Fatalf("partial revoke: %d %+v", rec.Code, e)
	}
	if e.Result == nil || !e.Result.Revoked || e.Result.Holder.ID != lost.ID {
		t.Errorf("partial revoke result %+v, want the revoked holder %s", e.Result, lost.Token)
	}
	if diff := cmp.Diff([]call{{Reason: "revoke", Tokens: []string{lost.Token}}}, faulty.listener.got()); diff != "" {
		t.Errorf("listener (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{kept.Token}, holderTokens(t, careful.store)); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}

	// The released holder keeps its entries until its give-back is done: every level counts 2,
	// and both entries name a holder that exists. The sweep does the give-back again once the
	// released holder expires.
	if diff := cmp.Diff(map[string][2]int{}, notAt(counters(t, careful.store), [2]int{2, 2})); diff != "" {
		t.Errorf("counters right after the partial revoke (-want +got):\n%s", diff)
	}
	waitfor.Until(t, "the sweep gives the released holder's slots back", func() bool {
		if _, err := careful.store.ReapIdle(context.Background(), ""); err != nil {
			t.Fatal(err)
		}
		return len(notAt(counters(t, careful.store), [2]int{1, 1})) == 0
	})

	// Entries of a holder that is gone (bookings that arrived after its release): reconcile
	// removes them.
	for _, k := range kept.Levels {
		if err := storetest.LateEntry(context.Background(), uri, db, k, "lh-00000000000000000000dead"); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		want  opsview.ReconcileView
		state [2]int
	}{
		{"entries of a gone holder", opsview.ReconcileView{Corrected: 4, Repaired: 4}, [2]int{1, 1}},
		{"nothing left to do", opsview.ReconcileView{}, [2]int{1, 1}},
	} {
		rec := careful.post(t, adminapi.PathReconcile, "")
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: reconcile %d %s", tc.name, rec.Code, rec.Body)
		}
		if diff := cmp.Diff(tc.want, decode[opsview.ReconcileView](t, rec)); diff != "" {
			t.Errorf("%s: reconcile (-want +got):\n%s", tc.name, diff)
		}
		if diff := cmp.Diff(map[string][2]int{}, notAt(counters(t, careful.store), tc.state)); diff != "" {
			t.Errorf("%s: counters not at %v (-want +got):\n%s", tc.name, tc.state, diff)
		}
	}
	if got := testutil.ToFloat64(careful.metrics.Reconcile.WithLabelValues(metrics.ReconcileCorrected)); got != 4 {
		t.Errorf("reconcile{outcome=corrected} = %v, want 4", got)
	}
	if got := testutil.CollectAndCount(faulty.metrics.Reap); got != 0 {
		t.Errorf("the admin API counted %d reap series itself; the listener counts revocations", got)
	}
}

// notAt returns the counters whose (count, booked) is not want.
func notAt(cs map[string][2]int, want [2]int) map[string][2]int {
	out := map[string][2]int{}
	for k, v := range cs {
		if v != want {
			out[k] = v
		}
	}
	return out
}

// TestErrorBodiesAreJSON pins the wire shape the kubectl plugin decodes.
func TestErrorBodiesAreJSON(t *testing.T) {
	f := newFixture(t, newStore(t), secret)
	rec := f.post(t, adminapi.PathRevoke, `{"token":"0123456789abcdef0123456789abcdef"}`)
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"error": "NOT_FOUND", "message": "no holder " + lease.HolderID("0123456789abcdef0123456789abcdef") + " (released, reaped or revoked already?)"}
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("404 body (-want +got):\n%s", diff)
	}
	if rec.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", rec.Header().Get("Cache-Control"))
	}
}
