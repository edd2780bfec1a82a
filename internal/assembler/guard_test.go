package assembler_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/assembler"
)

// A bad health-check rollout makes every instance of zone a ineligible: the
// guard trips for zone a only, publishes its full set with each endpoint's
// own state, raises fraction_guard, and clears it when the zone recovers.
func TestBadHealthCheckRolloutTripsOneZone(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	healthy := zoned(0, elig, 4, "a", "b", "c")
	a.Update(svc("web", 0.5, healthy), t0)
	settle(t, a, t0, vs)
	before := mustView(t, a, "web")

	now := t0.Add(2 * time.Hour)
	bad := set(healthy, inelg, 0, 1, 2, 3) // all of zone a
	a.Update(svc("web", 0.5, bad), now)

	want := []assembler.Alarm{{
		Kind: assembler.AlarmFractionGuard, Service: "web", Zone: "a", Since: now,
		Detail: "0 of 4 instances in rotation (0%), below the minimum healthy fraction 0.5: publishing all 4",
	}}
	if diff := cmp.Diff(want, a.Alarms()); diff != "" {
		t.Fatalf("alarms (-want +got):\n%s", diff)
	}
	// Nothing left the routing set, so nothing is a withdrawal.
	if got := drainAt(t, a, now.Add(50*time.Millisecond), vs); len(got) != 0 {
		t.Fatalf("published %d versions on the withdrawal window, want 0 (no withdrawal)", len(got))
	}
	pubs := drainAt(t, a, now.Add(time.Second), vs)
	if len(pubs) != 1 || pubs[0].Delta == nil || pubs[0].Delta.Withdrawal {
		t.Fatalf("want one addition delta, got %+v", pubs)
	}
	v := mustView(t, a, "web")
	wantZones := map[string]assembler.ZoneStatus{
		"a": {Guard: assembler.GuardTripped, Eligible: 0, Total: 4, Registered: 4, MinHealthyFraction: 0.5, TrafficWeight: 1},
		"b": {Guard: assembler.GuardOK, Eligible: 4, Total: 4, Registered: 4, MinHealthyFraction: 0.5, TrafficWeight: 1},
		"c": {Guard: assembler.GuardOK, Eligible: 4, Total: 4, Registered: 4, MinHealthyFraction: 0.5, TrafficWeight: 1},
	}
	if diff := cmp.Diff(wantZones, v.Zones); diff != "" {
		t.Errorf("zones (-want +got):\n%s", diff)
	}
	if len(v.Endpoints) != 12 {
		t.Fatalf("published %d endpoints, want all 12", len(v.Endpoints))
	}
	old := byID(before)
	for _, e := range v.Endpoints {
		switch e.Zone {
		case "a":
			if e.State != "ineligible" || e.Weight != assembler.TrippedWeight {
				t.Errorf("zone a endpoint %v: state %s weight %g, want its own state ineligible at weight %g", e.InstanceID, e.State, e.Weight, assembler.TrippedWeight)
			}
		default:
			if diff := cmp.Diff(old[e.InstanceID], e); diff != "" {
				t.Errorf("zone %s endpoint changed (-before +after):\n%s", e.Zone, diff)
			}
		}
	}
	if d := pubs[0].Delta; len(d.Upserts) != 4 || len(d.Removals) != 0 || len(d.Zones) != 1 {
		t.Errorf("delta carries %d upserts, %d removals, zones %v; want the 4 zone-a endpoints and zone a", len(d.Upserts), len(d.Removals), d.Zones)
	}

	// The health check is fixed.
	later := now.Add(time.Minute)
	a.Update(svc("web", 0.5, healthy), later)
	if got := a.Alarms(); len(got) != 0 {
		t.Fatalf("alarms after recovery: %+v", got)
	}
	settle(t, a, later, vs)
	v = mustView(t, a, "web")
	if v.Zones["a"].Guard != assembler.GuardOK || v.Checksum != before.Checksum {
		t.Errorf("after recovery: zone a %+v, checksum %s, want ok and the original %s", v.Zones["a"], v.Checksum, before.Checksum)
	}
}

