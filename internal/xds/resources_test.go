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
		out = append(out, fmt.Sprintf("%s:%d[%s]", loc.GetLocality().GetZone(), loc.GetLoadBalancingWeight().GetValue(), strings.Join(eps, " ")))
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
		want:  "az1:275[10.0.0.1=healthy/100 10.0.0.2=degraded/50 10.0.0.3=unknown/100 10.0.0.5=healthy/25]",
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
