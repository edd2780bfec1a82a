package resolver_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/resolver"
)

// withRegistered sets Zone.Registered from counts, adding zones counts
// names that v lacks (a zone whose instances are all registered but none
// routable yet).
func withRegistered(v resolver.View, counts map[string]int) resolver.View {
	for name, n := range counts {
		z, ok := v.Zones[name]
		if !ok {
			z = resolver.Zone{Guard: resolver.GuardOK, MinHealthyFraction: 0.5}
		}
		z.Registered = &n
		v.Zones[name] = z
	}
	return v
}

// eventLog collects a Cache's events; the hook may run on any goroutine.
type eventLog struct {
	mu sync.Mutex
	ev []resolver.Event
}

func (l *eventLog) hook(e resolver.Event) {
	l.mu.Lock()
	l.ev = append(l.ev, e)
	l.mu.Unlock()
}

// count returns how many events wrap target.
func (l *eventLog) count(target error) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.ev {
		if errors.Is(e.Err, target) {
			n++
		}
	}
	return n
}

type holdFixture struct {
	c   *resolver.Cache
	clk *fakeClock
	dir string
	log *eventLog
}

func newHoldFixture(t *testing.T, opts ...resolver.Option) holdFixture {
	t.Helper()
	f := holdFixture{clk: newFakeClock(t0), dir: t.TempDir(), log: &eventLog{}}
	opts = append([]resolver.Option{resolver.WithClock(f.clk.Now), resolver.WithDir(f.dir), resolver.WithEventHook(f.log.hook)}, opts...)
	c, err := resolver.NewCache([]string{"api"}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	f.c = c
	return f
}

// routes checks the version and routable count routing uses, and that
// Pick only returns endpoints of that version.
func routes(t *testing.T, c *resolver.Cache, version uint64, routable int) resolver.Result {
	t.Helper()
	r := mustResolve(t, c, "api")
	if r.Version() != version || r.Routable() != routable {
		t.Fatalf("routing v%d with %d routable, want v%d with %d (hold %+v)", r.Version(), r.Routable(), version, routable, r.Hold)
	}
	in := map[string]bool{}
	for _, e := range r.Endpoints() {
		in[e.InstanceID] = true
	}
	for range 200 {
		e, err := c.Pick("api")
		if routable == 0 {
			if !errors.Is(err, resolver.ErrNoEndpoints) {
				t.Fatalf("Pick on an empty set = %+v, %v; want ErrNoEndpoints", e, err)
			}
			return r
		}
		if err != nil || !in[e.InstanceID] {
			t.Fatalf("Pick = %s, %v; not an endpoint of v%d", e.InstanceID, err, version)
		}
	}
	return r
}

// A scale-down from 10 to 4 that the registry's counts do not explain
// (a server from before issue 12 sends none) is held for the confirm
// time, visibly, then followed on a Sweep with nothing new from the
// server, and the last-known-good file then holds the 4-set a restarted
// process starts from.
func TestHoldFollowedAfterConfirmTime(t *testing.T) {
	f := newHoldFixture(t)
	v1 := view("api", 1, 10)
	if err := f.c.ApplyView(v1); err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(5 * time.Second)
	since := f.clk.Now()
	v2 := viewOf("api", 2, v1.Endpoints[:4])
	if err := f.c.ApplyView(v2); !errors.Is(err, resolver.ErrShrinkCapped) {
		t.Fatalf("10 -> 4 = %v, want ErrShrinkCapped", err)
	}
	r := routes(t, f.c, 1, 10)
	want := resolver.Hold{
		Reason: resolver.ErrShrinkCapped, Since: since, FollowAt: since.Add(resolver.DefaultConfirmAfter),
		HeldVersion: 1, HeldRoutable: 10, NewestVersion: 2, NewestRoutable: 4,
	}
	if r.Hold == nil || *r.Hold != want || !r.Guarded() || r.Held != 2 {
		t.Fatalf("Result.Hold = %+v (guarded %v, held v%d), want %+v", r.Hold, r.Guarded(), r.Held, want)
	}
	if st := f.c.Stats(); st.Holding != 1 || st.ShrinkCapped != 1 {
		t.Fatalf("stats while holding: %+v", st)
	}
	if got, err := resolver.LoadView(f.dir, "api"); err != nil || got.Version != 1 {
		t.Fatalf("file while holding: v%d, %v; want v1", got.Version, err)
	}

	f.clk.Advance(resolver.DefaultConfirmAfter - time.Nanosecond)
	f.c.Sweep()
	routes(t, f.c, 1, 10)
	f.clk.Advance(time.Nanosecond)
	f.c.Sweep()
	if r := routes(t, f.c, 2, 4); r.Hold != nil || r.Guarded() {
		t.Fatalf("after the confirm time: hold %+v, guarded %v", r.Hold, r.Guarded())
	}
	if st := f.c.Stats(); st.Holding != 0 || st.HoldsFollowed != 1 || st.Applied != 2 {
		t.Fatalf("stats after following: %+v", st)
	}
	if n := f.log.count(resolver.ErrHoldFollowed); n != 1 {
		t.Fatalf("%d ErrHoldFollowed events, want 1", n)
	}
	got, err := resolver.LoadView(f.dir, "api")
	if err != nil || got.Version != 2 || len(got.Endpoints) != 4 {
		t.Fatalf("file after following: v%d with %d endpoints, %v; want v2 with 4", got.Version, len(got.Endpoints), err)
	}

	// A restarted process starts from what this one routed on.
	restarted, err := resolver.NewCache([]string{"api"}, resolver.WithDir(f.dir), resolver.WithClock(f.clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	routes(t, restarted, 2, 4)
}

// An update that arrives after the confirm time and is still a shrink
// is followed at once; so is the hold with a custom confirm time.
func TestHoldFollowedOnNextUpdate(t *testing.T) {
	f := newHoldFixture(t, resolver.WithConfirmAfter(10*time.Second))
	v1 := view("api", 1, 10)
	if err := f.c.ApplyView(v1); err != nil {
		t.Fatal(err)
	}
	v2 := viewOf("api", 2, v1.Endpoints[:4])
	if err := f.c.ApplyDelta(deltaTo(v1, v2)); !errors.Is(err, resolver.ErrShrinkCapped) {
		t.Fatalf("10 -> 4 = %v, want ErrShrinkCapped", err)
	}
	if r := mustResolve(t, f.c, "api"); r.Hold == nil || !r.Hold.FollowAt.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("hold %+v, want it followed at t0+10s", r.Hold)
	}
	f.clk.Advance(10 * time.Second)
	v3 := viewOf("api", 3, v1.Endpoints[:3])
	if err := f.c.ApplyDelta(deltaTo(v2, v3)); err != nil {
		t.Fatalf("a shrink after the confirm time = %v, want it followed", err)
	}
	if r := routes(t, f.c, 3, 3); r.Hold != nil {
		t.Fatalf("hold %+v after following", r.Hold)
	}
	if st := f.c.Stats(); st.HoldsFollowed != 1 || st.ShrinkCapped != 1 {
		t.Fatalf("stats %+v: the followed update is not a second refusal", st)
	}
	if got, err := resolver.LoadView(f.dir, "api"); err != nil || got.Version != 3 {
		t.Fatalf("file: v%d, %v; want v3", got.Version, err)
	}
}

// A shrink the registry's counts explain is intended: a scale-down is
// followed at once, in full views and deltas, zones removed included. A
// shrink they do not fully explain, or that a server does not give
// counts for, is held.
func TestRegistryExplainedShrinkFollowedAtOnce(t *testing.T) {
	ten := view("api", 1, 10) // zones a and b, 5 each
	for name, tc := range map[string]struct {
		from, to resolver.View
		delta    bool
		want     error
		routable int
	}{
		"10 -> 4, registered 10 -> 4": {
			from:     withRegistered(view("api", 1, 10), map[string]int{"a": 5, "b": 5}),
			to:       withRegistered(viewOf("api", 2, ten.Endpoints[:4]), map[string]int{"a": 2, "b": 2}),
			routable: 4,
		},
		"10 -> 4 by a delta": {
			from:     withRegistered(view("api", 1, 10), map[string]int{"a": 5, "b": 5}),
			to:       withRegistered(viewOf("api", 2, ten.Endpoints[:4]), map[string]int{"a": 2, "b": 2}),
			delta:    true,
			routable: 4,
		},
		"zone b gone and a down to 1": {
			from:     withRegistered(view("api", 1, 10), map[string]int{"a": 5, "b": 5}),
			to:       withRegistered(viewOf("api", 2, ten.Endpoints[:1]), map[string]int{"a": 1}),
			delta:    true, // removed_zones: [b]
			routable: 1,
		},
		"registered, not yet routable, stay counted": {
			from:     withRegistered(view("api", 1, 10), map[string]int{"a": 6, "b": 5}),
			to:       withRegistered(viewOf("api", 2, ten.Endpoints[:4]), map[string]int{"a": 3, "b": 2}),
			routable: 4, // 6 removed, 10-4-6 = 0 unexplained
		},
		"only 2 of the 8 lost explained": {
			from:     withRegistered(view("api", 1, 10), map[string]int{"a": 5, "b": 5}),
			to:       withRegistered(viewOf("api", 2, ten.Endpoints[:2]), map[string]int{"a": 4, "b": 4}),
			want:     resolver.ErrShrinkCapped,
			routable: 10,
		},
		"new view without counts": {
			from:     withRegistered(view("api", 1, 10), map[string]int{"a": 5, "b": 5}),
			to:       viewOf("api", 2, ten.Endpoints[:4]),
			want:     resolver.ErrShrinkCapped,
			routable: 10,
		},
		"old view without counts": {
			from:     view("api", 1, 10),
			to:       withRegistered(viewOf("api", 2, ten.Endpoints[:4]), map[string]int{"a": 2, "b": 2}),
			want:     resolver.ErrShrinkCapped,
			routable: 10,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newHoldFixture(t)
			if err := f.c.ApplyView(tc.from); err != nil {
				t.Fatal(err)
			}
			var err error
			if tc.delta {
				err = f.c.ApplyDelta(deltaTo(tc.from, tc.to))
			} else {
				err = f.c.ApplyView(tc.to)
			}
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("apply = %v, want %v", err, tc.want)
			}
			wantVersion, wantHold, wantExplained := uint64(2), false, uint64(1)
			if tc.want != nil {
				wantVersion, wantHold, wantExplained = 1, true, 0
			}
			r := routes(t, f.c, wantVersion, tc.routable)
			if (r.Hold != nil) != wantHold {
				t.Fatalf("hold %+v, want held %v", r.Hold, wantHold)
			}
			if st := f.c.Stats(); st.RegistryShrinks != wantExplained {
				t.Fatalf("RegistryShrinks %d, want %d", st.RegistryShrinks, wantExplained)
			}
		})
	}
}

