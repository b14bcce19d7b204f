package serving

import (
	"net/http"

	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/deflink"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/sweeper"
)

// Handlers are the HTTP handlers a process serves; a nil handler is not routed.
type Handlers struct {
	// API is the admission API (acquire, check, payload, release, events).
	API http.Handler
	// Revoked receives revocations forwarded by the reaper of another pod.
	Revoked http.Handler
	// Relay runs an agent's lazy idle sweep on the manager.
	Relay http.Handler
	// Reclaim runs an agent waiter's borrowing reclaim on the manager.
	Reclaim http.Handler
	// Definitions answers the agents' definitions and tenancy (deflink).
	Definitions http.Handler
}

// Route is one entry of the route table.
type Route struct {
	Path    string
	Handler http.Handler
}

// RouteTable is the route table of the admission servers of both binaries, built from the
// packages' exported path constants. The operator API is not among them: it has a listener
// of its own, so the admission port answers 404 for it.
func RouteTable(h Handlers) []Route {
	return []Route{
		{httpapi.PathPrefix, h.API},
		{httpapi.PathOpenAPI, h.API},
		{agentlink.ReceiverPath, h.Revoked},
		{sweeper.RelayPath, h.Relay},
		{sweeper.ReclaimRelayPath, h.Reclaim},
		{deflink.ResolvePath, h.Definitions},
		{deflink.WatchPath, h.Definitions},
	}
}

// Routes serves RouteTable; a nil handler is not routed.
func Routes(h Handlers) *http.ServeMux {
	mux := http.NewServeMux()
	for _, r := range RouteTable(h) {
		if r.Handler != nil {
			mux.Handle(r.Path, r.Handler)
		}
	}
	return mux
}
