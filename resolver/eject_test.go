package resolver_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/musterhq/muster/resolver"
)

func ejectingCache(t *testing.T, n int) (*resolver.Cache, *fakeClock, *[]resolver.Event) {
	t.Helper()
	clk := newFakeClock(t0)
	var events []resolver.Event
	c := newCache(t, resolver.WithClock(clk.Now), resolver.WithEventHook(func(e resolver.Event) { events = append(events, e) }))
	if err := c.ApplyView(view("api", 1, n)); err != nil {
		t.Fatal(err)
	}
	return c, clk, &events
}

func fail(c *resolver.Cache, id string, times int) {
	for range times {
		c.Record("api", id, false)
	}
}

// pickSet returns the ids Pick returns over many draws.
func pickSet(t *testing.T, c *resolver.Cache) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	for range 2000 {
		e, err := c.Pick("api")
		if err != nil {
			t.Fatal(err)
		}
		seen[e.InstanceID] = true
	}
	return seen
}

func TestEjectAfterConsecutiveFailures(t *testing.T) {
	c, clk, _ := ejectingCache(t, 4)
	fail(c, id(0), 4)
	c.Record("api", id(0), true) // a success resets the run
	fail(c, id(0), 4)
	if got := c.Ejected("api"); len(got) != 0 {
		t.Fatalf("ejected after 4+4 failures split by a success: %v", got)
	}
	fail(c, id(0), 1)
	if got := c.Ejected("api"); len(got) != 1 || got[0] != id(0) {
		t.Fatalf("Ejected = %v, want [%s]", got, id(0))
	}
	if seen := pickSet(t, c); seen[id(0)] || len(seen) != 3 {
		t.Errorf("Pick chose %v; want the three others only", seen)
	}
	r := mustResolve(t, c, "api")
	if r.Ejected != 1 || r.Routable() != 4 {
		t.Errorf("Result.Ejected %d Routable %d, want 1 and 4 (the view is unchanged)", r.Ejected, r.Routable())
	}

	// The first ejection lasts BaseTime (30 s), the second twice that.
	clk.Advance(29 * time.Second)
	c.Sweep()
	if len(c.Ejected("api")) != 1 {
		t.Fatal("ejection ended before 30 s")
	}
	clk.Advance(time.Second)
	c.Sweep()
	if len(c.Ejected("api")) != 0 || !pickSet(t, c)[id(0)] {
		t.Fatal("endpoint not back in rotation after 30 s")
	}
	fail(c, id(0), 5)
	clk.Advance(59 * time.Second)
	c.Sweep()
	if len(c.Ejected("api")) != 1 {
		t.Fatal("second ejection ended before 60 s")
	}
	clk.Advance(time.Second)
	c.Sweep()
	if len(c.Ejected("api")) != 0 {
		t.Fatal("second ejection outlasted 60 s")
	}
	if s := c.Stats(); s.Ejections != 2 || s.Unejections != 2 {
		t.Errorf("stats %+v", s)
	}
}

// When every endpoint fails (the caller may be the problem), the cap
// holds: at most half the service is ejected.
func TestEjectionCap(t *testing.T) {
	c, _, events := ejectingCache(t, 4)
	for i := range 4 {
		c.Record("api", id(i), false) // nothing looks healthy any more
	}
	for i := range 4 {
		fail(c, id(i), 4)
	}
	if got := c.Ejected("api"); len(got) != 2 {
		t.Fatalf("Ejected = %v, want 2 of 4 (cap 50%%)", got)
	}
	if s := c.Stats(); s.EjectionsCapped != 2 {
		t.Errorf("EjectionsCapped = %d, want 2", s.EjectionsCapped)
	}
	if len(*events) != 2 || !errors.Is((*events)[0].Err, resolver.ErrEjectionCapped) {
		t.Fatalf("events %v, want two ErrEjectionCapped", *events)
	}
	if seen := pickSet(t, c); len(seen) != 2 || !seen[id(2)] || !seen[id(3)] {
		t.Errorf("Pick chose %v, want the two not ejected", seen)
	}
}

// Endpoints failing one after another: while an untried endpoint looks
// healthy the failing ones are ejected beyond the cap; once the last one
// fails too, nothing looks healthy and the cap is restored, ending the
// ejection that would end soonest.
func TestEjectionCapRestoredWhenNothingLooksHealthy(t *testing.T) {
	c, clk, events := ejectingCache(t, 4)
	for i := range 3 {
		fail(c, id(i), 5)
		clk.Advance(time.Second)
	}
	if got := c.Ejected("api"); len(got) != 3 {
		t.Fatalf("Ejected = %v, want 3 of 4 while id 3 is untried", got)
	}
	fail(c, id(3), 5)
	if got := c.Ejected("api"); fmt.Sprint(got) != fmt.Sprint([]string{id(1), id(2)}) {
		t.Fatalf("Ejected = %v, want the two latest (cap 50%%)", got)
	}
	if s := c.Stats(); s.EjectionsCapped != 1 || s.Unejections != 1 || len(*events) != 1 {
		t.Fatalf("stats %+v, events %v", s, *events)
	}
	if seen := pickSet(t, c); len(seen) != 2 || !seen[id(0)] || !seen[id(3)] {
		t.Errorf("Pick chose %v, want 0 and 3", seen)
	}
}

