package leasestore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/tokenscan"
)

// TestErrorsNameTheHolderByID: the store's errors reach logs, pod Events and conditions, and
// the answers of the admission and live APIs, so they name a holder by its public ID, never by
// its token, a bearer secret (docs/security.md, "Tokens").
func TestErrorsNameTheHolderByID(t *testing.T) {
	const gone = "0123456789abcdef0123456789abcdef"
	injected := errors.New("injected")
	cases := map[string]struct {
		opts []leasestore.Option
		// do acts on the store and returns the token it acted on and the error.
		do   func(ctx context.Context, t *testing.T, s *leasestore.Store) (string, error)
		want error
	}{
		"check of a holder that is gone": {
			do: func(ctx context.Context, _ *testing.T, s *leasestore.Store) (string, error) {
				_, err := s.TouchFence(ctx, gone)
				return gone, err
			},
			want: lease.ErrLost,
		},
		"payload of a holder that is gone": {
			do: func(ctx context.Context, _ *testing.T, s *leasestore.Store) (string, error) {
				return gone, s.UpdatePayload(ctx, gone, map[string]string{"jobId": "j"})
			},
			want: lease.ErrLost,
		},
		"read of a holder that is gone": {
			do: func(ctx context.Context, _ *testing.T, s *leasestore.Store) (string, error) {
				_, err := s.GetHolder(ctx, gone)
				return gone, err
			},
			want: lease.ErrLost,
		},
		"release that fails after the holder was marked": {
			opts: []leasestore.Option{leasestore.WithFault(func(st leasestore.Step, _ string) error {
				if st == leasestore.StepHolderReleased {
					return injected
				}
				return nil
			})},
			do: func(ctx context.Context, t *testing.T, s *leasestore.Store) (string, error) {
				h := mustAcquire(t, s, request("r", "acme", "p", "u", allCaps(9, 9, 9, 9)))
				_, err := s.Release(ctx, h.Token)
				return h.Token, err
			},
			want: injected,
		},
		"delete of a release mark that fails": {
			do: func(ctx context.Context, t *testing.T, s *leasestore.Store) (string, error) {
				h := mustAcquire(t, s, request("r", "acme", "p", "u", allCaps(9, 9, 9, 9)))
				cancelled, cancel := context.WithCancel(ctx)
				cancel()
				return h.Token, s.DeleteMark(cancelled, h.Token)
			},
			want: lease.ErrUnavailable,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := newStore(t, tc.opts...)
			token, err := tc.do(ctxT(t), t, s)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error = %v, want %v", err, tc.want)
			}
			if hits := tokenscan.Text(err.Error(), token); len(hits) > 0 {
				t.Errorf("the error carries the token: %v", hits)
			}
			if id := lease.HolderID(token); !strings.Contains(err.Error(), id) {
				t.Errorf("error %q does not name the holder %s", err, id)
			}
		})
	}
}