// The guard per zone, on zone a, with zone b always healthy and unaffected.
func TestGuardTable(t *testing.T) {
	t.Parallel()
	type want struct {
		guard     string
		published int // endpoints of zone a in the view
		eligible  int
		states    map[int]string // instance -> published state
		weights   map[int]float64
		health    map[int]string
	}
	q := func(in assembler.InstanceInput) assembler.InstanceInput {
		in.Quarantined = true
		in.State = inelg
		in.Weight = 0
		return in
	}
	unknownHealth := func(in assembler.InstanceInput) assembler.InstanceInput {
		in.State, in.HealthKnown, in.Weight = unk, false, 0.7
		return in
	}
	tests := []struct {
		name string
		frac float64
		a    []assembler.InstanceInput
		want want
	}{
		{"all eligible", 0.5, zoned(0, elig, 4, "a"), want{guard: "ok", published: 4, eligible: 4}},
		{"one of four out", 0.5, set(zoned(0, elig, 4, "a"), inelg, 0), want{guard: "ok", published: 3, eligible: 3}},
		{"two of four out meets 0.5 exactly", 0.5, set(zoned(0, elig, 4, "a"), inelg, 0, 1), want{guard: "ok", published: 2, eligible: 2}},
		{"three of four out trips", 0.5, set(zoned(0, elig, 4, "a"), inelg, 0, 1, 2), want{
			guard: "tripped", published: 4, eligible: 1,
			states:  map[int]string{0: "ineligible", 1: "ineligible", 2: "ineligible", 3: "eligible"},
			weights: map[int]float64{0: 1, 3: 1},
		}},
		{"degraded and unknown are routable", 0.5, set(set(zoned(0, elig, 4, "a"), degr, 0), unk, 1, 2), want{
			guard: "ok", published: 4, eligible: 4,
			states: map[int]string{0: "degraded", 1: "unknown", 2: "unknown", 3: "eligible"},
		}},
		{"health unknown stays in rotation", 0.5, []assembler.InstanceInput{
			unknownHealth(inst(0, "a", 0)), unknownHealth(inst(1, "a", 0)), inst(2, "a", elig), inst(3, "a", elig),
		}, want{
			guard: "ok", published: 4, eligible: 4,
			states:  map[int]string{0: "unknown", 2: "eligible"},
			weights: map[int]float64{0: 0.7},
			health:  map[int]string{0: "unknown", 1: "unknown", 2: "known"},
		}},
		{"quarantined are out of rotation", 0.5, []assembler.InstanceInput{
			q(inst(0, "a", elig)), inst(1, "a", elig), inst(2, "a", elig), inst(3, "a", elig),
		}, want{guard: "ok", published: 3, eligible: 3}},
		{"quarantined are included in a tripped zone", 0.5, []assembler.InstanceInput{
			q(inst(0, "a", elig)), q(inst(1, "a", elig)), inst(2, "a", inelg), inst(3, "a", elig),
		}, want{
			guard: "tripped", published: 4, eligible: 1,
			states:  map[int]string{0: "ineligible", 1: "ineligible", 2: "ineligible", 3: "eligible"},
			weights: map[int]float64{0: 1, 1: 1},
		}},
		{"fraction 0 takes the default", 0, set(zoned(0, elig, 4, "a"), inelg, 0, 1, 2), want{guard: "tripped", published: 4, eligible: 1}},
		{"fraction 1 trips on any loss", 1, set(zoned(0, elig, 4, "a"), inelg, 0), want{guard: "tripped", published: 4, eligible: 3}},
		{"fraction above 1 is clamped", 7, zoned(0, elig, 4, "a"), want{guard: "ok", published: 4, eligible: 4}},
		{"low fraction keeps draining", 0.2, set(zoned(0, elig, 4, "a"), inelg, 0, 1, 2), want{guard: "ok", published: 1, eligible: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := assembler.New(assembler.Options{})
			vs := &versions{}
			ins := append(append([]assembler.InstanceInput(nil), tc.a...), zoned(100, elig, 2, "b")...)
			a.Update(svc("web", tc.frac, ins), t0)
			settle(t, a, t0, vs)
			v := mustView(t, a, "web")
			za, zb := v.Zones["a"], v.Zones["b"]
			if za.Guard != tc.want.guard || za.Eligible != tc.want.eligible || za.Total != 4 {
				t.Errorf("zone a = %+v, want guard %s eligible %d total 4", za, tc.want.guard, tc.want.eligible)
			}
			if got := zoneIDs(v, "a"); got != tc.want.published {
				t.Errorf("zone a publishes %d endpoints, want %d", got, tc.want.published)
			}
			if zb.Guard != assembler.GuardOK || zb.Eligible != 2 || zoneIDs(v, "b") != 2 {
				t.Errorf("zone b affected: %+v, %d endpoints", zb, zoneIDs(v, "b"))
			}
			eps := byID(v)
			for n, s := range tc.want.states {
				if got := eps[id(n)].State; got != s {
					t.Errorf("instance %d state %q, want %q", n, got, s)
				}
			}
			for n, w := range tc.want.weights {
				if got := eps[id(n)].Weight; got != w {
					t.Errorf("instance %d weight %g, want %g", n, got, w)
				}
			}
			for n, h := range tc.want.health {
				if got := eps[id(n)].Health; got != h {
					t.Errorf("instance %d health %q, want %q", n, got, h)
				}
			}
			for _, in := range tc.a {
				if e, ok := eps[in.ID]; ok && e.Quarantined != in.Quarantined {
					t.Errorf("instance %v quarantined %v, want %v", in.ID, e.Quarantined, in.Quarantined)
				}
			}
			alarms := a.Alarms()
			tripped := tc.want.guard == assembler.GuardTripped
			if tripped != (len(alarms) == 1) || (tripped && (alarms[0].Kind != assembler.AlarmFractionGuard || alarms[0].Zone != "a")) {
				t.Errorf("alarms = %+v, want a fraction_guard on zone a: %v", alarms, tripped)
			}
		})
	}
}

