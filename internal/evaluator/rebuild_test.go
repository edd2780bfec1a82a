package evaluator_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/uuid"

	st "github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/registry"
)

// restart stops prev's evaluator and returns a second stack on the same
// database whose evaluator has rebuilt its state, on clock (the first
// stack's: its registry writes on it).
func restart(t *testing.T, prev *fixture, clock *st.Clock) *fixture {
	t.Helper()
	prev.Evaluator.Stop()
	next := st.New(t, st.Options{Pool: prev.Pool, Evaluator: func(c *evaluator.Config) { c.Now = clock.Now }})
	g := &fixture{Stack: next, web: prev.web, api: prev.api}
	g.waitReady(t)
	return g
}

// registerEnded registers n instances of service and deregisters them
// through muster (sealed ends), at the clock's time.
func (f *fixture) registerEnded(t *testing.T, service, prefix string, n int) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	var out []uuid.UUID
	for i := range n {
		in, err := f.Registry.Register(ctx, admin, netip.Addr{}, service, registry.Registration{Address: fmt.Sprintf("%s.%d", prefix, i+1), Port: 8080, Zone: "az1"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Registry.Deregister(ctx, admin, in.ID); err != nil {
			t.Fatal(err)
		}
		out = append(out, in.ID)
	}
	return out
}

// TestRebuildReadsWhatIsLiveAndRecent (issue 26): the rebuild reads the
// live instances and those ended within ExpiredHorizon, not the rows that
// ended before it (ids are never reused: they pile up with every deploy).
// A row that reads ended with no end time (never muster's: every end it
// writes is stamped) is read, and stays in rotation as an end muster did
// not write.
func TestRebuildReadsWhatIsLiveAndRecent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, st.Options{}) // web: 3 live, api: 1 live
	old := f.registerEnded(t, "web", "10.0.8", 3)
	f.Clock.Advance(evaluator.ExpiredHorizon + time.Hour)
	recent := f.registerEnded(t, "web", "10.0.9", 1)
	if _, err := f.Pool.Exec(ctx, `UPDATE instances SET state = 'deregistered', ended_at = NULL, updated_at = $2 WHERE id = $1`,
		f.api[0], f.Clock.Now()); err != nil {
		t.Fatal(err)
	}

	g := restart(t, f, f.Clock)
	// web's 3 live, api's ended by hand, the one ended within the horizon.
	if got, want := g.Evaluator.Stats().InstanceRowsRead, 5; got != want {
		t.Errorf("the rebuild read %d instance rows, want %d (live, untimed end, ended within the horizon; not the %d ended %s ago)",
			got, want, len(old), evaluator.ExpiredHorizon+time.Hour)
	}
	if s := g.Evaluator.Stats(); s.Instances != 4 {
		t.Errorf("the rebuilt evaluator holds %d instances, want web's 3 and api's ended by hand", s.Instances)
	}
	snap, ok := g.Evaluator.Snapshot("api")
	if !ok || len(snap.Instances) != 1 || snap.Instances[0].ID.String() != f.api[0] {
		t.Errorf("api after the rebuild: %+v, want its instance ended by hand kept in rotation", snap.Instances)
	}
	if n := g.Evaluator.UnsealedInstances(); n != 1 {
		t.Errorf("%d unsealed instances, want the one ended by hand", n)
	}
	web, _ := g.Evaluator.Snapshot("web")
	for _, in := range web.Instances {
		if in.ID == recent[0] || in.ID == old[0] {
			t.Errorf("an instance muster deregistered is listed after the rebuild: %+v", in)
		}
	}
}

// TestRefreshAfterTheRebuildMissesNothing: an instance ended with a stamp
// from just before the rebuild began, committed after the rebuild read
// it, is retired by the first refresh after it, however late (the cursor
// the rebuild leaves starts refreshOverlap before it began).
func TestRefreshAfterTheRebuildMissesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, st.Options{})
	g := restart(t, f, f.Clock)
	began := f.Clock.Now()
	// The first stack's registry writes on the shared clock: stamped 5 s
	// before the rebuild began, committed after it.
	f.Clock.Set(began.Add(-5 * time.Second))
	if _, err := f.Registry.Deregister(ctx, admin, uuid.MustParse(f.web[0])); err != nil {
		t.Fatal(err)
	}
	// Later than refreshOverlap after it began (a rebuild at region scale
	// takes longer), so the refresh reads from the cursor the rebuild
	// left, not from now minus the overlap.
	f.Clock.Set(began.Add(30 * time.Second))
	if err := g.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	snap, _ := g.Evaluator.Snapshot("web")
	for _, in := range snap.Instances {
		if in.ID.String() == f.web[0] {
			t.Fatalf("the instance ended (stamped before the rebuild began) is still listed after a refresh: %+v", in)
		}
	}
	if len(snap.Instances) != 2 {
		t.Fatalf("web after the refresh: %+v", snap.Instances)
	}
}

// TestExpiredInstancesHoldTheGuardAcrossARestart: cart's two instances
// in az1 whose leases expired (the zone keeps 1 of 3, below 0.5) are
// still kept for the guard by an evaluator rebuilt within ExpiredHorizon,
// and not by one rebuilt after it.
func TestExpiredInstancesHoldTheGuardAcrossARestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, st.Options{})
	if _, _, err := f.Registry.PutService(ctx, admin, "cart", registry.ServiceSpec{Owner: "payments", Capabilities: []registry.Capability{registry.CapPassive}}); err != nil {
		t.Fatal(err)
	}
	var cart []uuid.UUID
	for i := range 3 {
		in, err := f.Registry.Register(ctx, admin, netip.Addr{}, "cart", registry.Registration{Address: fmt.Sprintf("10.0.2.%d", i+1), Port: 8080, Zone: "az1"})
		if err != nil {
			t.Fatal(err)
		}
		cart = append(cart, in.ID)
	}
	if err := f.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	rp, err := registry.NewReaper(registry.ReaperConfig{Registry: f.Registry, RegionThreshold: 1, ServiceThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.Clock.Advance(35 * time.Second)
	keep := []uuid.UUID{cart[2], uuid.MustParse(f.api[0])}
	for _, id := range f.web {
		keep = append(keep, uuid.MustParse(id))
	}
	for _, id := range keep {
		if _, err := f.Registry.Renew(ctx, admin, id); err != nil {
			t.Fatal(err)
		}
	}
	f.Clock.Advance(10 * time.Second)
	if n, err := rp.RunOnce(ctx); err != nil || n != 2 {
		t.Fatalf("expired %d, %v; want cart's first two", n, err)
	}
	expired := func(ev *evaluator.Evaluator) map[uuid.UUID]bool {
		t.Helper()
		snap, ok := ev.Snapshot("cart")
		if !ok {
			t.Fatal("no snapshot of cart")
		}
		out := map[uuid.UUID]bool{}
		for _, ep := range snap.Instances {
			if ep.LeaseExpired {
				out[ep.ID] = true
			}
		}
		return out
	}

	f.Clock.Advance(10 * time.Minute)
	g := restart(t, f, f.Clock)
	if got := expired(g.Evaluator); len(got) != 2 || !got[cart[0]] || !got[cart[1]] {
		t.Fatalf("rebuilt within the horizon: lease-expired instances listed %v, want cart's first two (the guard needs them)", got)
	}
	f.Clock.Advance(evaluator.ExpiredHorizon)
	h := restart(t, g, f.Clock)
	if got := expired(h.Evaluator); len(got) != 0 {
		t.Fatalf("rebuilt past the horizon: lease-expired instances listed %v, want none", got)
	}
}
