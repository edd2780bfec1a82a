package xds

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/musterhq/muster/resolver"
)

// priorAssignment is Assignment as it was before endpoints got
// localities of their own (one locality per zone, weighted by the zone's
// share × 100; endpoint weights × 100): the reference for what Envoy saw.
func priorAssignment(s *resolver.Snapshot) *endpoint.ClusterLoadAssignment {
	targets := s.Targets()
	zones := s.Zones()
	routable := false
	for _, t := range targets {
		if h := healthOf(t.Endpoint, zones); h == core.HealthStatus_HEALTHY || h == core.HealthStatus_UNKNOWN {
			routable = true
			break
		}
	}
	byZone := map[string]*endpoint.LocalityLbEndpoints{}
	share := map[string]float64{}
	for _, t := range targets {
		loc := byZone[t.Zone]
		if loc == nil {
			loc = &endpoint.LocalityLbEndpoints{Locality: &core.Locality{Zone: t.Zone}}
			byZone[t.Zone] = loc
		}
		h := healthOf(t.Endpoint, zones)
		if h == core.HealthStatus_DEGRADED && !routable {
			h = core.HealthStatus_UNKNOWN
		}
		loc.LbEndpoints = append(loc.LbEndpoints, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
					Protocol: core.SocketAddress_TCP, Address: t.Address,
					PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(t.Port)},
				}}},
			}},
			HealthStatus:        h,
			LoadBalancingWeight: wrapperspb.UInt32(scaled(t.Weight, endpointScale)),
		})
		share[t.Zone] += t.Share
	}
	names := make([]string, 0, len(byZone))
	for z := range byZone {
		names = append(names, z)
	}
	slices.Sort(names)
	cla := &endpoint.ClusterLoadAssignment{ClusterName: s.Service()}
	for _, z := range names {
		loc := byZone[z]
		loc.LoadBalancingWeight = wrapperspb.UInt32(scaled(share[z], localityScale))
		cla.Endpoints = append(cla.Endpoints, loc)
	}
	return cla
}

// probabilities is each endpoint's (address's) chance of a call at
// priority 0: the locality's weight over the priority's total, times,
// for Envoy, its endpoint weight over its locality's total, and for gRPC
// (round robin within a locality, endpoint weights ignored), 1/n.
func probabilities(cla *endpoint.ClusterLoadAssignment, envoy bool) map[string]float64 {
	return chancesBy(cla, envoy, (*core.SocketAddress).GetAddress)
}

// chancesBy is probabilities keyed by what key takes from an endpoint's
// socket address.
func chancesBy[K comparable](cla *endpoint.ClusterLoadAssignment, envoy bool, key func(*core.SocketAddress) K) map[K]float64 {
	var total float64
	for _, loc := range cla.GetEndpoints() {
		if loc.GetPriority() == 0 {
			total += float64(loc.GetLoadBalancingWeight().GetValue())
		}
	}
	out := map[K]float64{}
	for _, loc := range cla.GetEndpoints() {
		if loc.GetPriority() != 0 {
			continue
		}
		var in float64
		for _, e := range loc.GetLbEndpoints() {
			in += float64(e.GetLoadBalancingWeight().GetValue())
		}
		for _, e := range loc.GetLbEndpoints() {
			p := float64(loc.GetLoadBalancingWeight().GetValue()) / total
			if envoy {
				p *= float64(e.GetLoadBalancingWeight().GetValue()) / in
			} else {
				p /= float64(len(loc.GetLbEndpoints()))
			}
			out[key(e.GetEndpoint().GetAddress().GetSocketAddress())] += p
		}
	}
	return out
}

// shares is each target's Share over the total: what the resolver gives
// it, scaled by part.
func shares(s *resolver.Snapshot, part float64, into map[string]float64) map[string]float64 {
	if into == nil {
		into = map[string]float64{}
	}
	var total float64
	for _, t := range s.Targets() {
		total += t.Share
	}
	for _, t := range s.Targets() {
		into[t.Address] += part * t.Share / total
	}
	return into
}

// farthest is the largest difference between a and b over their keys,
// and the key it is at.
func farthest(a, b map[string]float64) (float64, string) {
	var worst float64
	var at string
	for k := range a {
		if d := math.Abs(a[k] - b[k]); d > worst || at == "" {
			worst, at = d, k
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			return math.Inf(1), k
		}
	}
	return worst, at
}

