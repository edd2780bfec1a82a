package tgsync

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/musterhq/muster/internal/tgsync/haproxytest"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// served lists the backends that answered, sorted.
func served(spread map[string]int) []string {
	return slices.Sorted(maps.Keys(spread))
}

// TestHAProxyRoutesExactlyTheView drives a real haproxy in front of four
// real backends through the Runtime API, and checks by sending requests
// through it where traffic goes: all four, then not the withdrawn one,
// then (its zone's guard tripped) all four again, then a drained zone
// leaving one target per interval (the cap), and a weight change.
func TestHAProxyRoutesExactlyTheView(t *testing.T) {
	t.Parallel()
	hp := haproxytest.Start(t, haproxytest.Options{Slots: 8, Extra: []string{"server static 127.0.0.1:1 disabled"}})
	var bes []*haproxytest.Backend
	var eps []ep
	for i, zone := range []string{"az1", "az1", "az2", "az2"} {
		b := haproxytest.NewBackend(t, "b"+string(rune('0'+i)))
		bes = append(bes, b)
		eps = append(eps, ep{addr: b.Addr, port: b.Port, zone: zone})
	}
	clk := &clock{now: t0}
	src := newCacheSource(t, clk.Now, time.Minute, "web")
	reg := prometheus.NewRegistry()
	hb := NewHAProxy(HAProxyTarget{Socket: hp.Socket, Backend: "web"})
	s, err := NewSyncer(SyncerConfig{Source: src, Clock: clk.Now, Registerer: reg, Interval: 30 * time.Second, Bindings: []Bound{{
		Binding: Binding{Name: "edge", Service: "web", HAProxy: &HAProxyTarget{Socket: hp.Socket, Backend: "web"},
			Policy: Policy{MaxDeregisterFraction: 0.1, AddStepFraction: 0.25}},
		Backend: hb,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if reps := s.RunOnce(context.Background()); reps[0].Err == nil || reps[0].Version != 0 {
		t.Fatalf("no view yet: %+v", reps[0])
	}
	if got := hp.Spread(4); got["503"] != 4 {
		t.Fatalf("before any view haproxy has no server: %v", got)
	}

	if err := src.apply(viewOf("web", 1, eps, nil)); err != nil {
		t.Fatal(err)
	}
	mustSync(t, s)
	if got := served(hp.Spread(200)); !slices.Equal(got, []string{"b0", "b1", "b2", "b3"}) {
		t.Fatalf("v1, all eligible: traffic reached %v", got)
	}

	// b0 withdrawn: it gets nothing from the next request on.
	eps[0].state = resolver.StateIneligible
	if err := src.apply(viewOf("web", 2, eps, nil)); err != nil {
		t.Fatal(err)
	}
	mustSync(t, s)
	if got := served(hp.Spread(200)); !slices.Equal(got, []string{"b1", "b2", "b3"}) {
		t.Fatalf("v2, b0 withdrawn: traffic reached %v", got)
	}

	// az1's guard tripped: its full set is published, b0 included (at
	// the start of its slow start).
	eps[0].weight = 0.1
	two := 2
	if err := src.apply(viewOf("web", 3, eps, map[string]resolver.Zone{
		"az1": {Guard: resolver.GuardTripped, Eligible: 1, Total: 2, MinHealthyFraction: 0.75, Registered: &two},
	})); err != nil {
		t.Fatal(err)
	}
	mustSync(t, s)
	if got := served(hp.Spread(200)); !slices.Equal(got, []string{"b0", "b1", "b2", "b3"}) {
		t.Fatalf("v3, az1 tripped: traffic reached %v", got)
	}

	// az2 drained (traffic weight 0): two of four leave, one per
	// interval (10% of 4, at least 1).
	eps[0].state, eps[0].weight = "", 1
	clk.Advance(30 * time.Second) // past the interval of b0's withdrawal
	if err := src.apply(viewOf("web", 4, eps, map[string]resolver.Zone{
		"az2": {Guard: resolver.GuardOK, Eligible: 2, Total: 2, MinHealthyFraction: 0.5, Registered: &two, TrafficWeight: ptr(0.0)},
	})); err != nil {
		t.Fatal(err)
	}
	rep := mustSync(t, s)[0]
	if len(rep.Plan.Deregister) != 1 || len(rep.Plan.DeferredDeregister) != 1 {
		t.Fatalf("v4: plan %s", rep.Plan.Describe())
	}
	if got := served(hp.Spread(200)); len(got) != 3 || !slices.Contains(got, "b0") || !slices.Contains(got, "b1") {
		t.Fatalf("v4 first cycle: traffic reached %v", got)
	}
	if v := testutil.ToFloat64(s.m.pendingDeregs.WithLabelValues("edge")); v != 1 {
		t.Errorf("pending deregistrations metric %v, want 1", v)
	}
	mustSync(t, s) // within the interval: the budget is spent
	if got := served(hp.Spread(100)); len(got) != 3 {
		t.Fatalf("v4 same interval: traffic reached %v", got)
	}
	clk.Advance(30 * time.Second)
	mustSync(t, s)
	if got := served(hp.Spread(200)); !slices.Equal(got, []string{"b0", "b1"}) {
		t.Fatalf("v4 next interval: traffic reached %v", got)
	}

	// A weight muster ramps (slow start) is HAProxy's weight.
	eps[1].weight = 0.5
	if err := src.apply(viewOf("web", 5, eps, map[string]resolver.Zone{
		"az2": {Guard: resolver.GuardOK, Eligible: 2, Total: 2, MinHealthyFraction: 0.5, Registered: &two, TrafficWeight: ptr(0.0)},
	})); err != nil {
		t.Fatal(err)
	}
	mustSync(t, s)
	servers, err := hb.Servers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	weights := map[int]int{}
	for _, sv := range servers {
		if sv.Name == "static" && !sv.Maint() {
			t.Errorf("the static server was touched: %+v", sv)
		}
		if !sv.Maint() {
			weights[sv.Port] = sv.Weight
		}
	}
	if weights[bes[0].Port] != 100 || weights[bes[1].Port] != 50 || len(weights) != 2 {
		t.Errorf("weights by port %v (b0 %d, b1 %d): want b0 100, b1 50", weights, bes[0].Port, bes[1].Port)
	}
	if n := testutil.ToFloat64(s.m.changes.WithLabelValues("edge", "deregister")); n != 3 {
		t.Errorf("deregistrations counted %v, want 3", n)
	}
	out, err := testutil.GatherAndCount(reg, "muster_tgsync_last_sync_age_seconds")
	if err != nil || out != 1 {
		t.Errorf("last sync age: %d %v", out, err)
	}
}

// TestHAProxyPoolExhausted: more targets than slots fills the pool, says
// so, and keeps the rest for when slots free up.
func TestHAProxyPoolExhausted(t *testing.T) {
	t.Parallel()
	hp := haproxytest.Start(t, haproxytest.Options{Slots: 2})
	hb := NewHAProxy(HAProxyTarget{Socket: hp.Socket, Backend: "web"})
	var ws []Want
	for i := range 3 {
		b := haproxytest.NewBackend(t, "b"+string(rune('0'+i)))
		ws = append(ws, Want{Key: Key{Addr: b.Addr, Port: b.Port}, Weight: 100})
	}
	err := hb.Register(context.Background(), ws)
	if err == nil || !strings.Contains(err.Error(), "1 targets wait for a free slot (the pool has 2)") {
		t.Fatalf("register 3 into 2 slots: %v", err)
	}
	g, err := hb.State(context.Background())
	if err != nil || len(g.Targets) != 2 {
		t.Fatalf("state: %+v %v", g, err)
	}
	if err := hb.Deregister(context.Background(), []Have{{Slot: "static"}}); err == nil {
		t.Fatal("deregistered a server outside the pool")
	}
}

// TestParseServersState: the format-1 table, and what is not it.
func TestParseServersState(t *testing.T) {
	out := "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n" +
		"3 web 2 slot1 127.0.0.1 2 4 50 1 0 1 0 0 8 0 0 0 - 18001 - 0 0 - - 0\n" +
		"3 web 3 slot2 0.0.0.0 0 5 1 1 6 1 0 0 8 0 0 0 - 0 - 0 0 - - 0\n"
	got, err := parseServersState(out, "web")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Maint() || !got[1].Maint() || got[0].Weight != 50 || got[0].Port != 18001 {
		t.Fatalf("parsed %+v", got)
	}
	for _, bad := range []string{"", "Can't find backend.\n", "2\n", "1\n3 api 2 slot1 127.0.0.1 2 4 50 1 0 1 0 0 8 0 0 0 - 18001 - 0 0 - - 0\n"} {
		if _, err := parseServersState(bad, "web"); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

// FuzzParseServersState: whatever the Runtime API answers, the parser
// neither panics nor returns a server without a name.
func FuzzParseServersState(f *testing.F) {
	f.Add("1\n# be_id be_name srv_id srv_name srv_addr\n3 web 2 slot1 127.0.0.1 2 4 50 1 0 1 0 0 8 0 0 0 - 18001 - 0 0 - - 0\n")
	f.Add("Can't find backend.\n")
	f.Add("1\n3 web 2 slot1 127.0.0.1 x 4 50 1 0 1 0 0 8 0 0 0 - 18001 - 0 0 - - 0\n")
	f.Fuzz(func(t *testing.T, out string) {
		servers, err := parseServersState(out, "web")
		if err != nil {
			return
		}
		for _, s := range servers {
			if s.Name == "" {
				t.Fatalf("a server without a name from %q", out)
			}
		}
	})
}

// TestSyncerLoopFollowsViewChanges: the running loop reconciles on a view
// change (its interval is an hour, so only the change can wake it), and
// Stop is safe twice.
func TestSyncerLoopFollowsViewChanges(t *testing.T) {
	t.Parallel()
	hp := haproxytest.Start(t, haproxytest.Options{Slots: 4})
	be := haproxytest.NewBackend(t, "b0")
	src := newCacheSource(t, time.Now, time.Minute, "web")
	s, err := NewSyncer(SyncerConfig{Source: src, Interval: time.Hour, Bindings: []Bound{{
		Binding: Binding{Name: "edge", Service: "web", HAProxy: &HAProxyTarget{Socket: hp.Socket, Backend: "web"},
			Policy: Policy{MaxDeregisterFraction: 0.1, AddStepFraction: 0.25}},
		Backend: NewHAProxy(HAProxyTarget{Socket: hp.Socket, Backend: "web"}),
	}}})
	if err != nil {
		t.Fatal(err)
	}
	s.Stop() // before Start: nothing to stop
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if err := src.apply(viewOf("web", 1, []ep{{addr: be.Addr, port: be.Port, zone: "az1"}}, nil)); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the loop registering b0 after the view change", func() bool {
		return hp.Spread(2)["b0"] == 2
	})
	s.Stop()
	s.Stop()
}
