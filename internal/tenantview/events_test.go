package tenantview

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// changingSource is a fake source whose changes the test sends.
type changingSource struct {
	*fakeSource
	changes chan struct{}
}

func (c changingSource) Changes(context.Context, string) (<-chan struct{}, error) {
	return c.changes, nil
}

// The event stream says "change" once for changes that come together, and is 404 for a
// source that cannot follow changes (the page then keeps its timer).
func TestEventsStreamChanges(t *testing.T) {
	if status, _ := get(t, browserlessClient(t), serve(t, newFake())+PathEvents); status != http.StatusNotFound {
		t.Errorf("events of a source without changes: %d, want 404", status)
	}

	src := changingSource{fakeSource: newFake(), changes: make(chan struct{}, 3)}
	resp, err := http.Get(serve(t, src) + PathEvents)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q, want text/event-stream", ct)
	}
	lines := make(chan string, 10)
	go func() {
		for s := bufio.NewScanner(resp.Body); s.Scan(); {
			if l := s.Text(); strings.HasPrefix(l, "event: ") {
				lines <- l
			}
		}
		close(lines)
	}()
	for range 3 { // a grant: a holder and two counters change together
		src.changes <- struct{}{}
	}
	select {
	case l := <-lines:
		if l != "event: change" {
			t.Fatalf("event %q, want change", l)
		}
	case <-time.After(5 * time.Second): // real time: the stream is another goroutine
		t.Fatal("no event in 5 s")
	}
	select {
	case l := <-lines:
		t.Errorf("a second event %q for changes that came together", l)
	case <-time.After(3 * eventsGather): // real time: a second event would come by then
	}
	close(src.changes) // the source ends (its context): so does the stream
	select {
	case _, open := <-lines:
		if open {
			t.Error("an event after the source ended")
		}
	case <-time.After(5 * time.Second): // real time: the stream is another goroutine
		t.Error("the stream did not end with its source")
	}
}