// traffic sends calls through Pick and Record until the set of ejected
// endpoints has not changed for 1,000 calls; dead says which fail.
func traffic(t *testing.T, c *resolver.Cache, dead func(string) bool) {
	t.Helper()
	last, still := "", 0
	for range 100_000 {
		e, err := c.Pick("api")
		if err != nil {
			t.Fatal(err)
		}
		c.Record("api", e.InstanceID, !dead(e.InstanceID))
		now := fmt.Sprint(c.Ejected("api"))
		if now == last {
			if still++; still == 1000 {
				return
			}
			continue
		}
		last, still = now, 0
	}
	t.Fatal("ejections never settled")
}

// Six of ten endpoints dead, four answering: the cap is on capacity that
// looks healthy, so all six are ejected and Pick never returns a dead
// one (a cap of floor(50% x 10) = 5 used to leave one pickable).
func TestEjectionTakesEveryDeadEndpointWhileOthersLookHealthy(t *testing.T) {
	c, _, events := ejectingCache(t, 10)
	dead := func(s string) bool { return s < id(6) }
	traffic(t, c, dead)
	want := []string{id(0), id(1), id(2), id(3), id(4), id(5)}
	if got := c.Ejected("api"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Ejected = %v, want %v", got, want)
	}
	for picked := range pickSet(t, c) {
		if dead(picked) {
			t.Fatalf("Pick returned dead endpoint %s", picked)
		}
	}
	if r := mustResolve(t, c, "api"); r.Ejected != 6 {
		t.Fatalf("Result.Ejected = %d, want 6", r.Ejected)
	}
	if s := c.Stats(); s.EjectionsCapped != 0 || len(*events) != 0 {
		t.Fatalf("stats %+v, events %v; want no capped ejection", s, *events)
	}
}

// Ten of ten failing: nothing looks healthy, so the cap of floor(50% x
// 10) holds and five stay in rotation.
func TestEjectionCappedWhenEverythingFails(t *testing.T) {
	c, _, _ := ejectingCache(t, 10)
	traffic(t, c, func(string) bool { return true })
	if got := c.Ejected("api"); len(got) != 5 {
		t.Fatalf("Ejected = %v, want 5 of 10", got)
	}
	if s := c.Stats(); s.EjectionsCapped == 0 {
		t.Fatalf("stats %+v, want capped ejections", s)
	}
}

// With MaxFraction 1 the cap allows every endpoint, but the last one in
// rotation is never ejected.
func TestEjectionKeepsTheLastEndpointInRotation(t *testing.T) {
	c := newCache(t, resolver.WithEjection(resolver.EjectionPolicy{MaxFraction: 1}))
	if err := c.ApplyView(view("api", 1, 3)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		fail(c, id(i), 5)
	}
	if got := c.Ejected("api"); len(got) != 2 {
		t.Fatalf("Ejected = %v, want 2 of 3", got)
	}
	if _, err := c.Pick("api"); err != nil {
		t.Fatalf("Pick with one endpoint left: %v", err)
	}
}

func TestEjectionNeverTakesTheLastEndpoint(t *testing.T) {
	c, _, _ := ejectingCache(t, 1)
	fail(c, id(0), 50)
	if got := c.Ejected("api"); len(got) != 0 {
		t.Fatalf("the only endpoint was ejected: %v", got)
	}
	if _, err := c.Pick("api"); err != nil {
		t.Fatal(err)
	}
}

// A view that shrinks (muster withdrew endpoints) ends ejections that
// would now exceed the cap, the soonest-ending first.
func TestEjectionCapHeldWhenViewShrinks(t *testing.T) {
	c, clk, _ := ejectingCache(t, 8)
	for i := range 4 {
		fail(c, id(i), 5)
		clk.Advance(time.Second)
	}
	if len(c.Ejected("api")) != 4 {
		t.Fatal("want 4 of 8 ejected")
	}
	next := viewOf("api", 2, view("api", 2, 8).Endpoints[:4])
	if err := c.ApplyView(next); err != nil {
		t.Fatal(err)
	}
	got := c.Ejected("api")
	if r := mustResolve(t, c, "api"); r.Ejected != 2 || len(got) != 2 || got[0] != id(2) || got[1] != id(3) {
		t.Fatalf("after shrinking to 4: Ejected %v, Result.Ejected %d; want the two latest of 4", got, r.Ejected)
	}
}

func TestRecordDoesNotAllocate(t *testing.T) {
	c, _, _ := ejectingCache(t, 100)
	a, b := id(7), id(8)
	allocs := testing.AllocsPerRun(1000, func() {
		c.Record("api", a, true)
		c.Record("api", b, false)
		c.Record("api", b, true)
	})
	if allocs != 0 {
		t.Errorf("Record allocates %.1f per run", allocs)
	}
	c.Record("api", "no-such", true)
	c.Record("nope", id(1), true)
	if s := c.Stats(); s.OutcomesUnknown != 2 {
		t.Errorf("OutcomesUnknown = %d, want 2", s.OutcomesUnknown)
	}
}
