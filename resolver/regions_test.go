package resolver_test

import (
	"errors"
	"testing"

	"github.com/musterhq/muster/resolver"
)

// remoteView is service's view in region, as a region's muster serves a
// peer's (the remote series, endpoints naming the region), with endpoint
// ids from base.
func remoteView(service, region string, version uint64, base, n int) resolver.View {
	eps := make([]resolver.Endpoint, n)
	for i := range eps {
		eps[i] = ep(base+i, "z1", 1)
		eps[i].Region = region
	}
	v := viewOf(resolver.RemoteSeries(service, region), version, eps)
	v.Region = region
	return v
}

// TestPickPrefersTheLocalRegion (issue 29): with Regions [b, c], Pick
// uses the local view while it has routable capacity, the first peer
// region with capacity when it has none (every endpoint withdrawn, a
// service that exists only remotely), and the local region again once it
// has capacity.
func TestPickPrefersTheLocalRegion(t *testing.T) {
	c := newCache(t, resolver.WithRegions("b", "c"))
	// Only c holds db so far: db resolves there.
	if err := c.ApplyView(remoteView("db", "c", 7, 500, 2)); err != nil {
		t.Fatal(err)
	}
	if e, err := c.Pick("db"); err != nil || e.Region != "c" {
		t.Fatalf("db, held only in c: %+v, %v", e, err)
	}
	if _, err := c.Resolve("db"); !errors.Is(err, resolver.ErrNoView) {
		t.Fatalf("Resolve(db) is the local view: %v", err)
	}

	// api: local capacity wins over b and c.
	for _, v := range []resolver.View{view("api", 1, 4), remoteView("api", "b", 9, 100, 3), remoteView("api", "c", 3, 200, 3)} {
		if err := c.ApplyView(v); err != nil {
			t.Fatal(err)
		}
	}
	for range 200 {
		if e, err := c.Pick("api"); err != nil || e.Region != "" {
			t.Fatalf("api with local capacity: %+v, %v", e, err)
		}
	}
	// Every local endpoint withdrawn (weight 0, not routable): b, the
	// first region configured, takes it, although the client guard keeps
	// the local set for routing inside the region.
	gone := view("api", 2, 4)
	for i := range gone.Endpoints {
		gone.Endpoints[i].Weight, gone.Endpoints[i].State = 0, resolver.StateIneligible
	}
	gone = viewOf("api", 2, gone.Endpoints)
	if err := c.ApplyView(gone); err != nil && !errors.Is(err, resolver.ErrWouldEmpty) {
		t.Fatal(err)
	}
	for range 200 {
		if e, err := c.Pick("api"); err != nil || e.Region != "b" {
			t.Fatalf("api with no local capacity: %+v, %v", e, err)
		}
	}
	// b has none either: c.
	bGone := remoteView("api", "b", 10, 100, 3)
	for i := range bGone.Endpoints {
		bGone.Endpoints[i].Weight, bGone.Endpoints[i].State = 0, resolver.StateIneligible
	}
	bGone = viewOf(bGone.Service, 10, bGone.Endpoints)
	if err := c.ApplyView(bGone); err != nil && !errors.Is(err, resolver.ErrWouldEmpty) {
		t.Fatal(err)
	}
	if e, err := c.Pick("api"); err != nil || e.Region != "c" {
		t.Fatalf("api with no capacity in a or b: %+v, %v", e, err)
	}
	// The local region back: it is preferred again.
	if err := c.ApplyView(view("api", 3, 4)); err != nil {
		t.Fatal(err)
	}
	if e, err := c.Pick("api"); err != nil || e.Region != "" {
		t.Fatalf("api with local capacity again: %+v, %v", e, err)
	}
}

// TestRegionsOptionRefusesBadNames: a region name cannot hold what would
// make its series ambiguous.
func TestRegionsOptionRefusesBadNames(t *testing.T) {
	for _, r := range []string{"", "a@b", "a,b", "a/b"} {
		if _, err := resolver.NewCache([]string{"api"}, resolver.WithRegions(r)); err == nil {
			t.Errorf("WithRegions(%q) accepted", r)
		}
	}
}

// drained returns v with every zone's traffic weight set to w (a region
// shift at that step).
func drained(v resolver.View, w float64) resolver.View {
	zones := map[string]resolver.Zone{}
	for name, z := range v.Zones {
		z.TrafficWeight = &w
		zones[name] = z
	}
	v.Zones = zones
	return v
}

// TestARegionDrainMovesPicksToTheFallback (issue 29): a region drain (every
// local zone at traffic weight 0, as the routing control or an operator's
// region shift publishes it) sends every pick to the first fallback region
// that is not drained itself; while the drain steps back (0.10, 0.25, 0.50
// by ADR-13) the local share of picks follows the step; at 1 all picks are
// local again. Without a fallback region, a drained region keeps routing
// locally (muster is never the reason traffic stops).
func TestARegionDrainMovesPicksToTheFallback(t *testing.T) {
	seq := uint64(0)
	rnd := func() uint64 { seq += 0x9E3779B97F4A7C15; return seq } // evenly spread
	c := newCache(t, resolver.WithRegions("b", "c"), resolver.WithRandom(rnd))
	// b is turned off too (its own region drain reached this region's
	// copy): c takes the traffic.
	for _, v := range []resolver.View{drained(view("api", 1, 4), 0), drained(remoteView("api", "b", 5, 100, 2), 0), remoteView("api", "c", 5, 200, 2)} {
		if err := c.ApplyView(v); err != nil {
			t.Fatal(err)
		}
	}
	count := func() map[string]int {
		n := map[string]int{}
		for range 10_000 {
			e, err := c.Pick("api")
			if err != nil {
				t.Fatal(err)
			}
			n[e.Region]++
		}
		return n
	}
	if n := count(); n["c"] != 10_000 {
		t.Fatalf("picks with a and b drained: %v, want all in c", n)
	}
	for i, step := range []float64{0.10, 0.25, 0.50} {
		if err := c.ApplyView(drained(view("api", uint64(2+i), 4), step)); err != nil {
			t.Fatal(err)
		}
		n := count()
		if local := float64(n[""]) / 10_000; local < step-0.02 || local > step+0.02 || n[""]+n["c"] != 10_000 {
			t.Fatalf("picks at step %.2f: %v", step, n)
		}
	}
	if err := c.ApplyView(view("api", 9, 4)); err != nil {
		t.Fatal(err)
	}
	if n := count(); n[""] != 10_000 {
		t.Fatalf("picks with the region back: %v", n)
	}
	// No fallback region to take it: a drained region routes locally.
	solo := newCache(t)
	if err := solo.ApplyView(drained(view("api", 1, 4), 0)); err != nil {
		t.Fatal(err)
	}
	if e, err := solo.Pick("api"); err != nil || e.Region != "" {
		t.Fatalf("a drained region without fallbacks: %+v, %v", e, err)
	}
}
