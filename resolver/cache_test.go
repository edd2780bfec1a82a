package resolver_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/resolver"
)

func TestResolveErrors(t *testing.T) {
	c := newCache(t)
	if _, err := c.Resolve("nope"); !errors.Is(err, resolver.ErrUnknownService) {
		t.Errorf("Resolve(nope) = %v, want ErrUnknownService", err)
	}
	if _, err := c.Resolve("api"); !errors.Is(err, resolver.ErrNoView) {
		t.Errorf("Resolve(api) cold = %v, want ErrNoView", err)
	}
	if _, err := c.Pick("api"); !errors.Is(err, resolver.ErrNoView) {
		t.Errorf("Pick(api) cold = %v, want ErrNoView", err)
	}
	if err := c.ApplyView(view("nope", 1, 1)); !errors.Is(err, resolver.ErrUnknownService) {
		t.Errorf("ApplyView(nope) = %v, want ErrUnknownService", err)
	}
	// Cold and empty: nothing larger to hold, so it is taken.
	if err := c.ApplyView(view("api", 1, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pick("api"); !errors.Is(err, resolver.ErrNoEndpoints) {
		t.Errorf("Pick(api) empty = %v, want ErrNoEndpoints", err)
	}
}

func TestApplyMonotonic(t *testing.T) {
	c := newCache(t)
	if err := c.ApplyView(view("api", 5, 4)); err != nil {
		t.Fatal(err)
	}
	for _, v := range []uint64{5, 4} {
		if err := c.ApplyView(view("api", v, 3)); !errors.Is(err, resolver.ErrStale) {
			t.Errorf("ApplyView v%d = %v, want ErrStale", v, err)
		}
	}
	stale := resolver.Delta{Service: "api", FromVersion: 4, Version: 5}
	if err := c.ApplyDelta(stale); !errors.Is(err, resolver.ErrStale) {
		t.Errorf("ApplyDelta to v5 = %v, want ErrStale", err)
	}
	r := mustResolve(t, c, "api")
	if r.Version() != 5 || len(r.Endpoints()) != 4 {
		t.Errorf("held v%d with %d endpoints, want v5 with 4", r.Version(), len(r.Endpoints()))
	}
	if err := c.ApplyView(view("api", 6, 5)); err != nil {
		t.Fatal(err)
	}
	if r := mustResolve(t, c, "api"); r.Version() != 6 {
		t.Errorf("version %d, want 6", r.Version())
	}
	if s := c.Stats(); s.Applied != 2 || s.Stale != 3 {
		t.Errorf("stats %+v, want 2 applied, 3 stale", s)
	}
}

func TestApplyDelta(t *testing.T) {
	c := newCache(t)
	v1 := view("api", 1, 6)
	if err := c.ApplyView(v1); err != nil {
		t.Fatal(err)
	}
	eps := append([]resolver.Endpoint(nil), v1.Endpoints[1:]...) // remove 0
	eps[0].Weight = 2                                            // change 1
	eps = append(eps, ep(10, "c", 1))                            // add 10 in a new zone
	v2 := viewOf("api", 2, eps)
	if err := c.ApplyDelta(deltaTo(v1, v2)); err != nil {
		t.Fatal(err)
	}
	r := mustResolve(t, c, "api")
	if r.Version() != 2 || r.Checksum() != v2.Checksum || len(r.Endpoints()) != 6 {
		t.Fatalf("after delta: v%d, %d endpoints, checksum %s", r.Version(), len(r.Endpoints()), r.Checksum())
	}
	if _, ok := r.Zones()["c"]; !ok {
		t.Errorf("zone c missing after delta: %v", r.Zones())
	}
	// Drop zone c again.
	v3 := viewOf("api", 3, eps[:len(eps)-1])
	if err := c.ApplyDelta(deltaTo(v2, v3)); err != nil {
		t.Fatal(err)
	}
	if _, ok := mustResolve(t, c, "api").Zones()["c"]; ok {
		t.Error("zone c still present after removed_zones")
	}
}

func TestGapAndChecksumKeepSnapshot(t *testing.T) {
	var events []resolver.Event
	c := newCache(t, resolver.WithEventHook(func(e resolver.Event) { events = append(events, e) }))
	if err := c.ApplyDelta(resolver.Delta{Service: "api", FromVersion: 0, Version: 1}); !errors.Is(err, resolver.ErrGap) {
		t.Errorf("delta on cold = %v, want ErrGap", err)
	}
	v1 := view("api", 1, 4)
	if err := c.ApplyView(v1); err != nil {
		t.Fatal(err)
	}
	v3 := view("api", 3, 5)
	gap := deltaTo(v1, v3)
	gap.FromVersion = 2
	if err := c.ApplyDelta(gap); !errors.Is(err, resolver.ErrGap) {
		t.Errorf("gap delta = %v, want ErrGap", err)
	}
	bad := deltaTo(v1, v3)
	bad.Checksum = "00"
	if err := c.ApplyDelta(bad); !errors.Is(err, resolver.ErrChecksum) {
		t.Errorf("bad delta checksum = %v, want ErrChecksum", err)
	}
	badView := view("api", 4, 5)
	badView.Endpoints[0].Weight = 7 // no longer matches its checksum
	if err := c.ApplyView(badView); !errors.Is(err, resolver.ErrChecksum) {
		t.Errorf("bad view checksum = %v, want ErrChecksum", err)
	}
	r := mustResolve(t, c, "api")
	if r.Version() != 1 || r.Checksum() != v1.Checksum || r.Guarded() {
		t.Errorf("held v%d (guarded %v), want v1 untouched", r.Version(), r.Guarded())
	}
	// The good delta still applies on top of v1.
	if err := c.ApplyDelta(deltaTo(v1, v3)); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()
	if s.Gaps != 2 || s.ChecksumMismatches != 2 || len(events) != 4 {
		t.Errorf("stats %+v, %d events; want 2 gaps, 2 mismatches, 4 events", s, len(events))
	}
}

func TestDuplicateIDsInvalid(t *testing.T) {
	c := newCache(t)
	eps := []resolver.Endpoint{ep(1, "a", 1), ep(1, "a", 1)}
	if err := c.ApplyView(viewOf("api", 1, eps)); !errors.Is(err, resolver.ErrInvalid) {
		t.Errorf("duplicate ids = %v, want ErrInvalid", err)
	}
}

func TestRoutable(t *testing.T) {
	eps := []resolver.Endpoint{
		ep(0, "a", 1),
		ep(1, "a", 0), // weight 0
		ep(2, "a", 1),
		ep(3, "b", 1),
		ep(4, "b", 1),
		ep(5, "a", 1),
	}
	eps[2].State = resolver.StateIneligible
	eps[3].State = resolver.StateIneligible // zone b tripped: routable
	eps[4].Quarantined = true               // zone b tripped: routable
	eps[5].Quarantined = true
	eps[5].Health = resolver.HealthUnknown
	v := viewOf("api", 1, eps)
	v.Zones["b"] = resolver.Zone{Guard: resolver.GuardTripped, Total: 2}
	c := newCache(t)
	if err := c.ApplyView(v); err != nil {
		t.Fatal(err)
	}
	r := mustResolve(t, c, "api")
	if r.Routable() != 3 || !r.Tripped() {
		t.Errorf("routable %d tripped %v, want 3 (0, 3, 4) and true", r.Routable(), r.Tripped())
	}
	if u := r.HealthUnknown(); len(u) != 1 || r.Endpoints()[u[0]].InstanceID != id(5) {
		t.Errorf("HealthUnknown = %v, want [5]", u)
	}
	for range 200 {
		e, err := c.Pick("api")
		if err != nil {
			t.Fatal(err)
		}
		if e.InstanceID != id(0) && e.InstanceID != id(3) && e.InstanceID != id(4) {
			t.Fatalf("Pick returned unroutable %s", e.InstanceID)
		}
	}
}

func TestGuardWouldEmpty(t *testing.T) {
	var events []resolver.Event
	c := newCache(t, resolver.WithMaxShrink(1), resolver.WithEventHook(func(e resolver.Event) { events = append(events, e) }))
	v1 := view("api", 1, 4)
	if err := c.ApplyView(v1); err != nil {
		t.Fatal(err)
	}
	eps := append([]resolver.Endpoint(nil), v1.Endpoints...)
	for i := range eps {
		eps[i].State = resolver.StateIneligible
	}
	v2 := viewOf("api", 2, eps)
	if err := c.ApplyView(v2); !errors.Is(err, resolver.ErrWouldEmpty) {
		t.Fatalf("emptying view = %v, want ErrWouldEmpty", err)
	}
	r := mustResolve(t, c, "api")
	if r.Version() != 1 || r.Routable() != 4 || r.Held != 2 || !r.Guarded() {
		t.Errorf("routing v%d (%d routable, held v%d), want v1 with 4, held v2", r.Version(), r.Routable(), r.Held)
	}
	if len(events) != 1 || events[0].Routable != 0 || events[0].Held != 4 {
		t.Errorf("events = %+v", events)
	}
	// The refused view was recorded: a delta from v2 chains, and once it
	// restores endpoints routing follows.
	v3 := viewOf("api", 3, v1.Endpoints)
	if err := c.ApplyDelta(deltaTo(v2, v3)); err != nil {
		t.Fatal(err)
	}
	if r := mustResolve(t, c, "api"); r.Version() != 3 || r.Guarded() {
		t.Errorf("routing v%d guarded %v, want v3 unguarded", r.Version(), r.Guarded())
	}
	if c.Stats().WouldEmpty != 1 {
		t.Errorf("stats %+v", c.Stats())
	}
}

func TestGuardShrinkCapped(t *testing.T) {
	c := newCache(t)
	v1 := view("api", 1, 10)
	if err := c.ApplyView(v1); err != nil {
		t.Fatal(err)
	}
	// Exactly half is allowed.
	v2 := viewOf("api", 2, v1.Endpoints[:5])
	v2.Zones = v1.Zones
	if err := c.ApplyDelta(deltaTo(v1, v2)); err != nil {
		t.Fatalf("shrink by half = %v", err)
	}
	v3 := viewOf("api", 3, v2.Endpoints[:2])
	v3.Zones = v1.Zones
	if err := c.ApplyDelta(deltaTo(v2, v3)); !errors.Is(err, resolver.ErrShrinkCapped) {
		t.Fatalf("shrink 5->2 = %v, want ErrShrinkCapped", err)
	}
	if r := mustResolve(t, c, "api"); r.Version() != 2 || r.Routable() != 5 || r.Held != 3 {
		t.Errorf("routing v%d with %d, held v%d; want v2 with 5, held v3", r.Version(), r.Routable(), r.Held)
	}
	if err := c.Release("api"); err != nil {
		t.Fatal(err)
	}
	if r := mustResolve(t, c, "api"); r.Version() != 3 || r.Routable() != 2 || r.Guarded() {
		t.Errorf("after Release: v%d with %d", r.Version(), r.Routable())
	}
	if c.Stats().ShrinkCapped != 1 {
		t.Errorf("stats %+v", c.Stats())
	}
}

// A tripped zone guard means muster publishes full zones, so a shrink it
// reports is taken. (Decommissions are in hold_test.go: the "drained"
// exception this test used to cover, every zone at Total 0, could not
// come from a real server and is gone.)
func TestShrinkAllowedWhenTripped(t *testing.T) {
	c := newCache(t)
	v1 := view("api", 1, 10)
	if err := c.ApplyView(v1); err != nil {
		t.Fatal(err)
	}
	v2 := viewOf("api", 2, v1.Endpoints[:2])
	v2.Zones["a"] = resolver.Zone{Guard: resolver.GuardTripped, Eligible: 1, Total: 5}
	if err := c.ApplyView(v2); err != nil {
		t.Fatalf("shrink with tripped zone = %v", err)
	}
	if r := mustResolve(t, c, "api"); r.Version() != 2 || r.Routable() != 2 || r.Hold != nil {
		t.Errorf("routing v%d with %d (hold %+v), want v2 with 2", r.Version(), r.Routable(), r.Hold)
	}
	// A tripped zone does not make emptying the service acceptable.
	v3 := viewOf("api", 3, nil)
	v3.Zones = map[string]resolver.Zone{"a": {Guard: resolver.GuardTripped, Total: 5}}
	if err := c.ApplyView(v3); !errors.Is(err, resolver.ErrWouldEmpty) {
		t.Fatalf("emptying with a tripped zone = %v, want ErrWouldEmpty", err)
	}
}

func TestZeroAllocs(t *testing.T) {
	c := newCache(t)
	if err := c.ApplyView(view("api", 1, 1000)); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() {
		r, err := c.Resolve("api")
		if err != nil || r.Routable() == 0 {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Resolve allocates %v times", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		if _, err := c.Pick("api"); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Pick allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := c.Pick("db"); !errors.Is(err, resolver.ErrNoView) {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Pick cold allocates %v times", n)
	}
}

func TestPickDistribution(t *testing.T) {
	src := rand.New(rand.NewChaCha8([32]byte{7}))
	c := newCache(t, resolver.WithRandom(src.Uint64)) // Pick is called from one goroutine
	eps := []resolver.Endpoint{ep(0, "a", 1), ep(1, "a", 2), ep(2, "b", 3), ep(3, "b", 4), ep(4, "a", 0)}
	if err := c.ApplyView(viewOf("api", 1, eps)); err != nil {
		t.Fatal(err)
	}
	const n = 100_000
	counts := map[string]int{}
	for range n {
		e, err := c.Pick("api")
		if err != nil {
			t.Fatal(err)
		}
		counts[e.InstanceID]++
	}
	for _, e := range eps {
		want := e.Weight / 10 * n
		got := float64(counts[e.InstanceID])
		if got < want*0.95 || got > want*1.05 || (want == 0 && got != 0) {
			t.Errorf("%s (weight %v): picked %v times, want about %v", e.InstanceID, e.Weight, got, want)
		}
	}
}

func TestConcurrentApplyResolve(t *testing.T) {
	c := newCache(t)
	v := view("api", 1, 200)
	if err := c.ApplyView(v); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			var last uint64
			for !stop.Load() {
				r, err := c.Resolve("api")
				if err != nil {
					t.Error(err)
					return
				}
				if r.Version() < last {
					t.Errorf("version went back from %d to %d", last, r.Version())
					return
				}
				last = r.Version()
				if _, err := c.Pick("api"); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for i := range 300 {
		next := view("api", v.Version+1, 200)
		next.Endpoints[i%200].Weight = float64(i%5 + 1)
		next.Checksum = resolver.Checksum(next.Endpoints)
		var err error
		if i%3 == 0 {
			err = c.ApplyView(next)
		} else {
			err = c.ApplyDelta(deltaTo(v, next))
		}
		if err != nil {
			t.Fatal(err)
		}
		v = next
	}
	stop.Store(true)
	wg.Wait()
	if r := mustResolve(t, c, "api"); r.Version() != 301 {
		t.Errorf("final version %d, want 301", r.Version())
	}
}

func TestResultAge(t *testing.T) {
	now := t0
	c, err := resolver.NewCache([]string{"api"}, resolver.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyView(view("api", 1, 1)); err != nil {
		t.Fatal(err)
	}
	now = t0.Add(90 * time.Second)
	r := mustResolve(t, c, "api")
	if r.Age() != 90*time.Second || !r.ReceivedAt().Equal(t0) {
		t.Errorf("Age %v ReceivedAt %v", r.Age(), r.ReceivedAt())
	}
}

func TestNewValidates(t *testing.T) {
	for name, tc := range map[string]struct {
		services []string
		opts     []resolver.Option
	}{
		"duplicate": {services: []string{"a", "a"}},
		"empty":     {services: []string{""}},
		"shrink":    {services: []string{"a"}, opts: []resolver.Option{resolver.WithMaxShrink(1.5)}},
	} {
		if _, err := resolver.NewCache(tc.services, tc.opts...); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}
