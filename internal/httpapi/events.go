package httpapi

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
)

// events is the long-poll GET /v1/leases/{token}/events?timeout=30s: 200 with the event when
// the lease was revoked in this process (or within the hub's memory before the call), 204
// when the timeout passes first. check remains the authority: an event is a hint that
// arrives early, LEASE_LOST on the next check arrives in any case.
func (h *handler) events(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	if !leasing.ValidToken(token) {
		writeError(w, r, &lease.InvalidError{Field: "token", Detail: "is not a valid lease token"})
		return
	}
	timeout, err := parseTimeout(r.URL.Query().Get("timeout"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	ev, ok := h.hub.Wait(ctx, token)
	if !ok {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	httpjson.Write(w, http.StatusOK, ev)
}

// parseTimeout reads the long-poll timeout: a Go duration ("30s") or whole seconds ("30"),
// at most MaxEventTimeout; empty is DefaultEventTimeout.
func parseTimeout(s string) (time.Duration, error) {
	if s == "" {
		return DefaultEventTimeout, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		n, nerr := strconv.ParseInt(s, 10, 64)
		if nerr != nil || n > int64(MaxEventTimeout/time.Second) {
			return 0, &lease.InvalidError{Field: "timeout", Detail: "must be a duration such as 30s, at most " + MaxEventTimeout.String()}
		}
		d = time.Duration(n) * time.Second
	}
	if d <= 0 || d > MaxEventTimeout {
		return 0, &lease.InvalidError{Field: "timeout", Detail: "must be positive and at most " + MaxEventTimeout.String()}
	}
	return d, nil
}
