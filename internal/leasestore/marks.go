package leasestore

import (
	"context"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/vancetope/lease-operator/internal/lease"
)

// A released holder (releaseHolder) has done its work once its entries are given back; deleting its document is no
// part of the answer. So each store deletes them off the callers' path, on one goroutine, in
// batches: while one delete is in flight the holders released meanwhile gather for the next.
// The deletes cost well under one round trip per release under load. A released holder whose
// delete never comes (a crash, a failed batch) is an ordinary expired one: the sweep does its
// give-back again after the operation timeout (and markMargin), which finds nothing left,
// and deletes it.
type markDropper struct {
	mu      sync.Mutex
	pending []string
	once    sync.Once
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

// Bounds of the dropper: the marks one delete names, and the marks one process keeps waiting
// (beyond it, a release deletes its own mark).
const (
	marksPerDelete  = 256
	marksMaxPending = 4096
)

// markGather is how long the dropper waits after a release before it deletes, so that the
// releases of that time share the delete.
const markGather = 100 * time.Millisecond

// offPath marks the context of a command no caller waits for (WithBackgroundObserver).
type offPath struct{}

func (s *Store) startMarkDropper() {
	d := &markDropper{kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	s.marks = d
	go func() {
		defer close(d.done)
		for {
			select {
			case <-d.stop:
				s.dropMarks() // what is queued still goes, so a closing store leaves no marks
				return
			case <-d.kick:
			}
			// Let the releases of the next moments join this delete: one command for many
			// under load, and no caller waits for it.
			select {
			case <-d.stop:
			case <-time.After(markGather):
			}
			s.dropMarks()
		}
	}()
}

func (s *Store) stopMarkDropper() {
	s.marks.once.Do(func() { close(s.marks.stop) })
	<-s.marks.done
}

// dropMark queues the delete of the release mark of token; false when the queue is full and
// the caller must delete it itself.
func (s *Store) dropMark(token string) bool {
	d := s.marks
	d.mu.Lock()
	if len(d.pending) >= marksMaxPending {
		d.mu.Unlock()
		return false
	}
	d.pending = append(d.pending, token)
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
	return true
}

// dropMarks deletes the queued marks. A failed batch is left to the sweep.
func (s *Store) dropMarks() {
	d := s.marks
	d.mu.Lock()
	ids := d.pending
	d.pending = nil
	d.mu.Unlock()
	for len(ids) > 0 {
		n := min(len(ids), marksPerDelete)
		ctx, cancel := s.bound(context.WithValue(context.Background(), offPath{}, true))
		_, err := s.holders.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids[:n]}}}, {Key: "state", Value: stateReleased}})
		cancel()
		if err != nil {
			return // the store is away: the rest is the sweep's too (and a Close is not held up)
		}
		ids = ids[n:]
	}
}

// deleteMark deletes the release mark of token on the caller's path.
func (s *Store) deleteMark(ctx context.Context, token string) error {
	if _, err := s.holders.DeleteOne(ctx, bson.D{{Key: "_id", Value: token}, {Key: "state", Value: stateReleased}}); err != nil {
		return unavailable("deleting released holder "+lease.HolderID(token), err)
	}
	return nil
}
