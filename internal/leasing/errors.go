package leasing

import (
	"errors"
	"fmt"

	"github.com/vancetope/lease-operator/internal/lease"
)

// definitionError maps an error of the definition resolver to the admission outcomes: a bad
// reference or inline definition is invalid (the field is kept), anything else fails closed.
func definitionError(op string, err error) error {
	if errors.Is(err, lease.ErrInvalid) {
		return err
	}
	return lease.Unavailable(op, err)
}

// storeError maps an error of a store call: lease.ErrLost and lease.ErrBusy pass through, the store's
// own validation becomes an *lease.InvalidError for field, and everything else fails closed.
func storeError(op, field string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, lease.ErrLost), errors.Is(err, lease.ErrBusy):
		return fmt.Errorf("%s: %w", op, err)
	case errors.Is(err, lease.ErrInvalid):
		return &lease.InvalidError{Field: field, Detail: err.Error()}
	default:
		return lease.Unavailable(op, err)
	}
}
