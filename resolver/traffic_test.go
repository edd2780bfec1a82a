package resolver_test

import (
	"math/rand/v2"
	"testing"

	"github.com/musterhq/muster/resolver"
)

func withTraffic(v resolver.View, zone string, w float64) resolver.View {
	z := v.Zones[zone]
	z.TrafficWeight = &w
	v.Zones[zone] = z
	return v
}

func zoneShare(t *testing.T, c *resolver.Cache, zone string) float64 {
	t.Helper()
	n := 0
	for range 4000 {
		e, err := c.Pick("api")
		if err != nil {
			t.Fatal(err)
		}
		if e.Zone == zone {
			n++
		}
	}
	return float64(n) / 4000
}

// Shift-backs move traffic, not membership: a drained zone gets no picks,
// a returning one its share, and neither counts as a shrink.
func TestZoneTrafficWeights(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	dir := t.TempDir()
	c := newCache(t, resolver.WithRandom(r.Uint64), resolver.WithDir(dir))
	if err := c.ApplyView(view("api", 1, 10)); err != nil { // zones a and b, 5 each
		t.Fatal(err)
	}
	if got := zoneShare(t, c, "a"); got < 0.4 || got > 0.6 {
		t.Fatalf("zone a share %.2f before any shift, want about 0.5", got)
	}
	if err := c.ApplyView(withTraffic(view("api", 2, 10), "a", 0)); err != nil {
		t.Fatalf("draining zone a: %v (a traffic shift is not a shrink)", err)
	}
	if got := zoneShare(t, c, "a"); got != 0 {
		t.Fatalf("zone a share %.2f while drained, want 0", got)
	}
	if res := mustResolve(t, c, "api"); res.Routable() != 10 || res.Guarded() {
		t.Fatalf("drained: Routable %d, guarded %v; want 10 and no guard", res.Routable(), res.Guarded())
	}
	// The drained zone's weight survives the last-known-good file.
	if v, err := resolver.LoadView(dir, "api"); err != nil || v.Zones["a"].TrafficWeight == nil || *v.Zones["a"].TrafficWeight != 0 {
		t.Fatalf("persisted zone a: %+v, %v", v.Zones["a"], err)
	}

	if err := c.ApplyView(withTraffic(view("api", 3, 10), "a", 0.25)); err != nil {
		t.Fatal(err)
	}
	if got := zoneShare(t, c, "a"); got < 0.15 || got > 0.25 { // 0.25 / 1.25 = 0.2
		t.Fatalf("zone a share %.2f at step 0.25, want about 0.2", got)
	}

	// Every zone drained (a region drain seen from inside the region):
	// routing carries on over all of them rather than stopping.
	all := withTraffic(withTraffic(view("api", 4, 10), "a", 0), "b", 0)
	if err := c.ApplyView(all); err != nil {
		t.Fatal(err)
	}
	if got := zoneShare(t, c, "a"); got < 0.4 || got > 0.6 {
		t.Fatalf("zone a share %.2f with every zone drained, want about 0.5 (traffic weights ignored)", got)
	}
}
