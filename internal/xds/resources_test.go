package xds_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/xds"
	"github.com/musterhq/muster/resolver"
)

func ep(id, zone, state, health string, weight float64) resolver.Endpoint {
	return resolver.Endpoint{InstanceID: fmt.Sprintf("00000000-0000-0000-0000-%012s", id), Address: "10.0.0." + id, Port: 80,
		Zone: zone, State: state, Weight: weight, Health: health}
}

func snapshot(t *testing.T, eps []resolver.Endpoint, zones map[string]resolver.Zone) *resolver.Snapshot {
	t.Helper()
	v := resolver.View{Service: "web", Version: 7, Endpoints: eps, Zones: zones, GeneratedAt: time.Now(), Checksum: resolver.Checksum(eps)}
	s, err := resolver.SnapshotOf(v, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func traffic(w float64) *float64 { return &w }

// render is "zone:weight[address=status/weight ...]" per locality.
func render(t *testing.T, s *resolver.Snapshot) string {
	t.Helper()
	cla := xds.Assignment(s)
	var out []string
	for _, loc := range cla.GetEndpoints() {
		var eps []string
		for _, e := range loc.GetLbEndpoints() {
			a := e.GetEndpoint().GetAddress().GetSocketAddress()
			eps = append(eps, fmt.Sprintf("%s=%s/%d", a.GetAddress(), strings.ToLower(e.GetHealthStatus().String()), e.GetLoadBalancingWeight().GetValue()))
		}
		name := loc.GetLocality().GetZone()
		if sub := loc.GetLocality().GetSubZone(); sub != "" {
			// An endpoint's own locality: its instance id, shortened.
			name += "/" + strings.TrimLeft(sub[strings.LastIndex(sub, "-")+1:], "0")
		}
		out = append(out, fmt.Sprintf("%s:%d[%s]", name, loc.GetLoadBalancingWeight().GetValue(), strings.Join(eps, " ")))
	}
	return strings.Join(out, " ")
}

// TestAssignmentMapsMustersStates: the assignment holds exactly what the
// resolver routes to, with muster's states as health statuses and its
// weights scaled, and localities weighted as the resolver shares traffic.
func TestAssignmentMapsMustersStates(t *testing.T) {
	t.Parallel()
	ok := resolver.Zone{Guard: resolver.GuardOK}
	for _, tc := range []struct {
		name  string
		eps   []resolver.Endpoint
		zones map[string]resolver.Zone
		want  string
	}{{
		name: "states",
		eps: []resolver.Endpoint{
			ep("1", "az1", "eligible", "known", 1), ep("2", "az1", "degraded", "known", 0.5),
			ep("3", "az1", "eligible", "unknown", 1), ep("4", "az1", "ineligible", "known", 0),
			ep("5", "az1", "eligible", "known", 0.25), // ramping (slow start)
		},
		zones: map[string]resolver.Zone{"az1": ok},
		// Endpoints below the zone's top weight get localities of their
		// own, so gRPC (which ignores endpoint weights) weighs them too;
		// the localities are weighted ×10,000 once a zone is split.
		want: "az1:20000[10.0.0.1=healthy/100 10.0.0.3=unknown/100] az1/2:5000[10.0.0.2=degraded/50] az1/5:2500[10.0.0.5=healthy/25]",
	}, {
		name:  "every target degraded: published routable to gRPC",
		eps:   []resolver.Endpoint{ep("1", "az1", "degraded", "known", 1), ep("2", "az1", "degraded", "known", 1)},
		zones: map[string]resolver.Zone{"az1": ok},
		want:  "az1:200[10.0.0.1=unknown/100 10.0.0.2=unknown/100]",
	}, {
		name: "a tripped guard republishes the zone, health disregarded",
		eps: []resolver.Endpoint{ep("1", "az1", "eligible", "known", 1),
			{InstanceID: "00000000-0000-0000-0000-000000000002", Address: "10.0.0.2", Port: 80, Zone: "az1", State: "ineligible", Weight: 1, Health: "known"},
			{InstanceID: "00000000-0000-0000-0000-000000000003", Address: "10.0.0.3", Port: 80, Zone: "az1", State: "ineligible", Weight: 1, Health: "known", Quarantined: true}},
		zones: map[string]resolver.Zone{"az1": {Guard: resolver.GuardTripped}},
		want:  "az1:300[10.0.0.1=healthy/100 10.0.0.2=unknown/100 10.0.0.3=unknown/100]",
	}, {
		name:  "a zone stepping back gets its traffic weight's share",
		eps:   []resolver.Endpoint{ep("1", "az1", "eligible", "known", 1), ep("2", "az2", "eligible", "known", 1), ep("3", "az2", "eligible", "known", 1)},
		zones: map[string]resolver.Zone{"az1": ok, "az2": {Guard: resolver.GuardOK, TrafficWeight: traffic(0.1)}},
		want:  "az1:100[10.0.0.1=healthy/100] az2:20[10.0.0.2=healthy/100 10.0.0.3=healthy/100]",
	}, {
		name:  "a drained zone is absent",
		eps:   []resolver.Endpoint{ep("1", "az1", "eligible", "known", 1), ep("2", "az2", "eligible", "known", 1)},
		zones: map[string]resolver.Zone{"az1": ok, "az2": {Guard: resolver.GuardOK, TrafficWeight: traffic(0)}},
		want:  "az1:100[10.0.0.1=healthy/100]",
	}, {
		name:  "every zone drained: equal weights, muster never stops traffic",
		eps:   []resolver.Endpoint{ep("1", "az1", "eligible", "known", 1), ep("2", "az2", "eligible", "known", 1)},
		zones: map[string]resolver.Zone{"az1": {Guard: resolver.GuardOK, TrafficWeight: traffic(0)}, "az2": {Guard: resolver.GuardOK, TrafficWeight: traffic(0)}},
		want:  "az1:100[10.0.0.1=healthy/100] az2:100[10.0.0.2=healthy/100]",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := render(t, snapshot(t, tc.eps, tc.zones)); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// regionSnapshot is a view of service at version with one eligible
// endpoint per address, in zone, served as region's series when region
// is not empty (Service "web@b", every endpoint's Region set).
func regionSnapshot(t *testing.T, region string, version uint64, zone string, ids ...string) *resolver.Snapshot {
	t.Helper()
	name := "web"
	if region != "" {
		name = resolver.RemoteSeries("web", region)
	}
	var eps []resolver.Endpoint
	for _, id := range ids {
		e := ep(id, zone, "eligible", "known", 1)
		e.Region = region
		eps = append(eps, e)
	}
	v := resolver.View{Service: name, Version: version, Endpoints: eps, Region: region,
		Zones: map[string]resolver.Zone{zone: {Guard: resolver.GuardOK}}, GeneratedAt: time.Now(), Checksum: resolver.Checksum(eps)}
	s, err := resolver.SnapshotOf(v, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// renderPriorities is "p<priority>:<region>/<zone>[addresses]" per
// locality.
func renderPriorities(t *testing.T, local *resolver.Snapshot, remotes ...xds.Tier) (string, string) {
	t.Helper()
	cla, version := xds.Priorities("web", "a", local, remotes)
	if cla.GetClusterName() != "web" {
		t.Errorf("cluster name %q, want web", cla.GetClusterName())
	}
	var out []string
	for _, loc := range cla.GetEndpoints() {
		var addrs []string
		for _, e := range loc.GetLbEndpoints() {
			addrs = append(addrs, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
		}
		out = append(out, fmt.Sprintf("p%d:%s/%s[%s]", loc.GetPriority(), loc.GetLocality().GetRegion(), loc.GetLocality().GetZone(), strings.Join(addrs, " ")))
	}
	return strings.Join(out, " "), version
}

// TestPrioritiesAcrossRegions (issue 29): the local view's localities
// are priority 0, each peer region's the next, in the order given, with
// no gap where a region holds nothing routable; a service held only by
// peer regions starts at 0; the version is the local view's alone
// without a peer's part, and otherwise changes with any series and is
// the same for the same inputs.
func TestPrioritiesAcrossRegions(t *testing.T) {
	t.Parallel()
	local := regionSnapshot(t, "", 7, "az1", "1", "2")
	b := xds.Tier{Region: "b", Snapshot: regionSnapshot(t, "b", 40, "bz1", "11")}
	c := xds.Tier{Region: "c", Snapshot: regionSnapshot(t, "c", 90, "cz2", "21", "22")}
	emptyB := xds.Tier{Region: "b", Snapshot: regionSnapshot(t, "b", 41, "bz1")}

	for _, tc := range []struct {
		name    string
		local   *resolver.Snapshot
		remotes []xds.Tier
		want    string
	}{
		{"local only", local, nil, "p0:a/az1[10.0.0.1 10.0.0.2]"},
		{"local and two regions", local, []xds.Tier{b, c}, "p0:a/az1[10.0.0.1 10.0.0.2] p1:b/bz1[10.0.0.11] p2:c/cz2[10.0.0.21 10.0.0.22]"},
		{"the order given", local, []xds.Tier{c, b}, "p0:a/az1[10.0.0.1 10.0.0.2] p1:c/cz2[10.0.0.21 10.0.0.22] p2:b/bz1[10.0.0.11]"},
		{"a middle region with nothing leaves no gap", local, []xds.Tier{emptyB, c}, "p0:a/az1[10.0.0.1 10.0.0.2] p1:c/cz2[10.0.0.21 10.0.0.22]"},
		{"remote only starts at 0", nil, []xds.Tier{b, c}, "p0:b/bz1[10.0.0.11] p1:c/cz2[10.0.0.21 10.0.0.22]"},
		{"local withdrawn: the first region is 0", regionSnapshot(t, "", 8, "az1"), []xds.Tier{b}, "p0:b/bz1[10.0.0.11]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := renderPriorities(t, tc.local, tc.remotes...); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}

	// Versions.
	version := func(local *resolver.Snapshot, remotes ...xds.Tier) string {
		_, v := renderPriorities(t, local, remotes...)
		return v
	}
	if v := version(local); v != "7" {
		t.Errorf("local only: version %q, want the view's, 7", v)
	}
	if v := version(local, emptyB); v != "7" {
		t.Errorf("a region with nothing to route to: version %q, want the local view's, 7", v)
	}
	both := version(local, b, c)
	if !strings.HasPrefix(both, "7.") {
		t.Errorf("local and regions: version %q, want it to lead with the local view's, 7.", both)
	}
	again := version(regionSnapshot(t, "", 7, "az1", "1", "2"), xds.Tier{Region: "b", Snapshot: regionSnapshot(t, "b", 40, "bz1", "11")},
		xds.Tier{Region: "c", Snapshot: regionSnapshot(t, "c", 90, "cz2", "21", "22")})
	if again != both {
		t.Errorf("equal inputs, versions %q and %q", both, again)
	}
	changedC := version(local, b, xds.Tier{Region: "c", Snapshot: regionSnapshot(t, "c", 91, "cz2", "21")})
	changedLocal := version(regionSnapshot(t, "", 9, "az1", "1"), b, c)
	reordered := version(local, c, b)
	remoteOnly := version(nil, b, c)
	seen := map[string]string{}
	for name, v := range map[string]string{"both": both, "c changed": changedC, "local changed": changedLocal, "reordered": reordered, "remote only": remoteOnly} {
		if other, dup := seen[v]; dup {
			t.Errorf("%s and %s share version %q", name, other, v)
		}
		seen[v] = name
	}
}

// drainedSnapshot is regionSnapshot with its zone at traffic weight w (a
// region shift at that step).
func drainedSnapshot(t *testing.T, region string, version uint64, zone string, w float64, ids ...string) *resolver.Snapshot {
	t.Helper()
	s := regionSnapshot(t, region, version, zone, ids...)
	v := s.View()
	z := v.Zones[zone]
	z.TrafficWeight = &w
	v.Zones = map[string]resolver.Zone{zone: z}
	out, err := resolver.SnapshotOf(v, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestARegionDrainInPriorities (issue 29): a region drain (every local
// zone at traffic weight 0, as the routing control turning the region off
// publishes it) puts the peer regions first and the local localities
// last (still there); while it steps back, priority 0 blends the local
// localities, weighted to the step, with the first peer's; a peer region
// drained itself is no fallback.
func TestARegionDrainInPriorities(t *testing.T) {
	t.Parallel()
	b := xds.Tier{Region: "b", Snapshot: regionSnapshot(t, "b", 40, "bz1", "11")}
	drained := drainedSnapshot(t, "", 7, "az1", 0, "1", "2")
	if got, v := renderPriorities(t, drained, b); got != "p0:b/bz1[10.0.0.11] p1:a/az1[10.0.0.1 10.0.0.2]" || !strings.HasPrefix(v, "7.") {
		t.Errorf("a drained: %s (version %s)", got, v)
	}
	// b drained too: nothing to move to, a stays first.
	bOff := xds.Tier{Region: "b", Snapshot: drainedSnapshot(t, "b", 41, "bz1", 0, "11")}
	if got, _ := renderPriorities(t, drained, bOff); got != "p0:a/az1[10.0.0.1 10.0.0.2]" {
		t.Errorf("a and b drained: %s", got)
	}
	// Stepping back: 0.25 of the locality weight is a's.
	step := drainedSnapshot(t, "", 8, "az1", 0.25, "1", "2")
	cla, v := xds.Priorities("web", "a", step, []xds.Tier{b})
	var local, remote float64
	for _, loc := range cla.GetEndpoints() {
		if loc.GetPriority() != 0 {
			t.Fatalf("a blended locality at priority %d", loc.GetPriority())
		}
		w := float64(loc.GetLoadBalancingWeight().GetValue())
		if loc.GetLocality().GetRegion() == "a" {
			local += w
		} else {
			remote += w
		}
	}
	if share := local / (local + remote); share < 0.24 || share > 0.26 {
		t.Errorf("a's share of the locality weight at step 0.25: %.3f", share)
	}
	if _, v2 := xds.Priorities("web", "a", drainedSnapshot(t, "", 8, "az1", 0.5, "1", "2"), []xds.Tier{b}); v2 == v {
		t.Errorf("steps 0.25 and 0.50 share the version %s", v)
	}
}
