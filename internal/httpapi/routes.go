package httpapi

import (
	"net/http"

	"github.com/vancetope/lease-operator/api/openapi"
)

// Paths of the admission API. The OpenAPI document (api/openapi/lease-api.yaml) describes
// each; its conformance test checks the route table against it.
const (
	PathLeases  = "/v1/leases"
	PathLease   = "/v1/leases/{token}"
	PathCheck   = PathLease + "/check"
	PathPayload = PathLease + "/payload"
	PathEvents  = PathLease + "/events"
	PathOpenAPI = "/openapi.json"
)

// Route is one method and path of the API.
type Route struct {
	Method, Path string
}

type route struct {
	Route
	serve http.HandlerFunc
}

// table is the route table. The events route is served only with a hub (WithEvents).
func (h *handler) table() []route {
	return []route{
		{Route{http.MethodPost, PathLeases}, h.acquire},
		{Route{http.MethodPost, PathCheck}, h.check},
		{Route{http.MethodPut, PathPayload}, h.updatePayload},
		{Route{http.MethodDelete, PathLease}, h.release},
		{Route{http.MethodGet, PathEvents}, h.events},
		{Route{http.MethodGet, PathOpenAPI}, h.openAPI},
	}
}

// Routes returns every route the API may serve (the events route only WithEvents).
func Routes() []Route {
	var out []Route
	for _, r := range (&handler{}).table() {
		out = append(out, r.Route)
	}
	return out
}

// openAPI serves the OpenAPI document as JSON, so that clients in any language can be
// generated from the server they talk to.
func (h *handler) openAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openapi.JSON())
}
