package resolver

import (
	"fmt"
	"strings"
)

// Cross-region fallback. A client in one region may also hold
// the views of its services in peer regions, as its own muster serves
// them: the remote series "<service>@<region>" (RemoteSeries), followed
// from that muster's read-only aggregate of the peer. Pick prefers the
// client's own region and uses a remote one only when the local one has
// no routable capacity for the service: the newest local view routes
// nothing (every instance withdrawn, or the service exists only in the
// peer regions), every routable local endpoint is ejected, or the
// region is drained (a region shift: the routing control turned it off,
// or an operator drained it); while a drained region's traffic returns in
// ADR-13's capped steps, the local share of picks follows the step. The
// regions are tried in the order configured. A client fails over
// without muster in its request path: the decision is taken from what
// the cache holds.

// RemoteSeries names service's series in a peer region: the name the
// watch stream and the cache use for that region's view of it.
func RemoteSeries(service, region string) string { return service + "@" + region }

// SplitSeries splits a remote series' name; ok is false for a local
// service.
func SplitSeries(name string) (service, region string, ok bool) {
	service, region, ok = strings.Cut(name, "@")
	return service, region, ok && service != "" && region != ""
}

// WithRegions makes the cache hold, for every service configured, its
// series in each of regions too (in that order of preference), and Pick
// fall back to them when the local region has no routable capacity.
func WithRegions(regions ...string) Option {
	return func(c *config) { c.regions = append([]string(nil), regions...) }
}

// expandRegions returns services with their remote series added, and
// the fallbacks of each local service, in order.
func expandRegions(services, regions []string) ([]string, map[string][]string, error) {
	if len(regions) == 0 {
		return services, nil, nil
	}
	out := append([]string(nil), services...)
	fb := make(map[string][]string, len(services))
	for _, r := range regions {
		if r == "" || strings.ContainsAny(r, "@,/") {
			return nil, nil, fmt.Errorf("resolver: region %q is not a region name", r)
		}
	}
	for _, s := range services {
		if strings.Contains(s, "@") {
			continue
		}
		for _, r := range regions {
			name := RemoteSeries(s, r)
			out = append(out, name)
			fb[s] = append(fb[s], name)
		}
	}
	return out, fb, nil
}

// hasCapacity reports whether svc routes something now: its newest view
// has a routable endpoint and routing's table (minus local ejections) is
// not empty.
func (svc *service) hasCapacity() bool {
	st := svc.state.Load()
	return st != nil && st.latest.routable > 0 && len(st.table.cum) > 0
}

// pickRegional is Pick with the fallbacks. The local view is used while
// it has capacity and its traffic share is whole; a share below 1 (a
// region drain, or its capped return under ADR-13, or zones drained) sends
// that part of the picks to the first fallback region that has capacity
// and is not drained itself (a region turned off drains its own views);
// without capacity, all of them. With no such region, the local answer
// stands (its held set, or its error): muster is never the reason
// traffic stops.
func (c *Cache) pickRegional(svc *service) (Endpoint, error) {
	share := 0.0
	if svc.hasCapacity() {
		share = svc.state.Load().routing.share
	}
	if share >= 1 {
		return c.pickOne(svc)
	}
	for _, f := range svc.fallback {
		if !f.hasCapacity() || !(f.state.Load().routing.share > 0) {
			continue
		}
		if share > 0 && float64(c.cfg.random()>>11)*0x1p-53 < share {
			return c.pickOne(svc)
		}
		return c.pickOne(f)
	}
	return c.pickOne(svc)
}
