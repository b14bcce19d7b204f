package main

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/vancetope/lease-operator/internal/adminapi"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/deflink"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/sweeper"
)

// This file holds the pieces that the manager and the agent both build, so that the two
// modes resolve, store and route in exactly the same way.

// eventsKeep is how long a revocation notice stays readable by the app's long-poll.
const eventsKeep = 5 * time.Minute

// maxWait bounds how long one acquire request may wait for a slot, so that its answer fits
// in the servers' write timeout; a definition's longer waitMs is cut to it.
const maxWait = 80 * time.Second

// setupStore connects to MongoDB. The returned close function is deferred by the caller.
func setupStore(f storeFlags, opts ...leasestore.Option) (*leasestore.Store, func(), error) {
	store, err := leasestore.Connect(f.uri, f.database, opts...)
	if err != nil {
		return nil, nil, err
	}
	return store, func() { _ = store.Close(context.Background()) }, nil
}

// routeHandlers are the HTTP handlers a process serves; a nil handler is not routed.
type routeHandlers struct {
	// api is the admission API (acquire, check, payload, release, events).
	api http.Handler
	// revoked receives revocations forwarded by the reaper of another pod.
	revoked http.Handler
	// relay runs an agent's lazy idle sweep on the manager.
	relay http.Handler
	// reclaim runs an agent waiter's borrowing reclaim on the manager.
	reclaim http.Handler
	// definitions answers the agents' definitions and tenancy (deflink).
	definitions http.Handler
}

// route is one entry of the route table.
type route struct {
	path    string
	handler http.Handler
}

// routeTable is the route table of the admission servers of both modes, built from the
// packages' exported path constants. The operator API is not among them: it has a listener of
// its own (adminRoutes), so the admission port answers 404 for it.
func routeTable(h routeHandlers) []route {
	return []route{
		{httpapi.PathPrefix, h.api},
		{httpapi.PathOpenAPI, h.api},
		{agentlink.ReceiverPath, h.revoked},
		{sweeper.RelayPath, h.relay},
		{sweeper.ReclaimRelayPath, h.reclaim},
		{deflink.ResolvePath, h.definitions},
		{deflink.WatchPath, h.definitions},
	}
}

// routes serves routeTable; a nil handler is not routed.
func routes(h routeHandlers) *http.ServeMux {
	mux := http.NewServeMux()
	for _, r := range routeTable(h) {
		if r.handler != nil {
			mux.Handle(r.path, r.handler)
		}
	}
	return mux
}

// adminRoutes is the route table of the manager's operator API listener: that API alone.
func adminRoutes(admin http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(adminapi.PathPrefix, admin)
	return mux
}

// newReceiver builds the endpoint for forwarded revocations: it accepts only messages signed
// with key (and passing opts' checks), and acts only once the store confirms that the holder
// is gone.
func newReceiver(self lease.PodRef, registry *revocation.Registry, key string, store *leasestore.Store, opts ...agentlink.ReceiverOption) http.Handler {
	return agentlink.NewReceiver(self, registry, append([]agentlink.ReceiverOption{
		agentlink.WithAgentKey(key),
		agentlink.WithReceiverLogger(ctrl.Log.WithName("receiver")),
		agentlink.WithHolderCheck(stillHeld(store))}, opts...)...)
}

// stillHeld asks the store whether a holder exists: a forwarded revocation is only acted on
// once the holder is gone.
func stillHeld(store *leasestore.Store) agentlink.HeldFunc {
	return func(ctx context.Context, token string) (bool, error) {
		_, err := store.GetHolder(ctx, token)
		if errors.Is(err, lease.ErrLost) {
			return false, nil
		}
		return err == nil, err
	}
}

// realClock is the clock of every component outside tests.
var realClock = clock.RealClock{}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
