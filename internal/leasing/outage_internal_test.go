package leasing

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// TestStoreWatchOutage: a call that the deadline overtook is an outage only on evidence that
// load cannot give: a failure of the store since the round began and no answer after it, or a
// call in flight for longer than the store's timeout. A late answer, or none yet, is load
// (issue 41: 7–42 % of the answers of a loaded store were a false 503 when the rule was "no
// answer since the call was asked").
func TestStoreWatchOutage(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const timeout = time.Second
	down := errors.New("connection refused")
	type call struct {
		asked, ended int // ms after the round began
		inFlight     bool
		err          error
		callerGone   bool
	}
	// The round begins at 0, the overtaken call is asked at 200 and cut at 400, unless a case
	// says otherwise.
	for name, tc := range map[string]struct {
		calls        []call
		asked, cutAt int
		want         bool
	}{
		"no other call":                                 {},
		"answered before the call was asked":            {calls: []call{{asked: 0, ended: 100}}},
		"others late too, none answered since asked":    {calls: []call{{asked: 150, inFlight: true}, {asked: 190, inFlight: true}}},
		"busy and waiting answers":                      {calls: []call{{asked: 0, ended: 300, err: &lease.BusyError{}}, {asked: 0, ended: 310, err: &leasestore.WaitingError{Busy: &lease.BusyError{}}}}},
		"waiter gone and holder lost are answers":       {calls: []call{{asked: 0, ended: 300, err: leasestore.ErrNotWaiting}, {asked: 0, ended: 310, err: lease.ErrLost}}},
		"a failure during the round":                    {calls: []call{{asked: 0, ended: 300, err: down}}, want: true},
		"a failure before the call was asked":           {calls: []call{{asked: 0, ended: 100, err: down}}, want: true},
		"a failure before the round began":              {calls: []call{{asked: -500, ended: -100, err: down}}},
		"a failure, then an answer":                     {calls: []call{{asked: 0, ended: 250, err: down}, {asked: 200, ended: 300}}},
		"an answer, then a failure":                     {calls: []call{{asked: 0, ended: 250}, {asked: 200, ended: 300, err: down}}, want: true},
		"the caller left: its error is not the store's": {calls: []call{{asked: 0, ended: 300, err: context.Canceled, callerGone: true}}},
		"the store's own timeout":                       {calls: []call{{asked: 0, ended: 300, err: context.DeadlineExceeded}}, want: true},
		"the overtaken call older than the timeout":     {asked: 200, cutAt: 1300, want: true},
		"the overtaken call within the timeout":         {asked: 200, cutAt: 1100},
		"another call in flight beyond the timeout":     {calls: []call{{asked: -900, inFlight: true}}, want: true},
		"another call in flight within the timeout":     {calls: []call{{asked: -500, inFlight: true}}},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.asked == 0 && tc.cutAt == 0 {
				tc.asked, tc.cutAt = 200, 400
			}
			w := newStoreWatch()
			ids := make([]uint64, len(tc.calls))
			for i, c := range tc.calls {
				ids[i] = w.begin(at(c.asked))
			}
			for i, c := range tc.calls {
				if !c.inFlight {
					w.end(ids[i], at(c.ended), c.err, c.callerGone)
				}
			}
			err := w.snapshot().outage(at(0), at(tc.asked), at(tc.cutAt), timeout)
			if diff := cmp.Diff(tc.want, err != nil); diff != "" {
				t.Errorf("outage = %v (-want +got):\n%s", err, diff)
			}
		})
	}
}