// A decommission (every zone gone, or nothing registered) empties routing
// at once; an empty view the registry does not account for is held.
func TestDecommissionFollowedAtOnce(t *testing.T) {
	ten := view("api", 1, 10)
	for name, tc := range map[string]struct {
		from, to resolver.View
		want     error
	}{
		"no zones left": {from: view("api", 1, 10), to: viewOf("api", 2, nil)},
		"every zone at 0 registered": {
			from: view("api", 1, 10),
			to:   withRegistered(viewOf("api", 2, nil), map[string]int{"a": 0, "b": 0}),
		},
		"registry removed every routable instance": {
			// 2 registered instances await readiness in zone a.
			from: withRegistered(view("api", 1, 10), map[string]int{"a": 7, "b": 5}),
			to:   withRegistered(viewOf("api", 2, nil), map[string]int{"a": 2}),
		},
		"every endpoint withdrawn, counts unknown": {
			from: view("api", 1, 10),
			to:   func() resolver.View { v := viewOf("api", 2, nil); v.Zones = ten.Zones; return v }(),
			want: resolver.ErrWouldEmpty,
		},
		"every endpoint withdrawn, still registered": {
			from: withRegistered(view("api", 1, 10), map[string]int{"a": 5, "b": 5}),
			to:   withRegistered(viewOf("api", 2, nil), map[string]int{"a": 5, "b": 5}),
			want: resolver.ErrWouldEmpty,
		},
		"registry removed only some": {
			from: withRegistered(view("api", 1, 10), map[string]int{"a": 5, "b": 5}),
			to:   withRegistered(viewOf("api", 2, nil), map[string]int{"a": 2, "b": 2}),
			want: resolver.ErrWouldEmpty,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newHoldFixture(t)
			if err := f.c.ApplyView(tc.from); err != nil {
				t.Fatal(err)
			}
			err := f.c.ApplyDelta(deltaTo(tc.from, tc.to))
			if tc.want == nil {
				if err != nil {
					t.Fatalf("decommission = %v, want it taken", err)
				}
				routes(t, f.c, 2, 0)
				if got, err := resolver.LoadView(f.dir, "api"); err != nil || got.Version != 2 || len(got.Endpoints) != 0 {
					t.Fatalf("file: v%d with %d endpoints, %v; want the empty v2", got.Version, len(got.Endpoints), err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("apply = %v, want %v", err, tc.want)
			}
			if r := routes(t, f.c, 1, 10); r.Hold == nil || r.Hold.Reason != tc.want || r.Hold.NewestRoutable != 0 {
				t.Fatalf("hold %+v", r.Hold)
			}
		})
	}
}

// A server that flaps: an update that is not a shrink against what
// routing holds ends the hold, so the next shrink starts the confirm
// time afresh; updates that are still refused do not move the hold's
// start, and routing follows the newest of them.
func TestHoldTimerOnAFlappingServer(t *testing.T) {
	f := newHoldFixture(t)
	ten := view("api", 1, 10)
	if err := f.c.ApplyView(ten); err != nil {
		t.Fatal(err)
	}
	if err := f.c.ApplyView(viewOf("api", 2, ten.Endpoints[:4])); !errors.Is(err, resolver.ErrShrinkCapped) {
		t.Fatal(err)
	}
	f.clk.Advance(30 * time.Second)
	if err := f.c.ApplyView(viewOf("api", 3, ten.Endpoints)); err != nil {
		t.Fatalf("the full set again = %v", err)
	}
	if r := routes(t, f.c, 3, 10); r.Hold != nil {
		t.Fatalf("hold %+v after a larger set", r.Hold)
	}
	f.clk.Advance(40 * time.Second) // 70 s after the first hold began
	f.c.Sweep()
	routes(t, f.c, 3, 10)

	restart := f.clk.Now()
	if err := f.c.ApplyView(viewOf("api", 4, ten.Endpoints[:4])); !errors.Is(err, resolver.ErrShrinkCapped) {
		t.Fatal(err)
	}
	if r := routes(t, f.c, 3, 10); r.Hold == nil || !r.Hold.Since.Equal(restart) {
		t.Fatalf("hold %+v, want it to begin at %s", r.Hold, restart)
	}
	// Smaller, then larger but still a refused shrink: the server still
	// stands by a smaller set, so the start stays.
	f.clk.Advance(20 * time.Second)
	empty := viewOf("api", 5, nil)
	empty.Zones = view("api", 5, 10).Zones // every endpoint withdrawn, none deregistered
	if err := f.c.ApplyView(empty); !errors.Is(err, resolver.ErrWouldEmpty) {
		t.Fatal(err)
	}
	f.clk.Advance(20 * time.Second)
	if err := f.c.ApplyView(withRegistered(viewOf("api", 6, ten.Endpoints[:3]), map[string]int{"a": 5, "b": 5})); !errors.Is(err, resolver.ErrShrinkCapped) {
		t.Fatal(err)
	}
	r := routes(t, f.c, 3, 10)
	if r.Hold == nil || !r.Hold.Since.Equal(restart) || r.Hold.NewestVersion != 6 || r.Hold.NewestRoutable != 3 || r.Hold.Reason != resolver.ErrShrinkCapped {
		t.Fatalf("hold %+v, want since %s with v6 (3) newest", r.Hold, restart)
	}
	f.clk.Advance(20*time.Second - time.Nanosecond)
	f.c.Sweep()
	routes(t, f.c, 3, 10)
	f.clk.Advance(time.Nanosecond)
	f.c.Sweep()
	routes(t, f.c, 6, 3)
	if st := f.c.Stats(); st.HoldsFollowed != 1 || st.ShrinkCapped != 3 || st.WouldEmpty != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// Release is the operator's override: it ends the hold at once and writes
// the file.
func TestReleaseEndsHold(t *testing.T) {
	f := newHoldFixture(t)
	ten := view("api", 1, 10)
	if err := f.c.ApplyView(ten); err != nil {
		t.Fatal(err)
	}
	if err := f.c.ApplyView(viewOf("api", 2, ten.Endpoints[:1])); !errors.Is(err, resolver.ErrShrinkCapped) {
		t.Fatal(err)
	}
	if err := f.c.Release("api"); err != nil {
		t.Fatal(err)
	}
	if r := routes(t, f.c, 2, 1); r.Hold != nil {
		t.Fatalf("hold %+v after Release", r.Hold)
	}
	if st := f.c.Stats(); st.HoldsReleased != 1 || st.Holding != 0 || st.HoldsFollowed != 0 {
		t.Fatalf("stats %+v", st)
	}
	if got, err := resolver.LoadView(f.dir, "api"); err != nil || got.Version != 2 {
		t.Fatalf("file after Release: v%d, %v", got.Version, err)
	}
	// Nothing left to follow.
	f.clk.Advance(2 * resolver.DefaultConfirmAfter)
	f.c.Sweep()
	if st := f.c.Stats(); st.HoldsFollowed != 0 {
		t.Fatalf("Sweep followed a released hold: %+v", st)
	}
}
