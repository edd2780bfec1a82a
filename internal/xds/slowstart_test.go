package xds_test

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds/xdstest"
	"github.com/musterhq/muster/resolver"
)

// TestGRPCClientFollowsSlowStart: a grpc-go client dialling xds:///web
// through grpc-go's own xDS resolver and balancers (round robin within a
// locality, endpoint weights ignored) sends a new instance, ramping
// through slow start beside two instances of its zone and two of another
// at full weight, the share its published weight gives it at every step
// of the ramp, within ±5 percentage points over 2,000 calls. Before,
// the client gave it a third of its zone's calls from the first step.
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
	var last map[string]int // the last tally taken, shown should the test fail
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last %d calls: %v", calls, last)
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
		within := func(got map[string]int) bool {
			sum := 0
			for _, b := range all {
				sum += got[b]
			}
			return sum == calls && math.Abs(float64(got["n1"])/calls-want) <= 0.05
		}
		wait.For(t, 10*time.Second, fmt.Sprintf("n1 at weight %v taking %.3f of the calls", w, want), func() bool {
			last = xdstest.Tally(t.Context(), conn, calls)
			return within(last)
		})
		// Measured afresh, once the client has settled.
		got := xdstest.Tally(t.Context(), conn, calls)
		if !within(got) {
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
