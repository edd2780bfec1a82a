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
