package tenantview

import (
	"context"
	"net/http"
	"time"
)

// Pacing of the event stream.
const (
	// eventsGather is how long the stream gathers changes into one event: a grant changes a
	// holder and several counters at once, and the page reloads its content once for them.
	eventsGather = 200 * time.Millisecond
	// eventsHeartbeat keeps the connection open through proxies while nothing changes.
	eventsHeartbeat = 25 * time.Second
)

// events streams server-sent events to the page: "change" when the namespace's holders,
// waiters or counters changed (the live API's watches, as the user), after which the page
// fetches its content again. Without a source that follows changes it is 404, and the page
// keeps its Refresh link and timer.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	src, ok := s.src.(Changes)
	flusher, canFlush := w.(http.Flusher)
	if !ok || !canFlush {
		http.NotFound(w, r)
		return
	}
	changes, err := src.Changes(r.Context(), s.namespace)
	if err != nil {
		s.apiError(w, r, "watching the namespace", err)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	write := func(msg string) bool {
		if _, err := w.Write([]byte(msg)); err != nil {
			return false
		}
		flusher.Flush()
		return true
	}
	if !write(": following the live API\n\n") {
		return
	}
	heartbeat := time.NewTicker(eventsHeartbeat)
	defer heartbeat.Stop()
	for {
		select {
		case _, open := <-changes:
			if !open {
				return
			}
			gather(r.Context(), changes)
			if !write("event: change\ndata: {}\n\n") {
				return
			}
		case <-heartbeat.C:
			if !write(": still here\n\n") {
				return
			}
		case <-r.Context().Done():
			return
		}
	}
}

// gather lets the changes of eventsGather pass into the one event about to be sent.
func gather(ctx context.Context, changes <-chan struct{}) {
	t := time.NewTimer(eventsGather)
	defer t.Stop()
	for {
		select {
		case _, open := <-changes:
			if !open {
				return
			}
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}