func wep(id, zone, state string, weight float64) resolver.Endpoint {
	return resolver.Endpoint{InstanceID: fmt.Sprintf("00000000-0000-0000-0000-%012s", id), Address: "10.0.0." + id, Port: 80,
		Zone: zone, State: state, Weight: weight, Health: "known"}
}

func wsnap(t *testing.T, service, region string, eps []resolver.Endpoint, zones map[string]resolver.Zone) *resolver.Snapshot {
	t.Helper()
	for i := range eps {
		eps[i].Region = region
	}
	v := resolver.View{Service: service, Version: 7, Region: region, Endpoints: eps, Zones: zones, GeneratedAt: time.Now(), Checksum: resolver.Checksum(eps)}
	s, err := resolver.SnapshotOf(v, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func tw(w float64) *float64 { return &w }

var wok = resolver.Zone{Guard: resolver.GuardOK}

// TestWeightsEnvoyAndGRPCAlike: for snapshots whose weights differ
// within a zone (each step of a slow-start ramp, a tripped guard
// republishing endpoints, override weights, a zone shift, every zone
// drained), the chance of each endpoint under Envoy's semantics is what
// it was (within the former rounding) and what the resolver gives it
// (within 10^-3), and under gRPC's semantics, which ignore endpoint
// weights, it is the resolver's too; before, gRPC gave a ramping
// endpoint an even share of its zone. A zone of one weight is exactly as
// before: same bytes, same version.
func TestWeightsEnvoyAndGRPCAlike(t *testing.T) {
	t.Parallel()
	type scenario struct {
		name  string
		eps   []resolver.Endpoint
		zones map[string]resolver.Zone
	}
	var ramps []scenario
	for step := 1; step <= 9; step++ {
		w := float64(step) / 10
		ramps = append(ramps, scenario{
			name: fmt.Sprintf("slow start at %.1f", w),
			eps: []resolver.Endpoint{wep("1", "az1", "eligible", 1), wep("2", "az1", "eligible", 1), wep("3", "az1", "eligible", w),
				wep("4", "az2", "eligible", 1), wep("5", "az2", "eligible", 1)},
			zones: map[string]resolver.Zone{"az1": wok, "az2": wok},
		})
	}
	quarantined := wep("4", "az1", "ineligible", 0.6)
	quarantined.Quarantined = true
	varied := append(ramps, []scenario{{
		name: "a tripped guard republishes ineligible endpoints beside a ramping one",
		eps: []resolver.Endpoint{wep("1", "az1", "eligible", 1), wep("2", "az1", "ineligible", 1), wep("3", "az1", "eligible", 0.2), quarantined,
			wep("5", "az2", "eligible", 1)},
		zones: map[string]resolver.Zone{"az1": {Guard: resolver.GuardTripped}, "az2": wok},
	}, {
		name: "override weights",
		eps: []resolver.Endpoint{wep("1", "az1", "eligible", 1), wep("2", "az1", "eligible", 0.35), wep("3", "az1", "eligible", 0.7), wep("4", "az1", "eligible", 0.7),
			wep("5", "az2", "eligible", 0.5), wep("6", "az2", "eligible", 0.5)},
		zones: map[string]resolver.Zone{"az1": wok, "az2": wok},
	}, {
		name: "a zone stepping back while an instance in it ramps",
		eps: []resolver.Endpoint{wep("1", "az1", "eligible", 1), wep("2", "az1", "eligible", 0.5),
			wep("3", "az2", "eligible", 1), wep("4", "az2", "eligible", 1), wep("5", "az2", "eligible", 0.3)},
		zones: map[string]resolver.Zone{"az1": wok, "az2": {Guard: resolver.GuardOK, TrafficWeight: tw(0.25)}},
	}, {
		name: "every zone drained: weights alone",
		eps: []resolver.Endpoint{wep("1", "az1", "eligible", 1), wep("2", "az1", "eligible", 0.1),
			wep("3", "az2", "eligible", 1)},
		zones: map[string]resolver.Zone{"az1": {Guard: resolver.GuardOK, TrafficWeight: tw(0)}, "az2": {Guard: resolver.GuardOK, TrafficWeight: tw(0)}},
	}}...)

	var worstEnvoy, worstGRPC float64
	for _, sc := range varied {
		s := wsnap(t, "web", "", sc.eps, sc.zones)
		want := shares(s, 1, nil)
		cla, before := Assignment(s), priorAssignment(s)
		envoy, grpc := probabilities(cla, true), probabilities(cla, false)
		if d, at := farthest(envoy, probabilities(before, true)); d > 0.005 {
			t.Errorf("%s: Envoy's chance of %s is %.4f off what it was", sc.name, at, d)
		}
		d, at := farthest(envoy, want)
		if d > 1e-3 {
			t.Errorf("%s: Envoy's chance of %s is %.5f off the resolver's share", sc.name, at, d)
		}
		worstEnvoy = max(worstEnvoy, d)
		d, at = farthest(grpc, want)
		if d > 1e-3 {
			t.Errorf("%s: gRPC's chance of %s is %.5f off the resolver's share", sc.name, at, d)
		}
		worstGRPC = max(worstGRPC, d)
		// The former assignment is what gRPC clients got wrong: a
		// ramping endpoint at 0.1 beside two at 1 got a third of its zone.
		if sc.name == "slow start at 0.1" {
			if d, at := farthest(probabilities(before, false), want); d < 0.1 || at != "10.0.0.3" {
				t.Errorf("before: gRPC's chance of the ramping endpoint %.3f off, want > 0.1 (%s)", d, at)
			}
			if got := grpc["10.0.0.3"]; math.Abs(got-0.1/4.1) > 1e-4 {
				t.Errorf("slow start at 0.1: gRPC's chance %.5f, want %.5f", got, 0.1/4.1)
			}
		}
		// Every locality holds endpoints of one weight, and sums fit.
		var sum uint64
		for _, loc := range cla.GetEndpoints() {
			sum += uint64(loc.GetLoadBalancingWeight().GetValue())
			for _, e := range loc.GetLbEndpoints() {
				if e.GetLoadBalancingWeight().GetValue() != loc.GetLbEndpoints()[0].GetLoadBalancingWeight().GetValue() {
					t.Errorf("%s: locality %v holds endpoints of different weights", sc.name, loc.GetLocality())
				}
			}
		}
		if sum > math.MaxUint32 {
			t.Errorf("%s: locality weights sum to %d", sc.name, sum)
		}
		// Deterministic: built again, the same bytes.
		a, b := mustVersion(t, cla), mustVersion(t, Assignment(wsnap(t, "web", "", slices.Clone(sc.eps), sc.zones)))
		if a != b {
			t.Errorf("%s: built twice, versions %s and %s", sc.name, a, b)
		}
	}
	t.Logf("largest difference from the resolver's shares: Envoy %.2g, gRPC %.2g", worstEnvoy, worstGRPC)

	// A ramping endpoint keeps its locality (named by its instance) from
	// step to step: gRPC reweighs it instead of connecting anew.
	subZones := func(cla *endpoint.ClusterLoadAssignment) []string {
		var out []string
		for _, loc := range cla.GetEndpoints() {
			out = append(out, loc.GetLocality().GetZone()+"/"+loc.GetLocality().GetSubZone())
		}
		return out
	}
	first := subZones(Assignment(wsnap(t, "web", "", ramps[0].eps, ramps[0].zones)))
	for _, sc := range ramps[1:] {
		if got := subZones(Assignment(wsnap(t, "web", "", sc.eps, sc.zones))); !slices.Equal(got, first) {
			t.Errorf("%s: localities %v, at the first step %v", sc.name, got, first)
		}
	}

	// Steady state: zones of one weight each are exactly as before.
	for _, sc := range []scenario{{
		name:  "two zones at full weight",
		eps:   []resolver.Endpoint{wep("1", "az1", "eligible", 1), wep("2", "az1", "eligible", 1), wep("3", "az2", "eligible", 1)},
		zones: map[string]resolver.Zone{"az1": wok, "az2": wok},
	}, {
		name:  "one weight in each zone, a zone stepping back",
		eps:   []resolver.Endpoint{wep("1", "az1", "eligible", 0.5), wep("2", "az1", "eligible", 0.5), wep("3", "az2", "eligible", 1), wep("4", "az2", "eligible", 1)},
		zones: map[string]resolver.Zone{"az1": wok, "az2": {Guard: resolver.GuardOK, TrafficWeight: tw(0.1)}},
	}, {
		name:  "a whole zone ramping together",
		eps:   []resolver.Endpoint{wep("1", "az1", "eligible", 0.3), wep("2", "az1", "eligible", 0.3), wep("3", "az2", "eligible", 1)},
		zones: map[string]resolver.Zone{"az1": wok, "az2": wok},
	}, {
		name:  "a tripped guard at one weight",
		eps:   []resolver.Endpoint{wep("1", "az1", "eligible", 1), wep("2", "az1", "ineligible", 1)},
		zones: map[string]resolver.Zone{"az1": {Guard: resolver.GuardTripped}},
	}} {
		s := wsnap(t, "web", "", sc.eps, sc.zones)
		cla, before := Assignment(s), priorAssignment(s)
		if !proto.Equal(cla, before) {
			t.Errorf("%s: steady state changed:\n%v\nwas\n%v", sc.name, cla, before)
		}
		if a, b := mustVersion(t, cla), mustVersion(t, before); a != b {
			t.Errorf("%s: version %s, was %s", sc.name, a, b)
		}
		for _, loc := range cla.GetEndpoints() {
			if loc.GetLocality().GetSubZone() != "" {
				t.Errorf("%s: a sub-zone locality %v", sc.name, loc.GetLocality())
			}
		}
	}
}

// TestWeightsBlendedAcrossRegions: while a region drain steps back,
// priority 0 blends the local localities (at the step's share) with the
// first peer region's (the rest); with instances ramping on both sides,
// Envoy and gRPC give each endpoint its share of its side, as the
// resolver's Pick does, and Envoy what it gave before. Without a ramp
// the blend is exactly as before.
func TestWeightsBlendedAcrossRegions(t *testing.T) {
	t.Parallel()
	for _, ramp := range []bool{true, false} {
		lw, pw := 1.0, 1.0
		if ramp {
			lw, pw = 0.3, 0.5
		}
		local := wsnap(t, "web", "", []resolver.Endpoint{wep("1", "az1", "eligible", 1), wep("2", "az1", "eligible", lw), wep("3", "az2", "eligible", 1)},
			map[string]resolver.Zone{"az1": {Guard: resolver.GuardOK, TrafficWeight: tw(0.25)}, "az2": {Guard: resolver.GuardOK, TrafficWeight: tw(0.25)}})
		peer := wsnap(t, resolver.RemoteSeries("web", "b"), "b", []resolver.Endpoint{wep("11", "bz1", "eligible", 1), wep("12", "bz1", "eligible", pw), wep("13", "bz1", "eligible", 1)},
			map[string]resolver.Zone{"bz1": wok})
		cla, _ := Priorities("web", "a", local, []Tier{{Region: "b", Snapshot: peer}})
		share := local.TrafficShare()
		if share != 0.25 {
			t.Fatalf("local traffic share %g", share)
		}
		want := shares(peer, 1-share, shares(local, share, nil))
		// Before: the same blend of the former assignments.
		before, _, _ := mergeTiers("web",
			&tier{region: "a", series: "web", version: 7, cla: priorAssignment(local), share: share},
			[]*tier{{region: "b", series: peer.Service(), version: 7, cla: priorAssignment(peer), share: 1}})
		for _, loc := range cla.GetEndpoints() {
			if loc.GetPriority() != 0 {
				t.Fatalf("ramp %v: a blended locality at priority %d", ramp, loc.GetPriority())
			}
		}
		envoy, grpc := probabilities(cla, true), probabilities(cla, false)
		if d, at := farthest(envoy, probabilities(before, true)); d > 0.005 {
			t.Errorf("ramp %v: Envoy's chance of %s is %.4f off what it was", ramp, at, d)
		}
		if d, at := farthest(envoy, want); d > 1e-3 {
			t.Errorf("ramp %v: Envoy's chance of %s is %.5f off the resolver's", ramp, at, d)
		}
		d, at := farthest(grpc, want)
		if d > 1e-3 {
			t.Errorf("ramp %v: gRPC's chance of %s is %.5f off the resolver's", ramp, at, d)
		}
		t.Logf("ramp %v: gRPC's largest difference from the resolver's shares %.2g", ramp, d)
		if !ramp && !proto.Equal(cla, before) {
			t.Errorf("no ramp: the blend changed:\n%v\nwas\n%v", cla, before)
		}
	}
}

func mustVersion(t *testing.T, cla *endpoint.ClusterLoadAssignment) string {
	t.Helper()
	v, err := contentVersion(cla)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
