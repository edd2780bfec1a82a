package xds_test

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds"
	"github.com/musterhq/muster/internal/xds/xdstest"
	"github.com/musterhq/muster/resolver"
)

// TestGRPCClientFollowsSlowStart: a grpc-go client dialling xds:///web
// through grpc-go's own xDS resolver and balancers (round robin within a
// locality, endpoint weights ignored) sends a new instance, ramping
// through slow start beside two instances of its zone and two of another
// at full weight, the share its published weight gives it at every step
// of the ramp, within ±5 percentage points over 2,000 calls; the
// assignment a delta client (as Envoy) holds at each step gives every
// endpoint the resolver's share under Envoy's semantics and gRPC's alike.
// Before, the client gave it a third of its zone's calls (17%, for its
// 2.4%) from the first step.
func TestGRPCClientFollowsSlowStart(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string][]string{"az1": {"a1", "a2"}, "az2": {"b1", "b2"}})
	old := []string{"a1", "a2", "b1", "b2"}

	view := func() (resolver.View, *resolver.Snapshot) {
		t.Helper()
		f, ok := e.Hub.View("web")
		if !ok {
			t.Fatal("no view of web")
		}
		var v resolver.View
		if err := json.Unmarshal(f.JSON, &v); err != nil {
			t.Fatal(err)
		}
		s, err := resolver.SnapshotOf(v, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return v, s
	}
	weight := func(id string) float64 {
		v, _ := view()
		for _, ep := range v.Endpoints {
			if ep.InstanceID == e.ids[id] {
				return ep.Weight
			}
		}
		return 0
	}
	// step moves the stack's clock a slow-start step on, the prober
	// reporting every backend healthy meanwhile, and publishes.
	step := func(backends ...string) {
		e.Clock.Advance(5 * time.Second) // publish adds 1.1 s: a step is 6 s
		e.report("success", backends...)
		e.publish()
	}
	// The first instances ramp together (one weight per zone: one
	// locality each, as ever); take them to full weight.
	for i := 0; weight("a1") < 1 || weight("b2") < 1; i++ {
		if i == 20 {
			t.Fatalf("the first instances never reached full weight: a1 at %v", weight("a1"))
		}
		step(old...)
	}

	conn := xdstest.Dial(t, e.XDSAddr, e.Token(t, apptest.Web), "web")
	only(t, conn, 30*time.Second, 200, old...)

	delta := openDelta(t, rawConn(t, e.XDSAddr, e.Token(t, apptest.Web)))
	delta.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}})

	// A new instance in az1, admitted by its first success.
	n := xdstest.StartBackend(t, "n1")
	in, err := e.Registry.Register(t.Context(), admin, netip.Addr{}, "web", registry.Registration{Address: "127.0.0.1", Port: n.Addr.Port, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	e.backends["n1"], e.ids["n1"] = n, in.ID.String()
	if err := e.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	all := append(old, "n1")
	e.report("success", all...)
	e.publish()

	const calls = 2000
	var last map[string]int // the last calls' tally, shown should the test fail
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last calls: %v", last)
		}
	})
	table := []string{"weight  published share  measured share"}
	var ramped []float64
	for i := 0; ; i++ {
		if i == 40 {
			t.Fatalf("n1 never reached full weight: at %v", weight("n1"))
		}
		w := weight("n1")
		if len(ramped) > 0 && w == ramped[len(ramped)-1] {
			step(all...)
			continue
		}
		ramped = append(ramped, w)
		v, s := view()
		var total, mine float64
		for _, target := range s.Targets() {
			total += target.Share
			if target.InstanceID == e.ids["n1"] {
				mine = target.Share
			}
		}
		want := mine / total
		// What a delta client (Envoy) holds: each endpoint's chance under
		// Envoy's semantics (locality share × endpoint share) and gRPC's
		// (locality share ÷ endpoints) is the resolver's share.
		cla := assignmentAt(delta, v.Version)
		wants := map[uint32]float64{}
		for _, target := range s.Targets() {
			wants[uint32(target.Port)] += target.Share / total
		}
		for _, envoy := range []bool{true, false} {
			got := chances(cla, envoy)
			for port, p := range wants {
				if math.Abs(got[port]-p) > 1e-3 {
					t.Errorf("n1 at weight %v: the delta client's assignment gives port %d %.4f (Envoy's semantics: %v), want %.4f", w, port, got[port], envoy, p)
				}
			}
			if len(got) != len(wants) {
				t.Errorf("n1 at weight %v: the delta client's assignment holds %d endpoints, the view routes to %d", w, len(got), len(wants))
			}
		}
		// The client holds the step once it has ACKed its assignment;
		// its balancers take it up right after, so poll a little.
		lead := fmt.Sprintf("%d.", v.Version)
		wait.For(t, 10*time.Second, "the client ACKing view "+lead, func() bool {
			acked := e.XDS.AckedAssignments()
			for _, a := range acked {
				if !strings.HasPrefix(a, lead) {
					return false
				}
			}
			return len(acked) > 0
		})
		within := func(got map[string]int, n int) bool {
			sum := 0
			for _, b := range all {
				sum += got[b]
			}
			return sum == n && math.Abs(float64(got["n1"])/float64(n)-want) <= 0.05
		}
		wait.For(t, 10*time.Second, fmt.Sprintf("n1 at weight %v taking %.3f of the calls", w, want), func() bool {
			last = xdstest.Tally(t.Context(), conn, calls/4)
			return within(last, calls/4)
		})
		// Measured afresh, once the client has settled.
		got := xdstest.Tally(t.Context(), conn, calls)
		if last = got; !within(got, calls) {
			t.Errorf("n1 at weight %v: %d of %d calls (%.3f), want %.3f ± 0.05: %v", w, got["n1"], calls, float64(got["n1"])/calls, want, got)
		}
		table = append(table, fmt.Sprintf("%6.2f  %15.3f  %14.3f", w, want, float64(got["n1"])/calls))
		if w >= 1 {
			break
		}
		step(all...)
	}
	t.Logf("n1's share of %d calls at each step of its ramp:\n%s", calls, strings.Join(table, "\n"))
	if len(ramped) < 5 || ramped[0] >= 0.5 {
		t.Errorf("the ramp went %v: want it to start low and take several steps", ramped)
	}
}

// assignmentAt receives on d until it holds web's assignment of the view
// version (or newer), and returns it.
func assignmentAt(d *deltaStream, version uint64) *endpoint.ClusterLoadAssignment {
	d.t.Helper()
	for {
		r := d.recv()
		for _, res := range r.GetResources() {
			lead, _, _ := strings.Cut(res.GetVersion(), ".")
			if v, err := strconv.ParseUint(lead, 10, 64); err != nil || res.GetName() != "web" || v < version {
				continue
			}
			cla := &endpoint.ClusterLoadAssignment{}
			if err := res.GetResource().UnmarshalTo(cla); err != nil {
				d.t.Fatal(err)
			}
			return cla
		}
	}
}

// chances is each endpoint's (port's) chance of a call at priority 0,
// as Envoy (endpoint weights) or gRPC (round robin within a locality)
// gives it.
func chances(cla *endpoint.ClusterLoadAssignment, envoy bool) map[uint32]float64 {
	return xds.ChancesByPort(cla, envoy)
}
