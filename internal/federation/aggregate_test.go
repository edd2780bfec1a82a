package federation

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/testclock"
	"github.com/musterhq/muster/resolver"
)

func ep(id, addr string, port int) resolver.Endpoint {
	return resolver.Endpoint{InstanceID: id, Address: addr, Port: port, Zone: "az1", State: "eligible", Weight: 1, Health: resolver.HealthKnown}
}

func view(service string, version uint64, eps ...resolver.Endpoint) resolver.View {
	return resolver.View{Service: service, Version: version, Endpoints: eps}
}

// TestDiffComparesVersions: the same version is the same view whatever
// the times say; a new version is counted endpoint by endpoint; services
// that appear and vanish are named.
func TestDiffComparesVersions(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	same := view("search", 7, ep("1", "10.0.0.1", 80))
	sameLater := same
	sameLater.GeneratedAt = t0.Add(time.Hour) // a timestamp alone changes nothing
	changedEp := ep("2", "10.0.0.2", 80)
	changedEp.State = "ineligible"
	old := map[string]resolver.View{
		"billing": view("billing", 10, ep("1", "10.0.0.1", 80), ep("2", "10.0.0.2", 80), ep("3", "10.0.0.3", 80)),
		"search":  same,
		"legacy":  view("legacy", 3, ep("9", "10.0.0.9", 80)),
		"ledger":  view("ledger", 50, ep("5", "10.0.0.5", 80)),
	}
	next := map[string]resolver.View{
		"billing": view("billing", 14, ep("1", "10.0.0.1", 80), changedEp, ep("4", "10.0.0.4", 80)),
		"search":  sameLater,
		"fraud":   view("fraud", 2, ep("7", "10.0.0.7", 80), ep("8", "10.0.0.8", 80)),
		"ledger":  view("ledger", 40, ep("5", "10.0.0.5", 81)),
	}
	got := Diff(old, next)
	want := Reconciliation{
		Services: []ServiceChange{
			{Service: "billing", Change: ChangeChanged, OldVersion: 10, NewVersion: 14, EndpointsAdded: 1, EndpointsRemoved: 1, EndpointsChanged: 1},
			{Service: "fraud", Change: ChangeAppeared, NewVersion: 2, EndpointsAdded: 2},
			{Service: "ledger", Change: ChangeRegressed, OldVersion: 50, NewVersion: 40, EndpointsChanged: 1},
			{Service: "legacy", Change: ChangeVanished, OldVersion: 3, EndpointsRemoved: 1},
		},
		Changed: 2, Appeared: 1, Vanished: 1, Unchanged: 1,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("Diff (-want +got):\n%s", d)
	}
	if got := Diff(old, old); got.Unchanged != 4 || len(got.Services) != 0 || got.Services == nil {
		t.Fatalf("Diff of a copy with itself: %+v", got)
	}
}

// TestAggregateTakesNewerVersionsAndReplacesOnHeal: put keeps the newest
// version only (an older one arriving late changes nothing); replace
// swaps the region's whole copy, dropping what the peer no longer has,
// and says what changed; other regions are untouched.
func TestAggregateTakesNewerVersionsAndReplacesOnHeal(t *testing.T) {
	clk := testclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	a := NewAggregate([]PeerConfig{{Name: "b", URLs: []string{"http://b"}}, {Name: "c", URLs: []string{"http://c"}}}, 30*time.Second, clk.Now)
	rv := func(region string, v resolver.View) RemoteView {
		return RemoteView{Region: region, View: v, ReceivedAt: clk.Now()}
	}
	if !a.put(rv("b", view("billing", 5, ep("1", "10.0.0.1", 80)))) || !a.put(rv("b", view("fraud", 3))) || !a.put(rv("c", view("billing", 99))) {
		t.Fatal("first views not taken")
	}
	if a.put(rv("b", view("billing", 4))) || a.put(rv("b", view("billing", 5))) {
		t.Fatal("an older or equal version was taken")
	}
	if a.put(rv("zz", view("billing", 1))) {
		t.Fatal("a view of an unknown region was taken")
	}
	a.update("b", func(ps *PeerStatus) { ps.LastContact = clk.Now() })
	clk.Advance(2 * time.Second)
	v, age, ok := a.View("b", "billing")
	if !ok || v.View.Version != 5 || age != 2*time.Second {
		t.Fatalf("View(b, billing) = %+v, %s, %v", v, age, ok)
	}
	if _, _, ok := a.View("b", "nope"); ok {
		t.Fatal("a view of a service never received")
	}
	rec := a.replace("b", []RemoteView{rv("b", view("billing", 8, ep("1", "10.0.0.1", 80), ep("2", "10.0.0.2", 80)))})
	if rec.Region != "b" || rec.Changed != 1 || rec.Vanished != 1 || rec.Services[0].EndpointsAdded != 1 || rec.Services[1].Service != "fraud" {
		t.Fatalf("replace: %+v", rec)
	}
	if got := a.Services("b"); !cmp.Equal(got, []string{"billing"}) {
		t.Fatalf("services of b after the heal: %v", got)
	}
	if v, _, _ := a.View("c", "billing"); v.View.Version != 99 {
		t.Fatalf("region c touched by b's heal: %+v", v)
	}
	if !strings.Contains(rec.Summary(), "1 services changed, 0 appeared, 1 vanished") {
		t.Fatalf("summary: %s", rec.Summary())
	}
}

// TestAggregateStaleness: a region never reached goes stale StaleAfter
// after the start, one reached goes stale StaleAfter after the last
// contact; peer_stale names it with its age and says local resolution
// is unaffected; a contact closes it.
func TestAggregateStaleness(t *testing.T) {
	clk := testclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	a := NewAggregate([]PeerConfig{{Name: "b", URLs: []string{"http://b"}}, {Name: "c", URLs: []string{"http://c"}}}, 30*time.Second, clk.Now)
	a.update("c", func(ps *PeerStatus) {
		ps.LastContact = clk.Now().Add(10 * time.Second)
		ps.LastError = "dial tcp: refused"
	})
	clk.Advance(31 * time.Second)
	al := a.Alarms()
	if len(al) != 1 || al[0].Kind != AlarmPeerStale || !strings.Contains(al[0].Detail, "peer region b") || !strings.Contains(al[0].Detail, "never reached") ||
		!strings.Contains(al[0].Detail, "own resolution is unaffected") {
		t.Fatalf("alarms at 31 s: %+v", al)
	}
	clk.Advance(10 * time.Second)
	st := a.Regions()
	if len(st) != 2 || !st[0].Stale || !st[1].Stale || st[1].AgeSeconds != 31 || st[0].AgeSeconds != 41 {
		t.Fatalf("regions at 41 s: %+v", st)
	}
	al = a.Alarms()
	if len(al) != 2 || !strings.Contains(al[1].Detail, "for 31s") || !strings.Contains(al[1].Detail, "dial tcp: refused") {
		t.Fatalf("alarms at 41 s: %+v", al)
	}
	a.update("b", func(ps *PeerStatus) { ps.LastContact = clk.Now() })
	a.update("c", func(ps *PeerStatus) { ps.LastContact = clk.Now() })
	if al := a.Alarms(); len(al) != 0 {
		t.Fatalf("alarms after contact: %+v", al)
	}
}
