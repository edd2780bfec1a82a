package publisher_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/publisher"
	"github.com/musterhq/muster/internal/testclock"
)

// fakeOverrides stands in for policy.InForce: loaded or not, and a
// revision with the services changed at each.
type fakeOverrides struct {
	mu      sync.Mutex
	loaded  bool
	rev     uint64
	changed map[string]uint64
	c       chan struct{}
}

func (f *fakeOverrides) Loaded() bool             { f.mu.Lock(); defer f.mu.Unlock(); return f.loaded }
func (f *fakeOverrides) Changed() <-chan struct{} { return f.c }
func (f *fakeOverrides) ServicesChangedSince(rev uint64) ([]string, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for s, at := range f.changed {
		if at > rev {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out, f.rev
}
func (f *fakeOverrides) change(services ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loaded = true
	f.rev++
	for _, s := range services {
		f.changed[s] = f.rev
	}
}

// TestNothingAssembledBeforeTheOverridesAreLoaded: until the overrides in
// force have been read once, the publisher assembles nothing (a view
// without them could put an overridden-out instance back in rotation, or
// drop one an operator forced in); once they are, the services waiting
// are assembled. A later change of a service's overrides assembles that
// service again without the evaluator saying anything; a change for a
// service never assembled does not conjure it.
func TestNothingAssembledBeforeTheOverridesAreLoaded(t *testing.T) {
	pool := dbtest.New(t)
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	in := &input{}
	in.set("web", endpoints(4, eligibility.Eligible))
	ov := &fakeOverrides{changed: map[string]uint64{}, c: make(chan struct{}, 1)}
	snapshots := 0
	r := newRig(t, pool, clk, in, func(c *publisher.Config) {
		c.Overrides = ov
		inner := c.Snapshot
		c.Snapshot = func(s string) (assembler.ServiceInput, bool) {
			snapshots++
			return inner(s)
		}
	})
	if err := r.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.ServicesChanged([]string{"web"})
	r.RunOnce()
	clk.Advance(2 * time.Second)
	r.RunOnce()
	if _, ok := r.View("web"); ok || snapshots != 0 {
		t.Fatalf("assembled before the overrides were loaded: view present %v, %d snapshots read", ok, snapshots)
	}

	ov.change() // the first load: nothing in force
	v := r.publish(t, "web")
	if len(v.Endpoints) != 4 {
		t.Fatalf("after the load: %d endpoints", len(v.Endpoints))
	}
	before := snapshots

	ov.change("web", "ghost")
	r.RunOnce()
	if snapshots != before+1 {
		t.Fatalf("an override change of web read %d snapshots, want 1 (web only: ghost was never assembled)", snapshots-before)
	}
	if _, ok := r.View("ghost"); ok {
		t.Fatal("an override change conjured a view of a service never assembled")
	}
}
