package leaseclient_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/vancetope/lease-operator/pkg/leaseclient"
)

func TestGuardRefusesALowerFence(t *testing.T) {
	var g leaseclient.Guard
	steps := []struct {
		key   string
		fence int64
		ok    bool
	}{
		{"tex", 5, true},
		{"tex", 5, true},  // the same holder again
		{"tex", 7, true},  // its successor
		{"tex", 5, false}, // the first holder, late
		{"tex", 6, false},
		{"other", 1, true}, // keys are apart
		{"tex", 0, false},  // no fence at all
		{"tex", 8, true},
	}
	for i, s := range steps {
		err := g.Admit(s.key, s.fence)
		if (err == nil) != s.ok {
			t.Fatalf("step %d: Admit(%q, %d) = %v, want accepted %v", i, s.key, s.fence, err, s.ok)
		}
		if err != nil {
			var stale *leaseclient.StaleFenceError
			if !errors.Is(err, leaseclient.ErrStaleFence) || !errors.As(err, &stale) || stale.Key != s.key || stale.Fence != s.fence {
				t.Errorf("step %d: error %#v", i, err)
			}
		}
	}
	if h := g.Highest("tex"); h != 8 {
		t.Errorf("Highest(tex) = %d, want 8", h)
	}
	var stale *leaseclient.StaleFenceError
	if err := g.Admit("tex", 3); !errors.As(err, &stale) || stale.Highest != 8 {
		t.Errorf("refusal %v: want it to name the highest fence, 8", err)
	}
}

// TestGuardUnderConcurrentUse: admissions from many goroutines; whatever the interleaving,
// once a fence was admitted no lower one is, and the highest is the largest offered.
func TestGuardUnderConcurrentUse(t *testing.T) {
	var g leaseclient.Guard
	var mu sync.Mutex
	var admitted []int64 // in the order the guard admitted them (inside Do)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				f := int64(i*8 + w + 1)
				_ = g.Do("r", f, func() error {
					mu.Lock()
					admitted = append(admitted, f)
					mu.Unlock()
					return nil
				})
			}
		})
	}
	wg.Wait()
	for i := 1; i < len(admitted); i++ {
		if admitted[i] < admitted[i-1] {
			t.Fatalf("admitted %d after %d", admitted[i], admitted[i-1])
		}
	}
	if h := g.Highest("r"); h != 200*8 {
		t.Errorf("Highest = %d, want %d", h, 200*8)
	}
}

func TestGuardDoRunsOnlyAdmittedWork(t *testing.T) {
	var g leaseclient.Guard
	ran := 0
	work := func() error { ran++; return nil }
	if err := g.Do("r", 2, work); err != nil {
		t.Fatal(err)
	}
	if err := g.Do("r", 1, work); !errors.Is(err, leaseclient.ErrStaleFence) {
		t.Fatalf("stale Do = %v", err)
	}
	boom := errors.New("boom")
	if err := g.Do("r", 3, func() error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Do returns the work's error: %v", err)
	}
	if ran != 1 {
		t.Errorf("work ran %d times, want once", ran)
	}
}
