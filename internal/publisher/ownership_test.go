package publisher_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/publisher"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/testclock"
)

// owner is a settable answer to Owns.
type owner struct {
	mu  sync.Mutex
	own map[string]bool
}

func (o *owner) set(service string, own bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.own == nil {
		o.own = map[string]bool{}
	}
	o.own[service] = own
}

func (o *owner) owns(service string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.own[service]
}

// relay hands every update from one hub to another, as the replicas'
// relay does.
func relay(from, to *stream.Hub) func() {
	tap := from.Tap(0)
	return func() {
		us, _ := tap.Take()
		to.Relay(us)
	}
}

// TestPublicationFollowsOwnership: replica A owns web and publishes it;
// B, which does not, publishes nothing of it but holds A's views
// (relayed). A loses web and publishes nothing more of it, even with a
// change queued; B gains it, adopts (a fresh epoch, the view restored
// from its hub, newer than the one saved) and its first version is a
// rebased delta from exactly what A last published, above every version
// A issued. A subscriber on B sees no regression and no gap.
func TestPublicationFollowsOwnership(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	in := &input{}
	eps := endpoints(4, eligibility.Eligible)
	in.set("web", eps)
	var oa, ob owner
	oa.set("web", true)
	a := newRig(t, pool, clk, in, func(c *publisher.Config) {
		c.Owns, c.Services = oa.owns, func() []string { return []string{"web"} }
	})
	b := newRig(t, pool, clk, in, func(c *publisher.Config) {
		c.Owns, c.Services = ob.owns, func() []string { return []string{"web"} }
	})
	for _, r := range []*rig{a, b} {
		if err := r.Prepare(ctx); err != nil {
			t.Fatal(err)
		}
	}
	toB := relay(a.hub, b.hub)
	first := a.publish(t, "web")
	if _, ok := b.View("web"); ok {
		t.Fatal("B, not the owner, assembled web")
	}
	b.ServicesChanged([]string{"web"})
	b.RunOnce()
	if _, ok := b.hub.View("web"); ok {
		t.Fatal("B, not the owner, published web")
	}
	toB()
	sub, err := b.hub.Subscribe([]string{"web"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if len(sub.Initial) != 2 || sub.Initial[0].Version != first.Version {
		t.Fatalf("B's subscriber started with %d frames", len(sub.Initial))
	}
	// A saves nothing more, then publishes a withdrawal that reaches B's
	// hub but not the database.
	if err := a.SaveOnce(ctx); err != nil {
		t.Fatal(err)
	}
	eps[0].State, eps[0].Weight = eligibility.Ineligible, 0
	in.set("web", eps)
	second := a.publish(t, "web")
	toB()
	if f := <-sub.C(); f.Kind != stream.KindDelta || f.Version != second.Version {
		t.Fatalf("B relayed %s@%d", f.Kind, f.Version)
	}

	// A loses web with an addition queued: nothing of it is published.
	eps = append(eps, endpoints(5, eligibility.Eligible)[4])
	in.set("web", eps)
	a.ServicesChanged([]string{"web"})
	a.RunOnce()
	oa.set("web", false)
	a.OwnershipChanged(nil, []int{0})
	clk.Advance(2 * time.Second)
	a.RunOnce()
	if f, _ := a.hub.View("web"); f.Version != second.Version {
		t.Fatalf("A published web at %d after losing it", f.Version)
	}
	if _, ok := a.View("web"); ok {
		t.Fatal("A still holds web after losing it")
	}

	// B gains web. Until it has adopted, web waits.
	ob.set("web", true)
	b.OwnershipChanged([]int{0}, nil)
	b.RunOnce()
	if f, _ := b.hub.View("web"); f.Version != second.Version {
		t.Fatalf("B published web at %d before adopting it", f.Version)
	}
	if err := b.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	b.RunOnce()
	clk.Advance(2 * time.Second)
	b.RunOnce()
	f := <-sub.C()
	if f.Kind != stream.KindDelta || f.FromVersion != second.Version || f.Version <= second.Version {
		t.Fatalf("B's first publication: %s %d->%d, want a delta from %d", f.Kind, f.FromVersion, f.Version, second.Version)
	}
	got, _ := b.View("web")
	if got.Version>>31 <= second.Version>>31 {
		t.Fatalf("B publishes under epoch %d, not above A's %d", got.Version>>31, second.Version>>31)
	}
	routable := 0
	for _, e := range got.Endpoints {
		if e.State != eligibility.Ineligible.String() {
			routable++
		}
	}
	if routable != 4 {
		t.Fatalf("B's view routes to %d endpoints, want 4 (one withdrawn, one added)", routable)
	}
	// A client that held a version B never saw gets the full view from B.
	late, err := b.hub.Subscribe([]string{"web"}, second.Version+1)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if late.Initial[0].Kind != stream.KindView {
		t.Fatalf("a client above the rebased base got a %s", late.Initial[0].Kind)
	}
}

// TestNothingPublishedWhileTheEvaluatorRebuilds (issue 27): a replica
// restarted with its views restored (saved, or relayed into its hub)
// marks every service it owns for assembly, but while its evaluator is
// still rebuilding, Snapshot answers false for each. That must not be
// taken for services that no longer exist: nothing is published (before
// the fix, an emptied view of every service went out under the new
// epoch, and the relay carried it to every replica's subscribers). Once
// the evaluator is ready, the first version is a rebased delta from the
// restored view, with every endpoint.
func TestNothingPublishedWhileTheEvaluatorRebuilds(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	in := &input{}
	in.set("web", endpoints(4, eligibility.Eligible))
	services := func() []string { return []string{"web"} }
	owns := func(string) bool { return true }
	a := newRig(t, pool, clk, in, func(c *publisher.Config) { c.Owns, c.Services = owns, services })
	if err := a.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	last := a.publish(t, "web")
	if err := a.SaveOnce(ctx); err != nil {
		t.Fatal(err)
	}

	// The restarted process: its evaluator knows nothing yet.
	var ready atomic.Bool
	rebuilding := &input{}
	snapshot := func(s string) (assembler.ServiceInput, bool) {
		if !ready.Load() {
			return rebuilding.snapshot(s)
		}
		return in.snapshot(s)
	}
	b := newRig(t, pool, clk, in, func(c *publisher.Config) {
		c.Owns, c.Services, c.Snapshot, c.Ready = owns, services, snapshot, ready.Load
	})
	sub, err := b.hub.Subscribe([]string{"web"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := b.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		b.RunOnce()
		clk.Advance(1100 * time.Millisecond)
	}
	if v, ok := b.hub.View("web"); ok {
		t.Fatalf("published v%d while the evaluator rebuilds: %s", v.Version, v.JSON)
	}
	ready.Store(true)
	b.RunOnce()
	clk.Advance(1100 * time.Millisecond)
	b.RunOnce()
	v, ok := b.View("web")
	if !ok || len(v.Endpoints) != 4 || v.Version <= last.Version {
		t.Fatalf("after the rebuild: %+v (ok %v), want 4 endpoints above v%d", v, ok, last.Version)
	}
	var f *stream.Frame
	select {
	case f = <-sub.C():
	default:
		t.Fatal("the subscriber got nothing after the rebuild")
	}
	if f.Kind != stream.KindView || f.Version != v.Version {
		t.Fatalf("the subscriber got %s@%d, want the view %d", f.Kind, f.Version, v.Version)
	}
}
