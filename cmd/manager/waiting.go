package main

import (
	"context"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/waitq"
)

// waiting wires waiting (docs/waiting.md): one wait queue per process, whose waiters are woken
// by this process's store (a slot it handed to one of them) and by one notifier that follows
// the slots other processes hand to them.
type waiting struct{ queue *waitq.Queue }

func newWaiting() waiting { return waiting{queue: waitq.New()} }

// storeOptions make the store wake the queue and publish hand-overs for other processes.
func (w waiting) storeOptions() []leasestore.Option {
	return []leasestore.Option{leasestore.WithGrantHook(w.granted), leasestore.WithGrantEvents()}
}

// granted wakes the waiters of grants that wait in this process.
func (w waiting) granted(grants []leasestore.Grant) {
	for _, g := range grants {
		w.queue.Granted(g.ID, g.Key)
	}
}

// serviceOptions make the acquisition service wait in the queue.
func (w waiting) serviceOptions() []leasing.Option {
	return []leasing.Option{leasing.WithWaitQueue(w.queue)}
}

// followDefinitions wakes every waiter of the process when a definition may have changed (the
// resolver's cache was invalidated), so that each re-resolves and a raised cap is taken at
// once rather than at its next safety look (docs/waiting.md, "Definition changes").
func (w waiting) followDefinitions(r *definition.Resolver) {
	r.OnChange(func() { w.queue.WakeAll() })
}

// startNotifier follows the other processes' freed slots until ctx ends. It runs on every
// replica (not only the leader): every replica serves acquisitions.
func (w waiting) startNotifier(ctx context.Context, store *leasestore.Store) {
	n := leasestore.NewNotifier(store, w.granted, func() { w.queue.WakeAll() })
	go n.Run(ctx)
}