// Two zones trip and untrip independently; each alarm keeps its own since.
func TestZonesTripIndependently(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	ins := zoned(0, elig, 4, "a", "b")
	a.Update(svc("web", 0.5, ins), t0)
	settle(t, a, t0, vs)

	a.Update(svc("web", 0.5, set(ins, inelg, 0, 1, 2)), t0.Add(time.Minute))
	a.Update(svc("web", 0.5, set(ins, inelg, 0, 1, 2, 4, 5, 6)), t0.Add(2*time.Minute))
	got := a.Alarms()
	if len(got) != 2 || got[0].Zone != "a" || !got[0].Since.Equal(t0.Add(time.Minute)) || got[1].Zone != "b" || !got[1].Since.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("alarms = %+v", got)
	}
	a.Update(svc("web", 0.5, set(ins, inelg, 4, 5, 6)), t0.Add(3*time.Minute))
	if got := a.Alarms(); len(got) != 1 || got[0].Zone != "b" || !got[0].Since.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("after zone a recovers: %+v", got)
	}
	settle(t, a, t0.Add(3*time.Minute), vs)
	v := mustView(t, a, "web")
	if zoneIDs(v, "a") != 4 || v.Zones["a"].Guard != "ok" || zoneIDs(v, "b") != 4 || v.Zones["b"].Guard != "tripped" {
		t.Fatalf("view zones %+v", v.Zones)
	}
}

func TestLastInstanceAlarm(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	ins := []assembler.InstanceInput{inst(0, "a", elig), inst(1, "b", elig)}
	a.Update(svc("pay", 0.5, ins), t0)
	settle(t, a, t0, vs)

	// One left: no alarm (zone b trips on its own).
	a.Update(svc("pay", 0.5, set(ins, inelg, 1)), t0.Add(time.Minute))
	for _, al := range a.Alarms() {
		if al.Kind == assembler.AlarmLastInstance {
			t.Fatalf("last_instance raised with one instance in rotation: %+v", al)
		}
	}
	// The last one goes.
	down := t0.Add(2 * time.Minute)
	a.Update(svc("pay", 0.5, set(ins, inelg, 0, 1)), down)
	want := assembler.Alarm{
		Kind: assembler.AlarmLastInstance, Service: "pay", Since: down,
		Detail: "no instance in rotation in the region: 0 of 2 instances, all ineligible or quarantined; the guard keeps all 2 published",
	}
	if diff := cmp.Diff(want, lastInstance(a)); diff != "" {
		t.Fatalf("last_instance (-want +got):\n%s", diff)
	}
	settle(t, a, down, vs)
	if v := mustView(t, a, "pay"); len(v.Endpoints) != 2 {
		t.Fatalf("the last instances were dropped from the view: %+v", v.Endpoints)
	}
	// Still down a minute later: same alarm, same since.
	a.Update(svc("pay", 0.5, set(ins, inelg, 0, 1)), down.Add(time.Minute))
	if got := lastInstance(a); !got.Since.Equal(down) {
		t.Fatalf("since moved: %+v", got)
	}
	// Back.
	a.Update(svc("pay", 0.5, set(ins, inelg, 1)), down.Add(2*time.Minute))
	if got := lastInstance(a); got.Kind != "" {
		t.Fatalf("not cleared: %+v", got)
	}
	// Deregistering every instance also takes the last one.
	a.Update(svc("pay", 0.5, nil), down.Add(3*time.Minute))
	if got := lastInstance(a); !strings.Contains(got.Detail, "removed from the registry") {
		t.Fatalf("deregistration: %+v", got)
	}
	settle(t, a, down.Add(3*time.Minute), vs)
	if v := mustView(t, a, "pay"); len(v.Endpoints) != 0 || len(v.Zones) != 0 {
		t.Fatalf("deregistered instances still published: %+v", v)
	}
	a.RemoveService("pay", down.Add(4*time.Minute))
	if got := a.Alarms(); len(got) != 0 {
		t.Fatalf("alarms after RemoveService: %+v", got)
	}
}

