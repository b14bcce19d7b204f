package main

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/waitq"
)

// waiting wires event-driven waiting (docs/waiting.md): one wait queue per process, woken by
// this process's store (every slot it gives back) and by one notifier that follows the slots
// other processes give back.
type waiting struct{ queue *waitq.Queue }

func newWaiting() waiting { return waiting{queue: waitq.New()} }

// storeOptions make the store wake the queue and publish freed slots for other processes.
func (w waiting) storeOptions() []leasestore.Option {
	return []leasestore.Option{leasestore.WithFreedHook(w.queue.Freed), leasestore.WithFreedEvents()}
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
	n := leasestore.NewNotifier(store, w.queue.Notified, func() { w.queue.WakeAll() })
	go n.Run(ctx)
}

// dropReservations removes a gone pod's places in the wait queues at once (docs/waiting.md),
// on its own goroutine: pod-gone callbacks must not block. A failure leaves them to expire.
func (w waiting) dropReservations(ctx context.Context, store *leasestore.Store) func(lease.PodRef) {
	log := ctrl.Log.WithName("waiting")
	return func(pod lease.PodRef) {
		go func() {
			if _, err := store.DropReservations(ctx, pod); err != nil {
				log.Error(err, "Dropping the wait-queue reservations of a gone pod failed; they expire", "pod", pod.String())
			}
		}()
	}
}
