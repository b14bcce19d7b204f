package leasing

import (
	"context"
	"errors"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/metrics"
)

// Check is the check-at-use (docs/design.md): it touches the lease, so the idle TTL runs
// from the last use, and fails with lease.ErrLost when the lease was released, reaped or revoked.
// A store failure is an *lease.UnavailableError.
func (s *Service) Check(ctx context.Context, token string) error {
	_, err := s.CheckFence(ctx, token)
	return err
}

// CheckFence is Check that also answers the lease's fence (docs/fencing.md): for a lease of
// several resources, the first part's.
func (s *Service) CheckFence(ctx context.Context, token string) (int64, error) {
	fence, _, err := s.CheckParts(ctx, token)
	return fence, err
}

// CheckParts is the check-at-use that answers the lease's fence and the parts of a lease of
// several resources (Request.Leases), each with its fence, in the order of their resources;
// parts is nil for a lease of one resource. fence is the lease's fence, or the first part's (docs/api.md,
// "Check at every use").
func (s *Service) CheckParts(ctx context.Context, token string) (fence int64, parts []lease.Part, err error) {
	if !ValidToken(token) {
		return 0, nil, lease.Invalid("token", "is not a valid lease token")
	}
	fence, parts, err = s.store.TouchParts(ctx, token)
	label := s.tokens.get(token)
	switch {
	case err == nil:
		s.metrics.Check.WithLabelValues(label, metrics.CheckOK).Inc()
		return fence, parts, nil
	case errors.Is(err, lease.ErrLost):
		s.metrics.Check.WithLabelValues(label, metrics.CheckLost).Inc()
		s.tokens.forget(token)
		return 0, nil, storeError("checking lease", "token", err)
	default:
		return 0, nil, storeError("checking lease", "token", err)
	}
}

// UpdatePayload replaces the payload of a held lease; it also counts as a use (touch).
// Errors: *lease.InvalidError (field "payload"), lease.ErrLost, *lease.UnavailableError.
func (s *Service) UpdatePayload(ctx context.Context, token string, payload map[string]string) error {
	if !ValidToken(token) {
		return lease.Invalid("token", "is not a valid lease token")
	}
	if err := validatePayload(payload); err != nil {
		return err
	}
	err := s.store.UpdatePayload(ctx, token, payload)
	if errors.Is(err, lease.ErrLost) {
		s.tokens.forget(token)
	}
	return storeError("updating lease payload", "payload", err)
}

// Release gives the lease back. It is idempotent: the outcome is ReleaseOK when this call
// released it, ReleaseAlreadyReleased when it was gone already (released, reaped or revoked),
// and ReleaseError with an *lease.UnavailableError when the store failed.
func (s *Service) Release(ctx context.Context, token string) (string, error) {
	if !ValidToken(token) {
		return ReleaseError, lease.Invalid("token", "is not a valid lease token")
	}
	released, err := s.store.Release(ctx, token)
	label := s.tokens.get(token)
	outcome := ReleaseOK
	switch {
	case err != nil:
		outcome = ReleaseError
		err = storeError("releasing lease", "token", err)
	case !released:
		outcome = ReleaseAlreadyReleased
	}
	if err == nil {
		s.tokens.forget(token)
	}
	s.metrics.Release.WithLabelValues(label, outcome).Inc()
	return outcome, err
}