// A new service whose instances await readiness never had one in rotation:
// no incident.
func TestLastInstanceNotRaisedForNewService(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	a.Update(svc("new", 0.5, zoned(0, inelg, 2, "a")), t0)
	if got := lastInstance(a); got.Kind != "" {
		t.Fatalf("raised for a service never in rotation: %+v", got)
	}
}

func lastInstance(a *assembler.Assembler) assembler.Alarm {
	for _, al := range a.Alarms() {
		if al.Kind == assembler.AlarmLastInstance {
			return al
		}
	}
	return assembler.Alarm{}
}

// Duplicate ids: the last entry wins, and the zone counts it once.
func TestDuplicateIDLastWins(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	ins := zoned(0, elig, 2, "a")
	dup := ins[0]
	dup.Address = "10.9.9.9"
	a.Update(svc("web", 0.5, append(ins, dup)), t0)
	settle(t, a, t0, &versions{})
	v := mustView(t, a, "web")
	if v.Zones["a"].Total != 2 || len(v.Endpoints) != 2 || byID(v)[id(0)].Address != "10.9.9.9" {
		t.Fatalf("view %+v", v)
	}
}

// Lease expiry goes through the guard (issue 11): an expired instance
// leaves the view only while its zone keeps its minimum healthy fraction
// without it; otherwise the zone's full set stays published, the expired
// endpoints marked, and they leave once the guard clears.
func TestLeaseExpiryGoesThroughTheGuard(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	ins := zoned(0, elig, 4, "a", "b")
	a.Update(svc("web", 0.5, ins), t0)
	settle(t, a, t0, vs)

	expired := func(base []assembler.InstanceInput, idx ...int) []assembler.InstanceInput {
		out := append([]assembler.InstanceInput(nil), base...)
		for _, i := range idx {
			out[i].LeaseExpired = true
		}
		return out
	}
	// One of zone a's four expires: 3 of 4 routable, the guard holds, so
	// it is withdrawn.
	now := t0.Add(time.Hour)
	a.Update(svc("web", 0.5, expired(ins, 0)), now)
	settle(t, a, now, vs)
	if _, ok := byID(mustView(t, a, "web"))[id(0)]; ok {
		t.Fatal("an expiry the guard allows is still published")
	}
	// Three of zone a's four expire together (a renewal path broken for
	// that zone, say): 1 of 4 routable, below 0.5: all four stay.
	now = now.Add(time.Hour)
	a.Update(svc("web", 0.5, expired(ins, 0, 1, 2)), now)
	settle(t, a, now, vs)
	v := mustView(t, a, "web")
	if z := v.Zones["a"]; z.Guard != assembler.GuardTripped || z.Eligible != 1 || z.Total != 4 {
		t.Fatalf("zone a %+v, want tripped 1 of 4", z)
	}
	got := byID(v)
	for _, n := range []int{0, 1, 2} {
		e, ok := got[id(n)]
		if !ok || !e.LeaseExpired || e.State != "ineligible" || e.Weight != assembler.TrippedWeight {
			t.Fatalf("expired endpoint %d: %+v, %v; want published, marked, at the tripped weight", n, e, ok)
		}
	}
	if e := got[id(3)]; e.LeaseExpired || e.State != "eligible" {
		t.Fatalf("the live endpoint: %+v", e)
	}
	// An override cannot bring an expired instance back into rotation.
	withOverride := expired(ins, 0, 1, 2)
	withOverride[1].Override = &assembler.Override{Action: assembler.OverrideEligible, Reason: "test"}
	if assembler.Routable(&withOverride[1]) {
		t.Fatal("an expired instance with mark_eligible counts as routable")
	}
	// Replacements arrive: zone a has 3 new routable instances, the guard
	// clears (4 of 7), and the expired endpoints leave the view.
	now = now.Add(time.Hour)
	grown := append(expired(ins, 0, 1, 2), inst(100, "a", elig), inst(101, "a", elig), inst(102, "a", elig))
	a.Update(svc("web", 0.5, grown), now)
	settle(t, a, now, vs)
	v = mustView(t, a, "web")
	if z := v.Zones["a"]; z.Guard != assembler.GuardOK {
		t.Fatalf("zone a %+v after the replacements", z)
	}
	for _, e := range v.Endpoints {
		if e.LeaseExpired {
			t.Fatalf("expired endpoint %s still published after the guard cleared", e.InstanceID)
		}
	}
	if !assembler.Tripped(1, 4, 0.5) || assembler.Tripped(2, 4, 0.5) || !assembler.Tripped(0, 4, 0) {
		t.Fatal("Tripped disagrees with the guard")
	}
}
