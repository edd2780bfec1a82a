package resolver_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/musterhq/muster/resolver"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func id(i int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", i) }

func ep(i int, zone string, weight float64) resolver.Endpoint {
	return resolver.Endpoint{
		InstanceID: id(i), Address: fmt.Sprintf("10.0.%d.%d", i/256, i%256), Port: 8080,
		Zone: zone, State: "eligible", Weight: weight, Health: resolver.HealthKnown,
		Capabilities: []string{"http"},
	}
}

// view builds a checksummed view of n weight-1 endpoints spread over two
// zones.
func view(service string, version uint64, n int) resolver.View {
	eps := make([]resolver.Endpoint, n)
	for i := range eps {
		eps[i] = ep(i, zoneOf(i), 1)
	}
	return viewOf(service, version, eps)
}

func zoneOf(i int) string {
	if i%2 == 0 {
		return "a"
	}
	return "b"
}

func viewOf(service string, version uint64, eps []resolver.Endpoint) resolver.View {
	zones := map[string]resolver.Zone{}
	for _, e := range eps {
		z := zones[e.Zone]
		z.Guard, z.MinHealthyFraction = resolver.GuardOK, 0.5
		z.Total++
		z.Eligible++
		zones[e.Zone] = z
	}
	return resolver.View{
		Service: service, Version: version, Endpoints: eps, Zones: zones,
		GeneratedAt: t0, Checksum: resolver.Checksum(eps),
	}
}

// deltaTo builds the delta from `from` to `to` (both full views).
func deltaTo(from, to resolver.View) resolver.Delta {
	d := resolver.Delta{
		Service: to.Service, FromVersion: from.Version, Version: to.Version,
		Zones: to.Zones, Checksum: to.Checksum, GeneratedAt: to.GeneratedAt,
	}
	old := map[string]resolver.Endpoint{}
	for _, e := range from.Endpoints {
		old[e.InstanceID] = e
	}
	seen := map[string]bool{}
	for _, e := range to.Endpoints {
		seen[e.InstanceID] = true
		if o, ok := old[e.InstanceID]; !ok || fmt.Sprint(o) != fmt.Sprint(e) {
			d.Upserts = append(d.Upserts, e)
		}
	}
	for _, e := range from.Endpoints {
		if !seen[e.InstanceID] {
			d.Removals = append(d.Removals, e.InstanceID)
		}
	}
	for z := range from.Zones {
		if _, ok := to.Zones[z]; !ok {
			d.RemovedZones = append(d.RemovedZones, z)
		}
	}
	return d
}

func newCache(t testing.TB, opts ...resolver.Option) *resolver.Cache {
	t.Helper()
	opts = append([]resolver.Option{resolver.WithClock(func() time.Time { return t0.Add(time.Second) })}, opts...)
	c, err := resolver.NewCache([]string{"api", "db"}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustResolve(t *testing.T, c *resolver.Cache, service string) resolver.Result {
	t.Helper()
	r, err := c.Resolve(service)
	if err != nil {
		t.Fatalf("Resolve(%s): %v", service, err)
	}
	return r
}
