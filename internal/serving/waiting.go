package serving

import (
	"context"

	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/waitq"
)

// Waiting wires waiting (docs/waiting.md): one wait queue per process, whose waiters are woken
// by this process's store (a slot it handed to one of them) and by one notifier that follows
// the slots other processes hand to them.
type Waiting struct{ Queue *waitq.Queue }

// NewWaiting returns the wiring of a new queue.
func NewWaiting() Waiting { return Waiting{Queue: waitq.New()} }

// StoreOptions make the store wake the queue and publish hand-overs for other processes.
func (w Waiting) StoreOptions() []leasestore.Option {
	return []leasestore.Option{leasestore.WithGrantHook(w.granted), leasestore.WithGrantEvents()}
}

// granted wakes the waiters of grants that wait in this process.
func (w Waiting) granted(grants []leasestore.Grant) {
	for _, g := range grants {
		w.Queue.Granted(g.ID, g.Key)
	}
}

// ServiceOptions make the acquisition service wait in the queue.
func (w Waiting) ServiceOptions() []leasing.Option {
	return []leasing.Option{leasing.WithWaitQueue(w.Queue)}
}

// FollowDefinitions wakes every waiter of the process when onChange reports that a
// definition may have changed (the resolver's cache was invalidated, or the manager said so
// to an agent), so that each re-resolves and a raised cap is taken at once rather than at its
// next safety look (docs/waiting.md, "Definition changes").
func (w Waiting) FollowDefinitions(onChange func(func())) {
	onChange(func() { w.Queue.WakeAll() })
}

// StartNotifier follows the other processes' freed slots until ctx ends. It runs on every
// replica (not only the leader): every replica serves acquisitions.
func (w Waiting) StartNotifier(ctx context.Context, store *leasestore.Store) {
	n := leasestore.NewNotifier(store, w.granted, func() { w.Queue.WakeAll() })
	go n.Run(ctx)
}
