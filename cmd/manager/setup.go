package main

import (
	"net/http"
	"strings"

	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/adminapi"
)

// The pieces both binaries build are package serving's; these are the manager's own.

// adminRoutes is the route table of the manager's operator API listener: that API alone.
func adminRoutes(admin http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(adminapi.PathPrefix, admin)
	return mux
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
