package sweeper

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/metrics"
)

// fakeStore is the sweeper's view of the store: pods that hold leases, and a record of what
// was reaped. Each call can be made to fail.
type fakeStore struct {
	mu            sync.Mutex
	pods          []lease.PodRef
	holderPodsErr error
	reapedPods    []lease.PodRef
}

func (s *fakeStore) SweepRound(context.Context) (leasestore.Round, error) {
	if s.holderPodsErr != nil {
		return leasestore.Round{}, s.holderPodsErr
	}
	return leasestore.Round{Pods: s.pods}, nil
}

func (s *fakeStore) ReconcileRound(context.Context, leasestore.Round) (leasestore.ReconcileResult, error) {
	return leasestore.ReconcileResult{}, nil
}

func (s *fakeStore) HolderPodsOf(_ context.Context, pods []lease.PodRef) ([]lease.PodRef, error) {
	if s.holderPodsErr != nil {
		return nil, s.holderPodsErr
	}
	var out []lease.PodRef
	for _, p := range pods {
		for _, h := range s.pods {
			if p == h {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

func (s *fakeStore) ReapPod(_ context.Context, pod lease.PodRef) ([]lease.Holder, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reapedPods = append(s.reapedPods, pod)
	return []lease.Holder{{Token: "t-" + pod.Name, Pod: pod, PodBound: true}}, nil
}

func (s *fakeStore) reaped() []lease.PodRef {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]lease.PodRef(nil), s.reapedPods...)
}

// fakeLiveness answers Confirm with a verdict, an error, or (hang) not at all until the call's
// context ends: an API server that does not answer.
type fakeLiveness struct {
	verdict liveness.Verdict
	err     error
	hang    bool
}

func (fakeLiveness) WaitForSync(context.Context) bool { return true }

func (l fakeLiveness) Confirm(ctx context.Context, _ lease.PodRef) (liveness.Verdict, error) {
	if l.hang {
		<-ctx.Done()
		return liveness.Verdict{}, ctx.Err()
	}
	return l.verdict, l.err
}

// listener records the holders handed to revocation.
type listener struct {
	mu      sync.Mutex
	holders []lease.Holder
}

func (l *listener) Revoked(_ context.Context, _ string, hs []lease.Holder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holders = append(l.holders, hs...)
}

// TestNoReapWhenLivenessIsUnknown: a pod reap is destructive, so the sweeper reaps only
// when the pod view confirms the pod dead. When the liveness read fails or does not answer
// (the API server is down), or the store cannot say who holds leases, nothing is reaped and
// nothing goes to revocation; the round reports the error and the next one retries. Both the
// periodic sweep and the immediate reap of a gone pod are covered. In a synctest bubble the
// confirmation timeout of a hanging read passes in virtual time.
func TestNoReapWhenLivenessIsUnknown(t *testing.T) {
	pod := lease.PodRef{Namespace: "ns", Name: "worker-1", UID: "u1"}
	dead := liveness.Verdict{Reason: liveness.ReasonNotFound}
	for name, tc := range map[string]struct {
		storeErr   error // of the store's read of who holds leases
		pods       fakeLiveness
		wantReaped []lease.PodRef
		wantErr    bool
	}{
		"dead pod is reaped (the control)": {
			pods: fakeLiveness{verdict: dead}, wantReaped: []lease.PodRef{pod}},
		"live pod is not reaped": {
			pods: fakeLiveness{verdict: liveness.Verdict{Alive: true, Reason: liveness.ReasonRunning}}},
		"liveness read fails": {
			pods: fakeLiveness{verdict: dead, err: errors.New("apiserver unavailable")}, wantErr: true},
		"liveness read times out": {
			pods: fakeLiveness{hang: true}, wantErr: true},
		"the store cannot list the holders' pods": {
			storeErr: errors.New("store unavailable"), pods: fakeLiveness{verdict: dead}, wantErr: true},
	} {
		t.Run(name+", sweep", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &fakeStore{pods: []lease.PodRef{pod}, holderPodsErr: tc.storeErr}
				l := &listener{}
				s := New(store, tc.pods, l, WithMetrics(metrics.New(nil)))
				_, err := s.Sweep(t.Context())
				if (err != nil) != tc.wantErr {
					t.Errorf("Sweep error = %v, want an error: %v", err, tc.wantErr)
				}
				assertReaped(t, store, l, tc.wantReaped)
			})
		})
		t.Run(name+", pod gone", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &fakeStore{pods: []lease.PodRef{pod}, holderPodsErr: tc.storeErr}
				l := &listener{}
				s := New(store, tc.pods, l, WithMetrics(metrics.New(nil)))
				s.PodGone(pod)
				s.reapGone(t.Context())
				assertReaped(t, store, l, tc.wantReaped)
			})
		})
	}
}

func assertReaped(t *testing.T, s *fakeStore, l *listener, want []lease.PodRef) {
	t.Helper()
	if diff := cmp.Diff(want, s.reaped()); diff != "" {
		t.Errorf("pods reaped (-want +got):\n%s", diff)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.holders) != len(want) {
		t.Errorf("holders handed to revocation: %+v, want those of %v", l.holders, want)
	}
}
