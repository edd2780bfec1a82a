package assembler_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
)

// awaiting returns a new instance of a readiness service before its first
// success: ineligible and never admitted.
func awaiting(n int, zone string) assembler.InstanceInput {
	x := inst(n, zone, inelg)
	x.Weight, x.HealthKnown, x.Awaiting = 0, false, true
	return x
}

// A surge deploy adds 3 new instances beside 2 ready ones in a zone: the
// new ones are not capacity yet, so nothing trips, no alarm opens and they
// stay out of the view until each succeeds, then enter at the weight the
// evaluation core gives them (its slow start).
func TestSurgeDeployTripsNothing(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	ready := zoned(0, elig, 2, "a")
	a.Update(svc("web", 0.5, ready), t0)
	settle(t, a, t0, vs)

	now := t0.Add(time.Hour)
	surge := append(append([]assembler.InstanceInput{}, ready...), awaiting(10, "a"), awaiting(11, "a"), awaiting(12, "a"))
	a.Update(svc("web", 0.5, surge), now)
	settle(t, a, now, vs)
	if al := a.Alarms(); len(al) != 0 {
		t.Fatalf("alarms %+v, want none: nothing that was capacity left rotation", al)
	}
	v := mustView(t, a, "web")
	want := assembler.ZoneStatus{Guard: assembler.GuardOK, Eligible: 2, Total: 2, Registered: 5, MinHealthyFraction: 0.5, TrafficWeight: 1}
	if diff := cmp.Diff(want, v.Zones["a"]); diff != "" {
		t.Fatalf("zone a (-want +got):\n%s", diff)
	}
	if len(v.Endpoints) != 2 {
		t.Fatalf("published %d endpoints, want the 2 ready ones: %+v", len(v.Endpoints), v.Endpoints)
	}

	// Instance 10 succeeds: the core admits it at its first slow-start step.
	now = now.Add(5 * time.Second)
	surge[2] = inst(10, "a", elig)
	surge[2].Weight = 0.1
	a.Update(svc("web", 0.5, surge), now)
	settle(t, a, now, vs)
	v = mustView(t, a, "web")
	if e, ok := byID(v)[id(10)]; !ok || e.Weight != 0.1 || e.State != "eligible" {
		t.Fatalf("admitted instance published as %+v (present %v), want eligible at 0.1", e, ok)
	}
	if n := len(v.Endpoints); n != 3 {
		t.Fatalf("published %d endpoints, want 3 (the two still awaiting stay out)", n)
	}
	if z := v.Zones["a"]; z.Total != 3 || z.Eligible != 3 || z.Registered != 5 {
		t.Fatalf("zone a %+v, want 3 of 3 counted, 5 registered", z)
	}
}

// A brand-new service whose instances all await their first success is
// published with no routable endpoint and raises no alarm.
func TestNewServicePublishesNothingRoutableAndNoAlarm(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	a.Update(svc("new", 0.5, []assembler.InstanceInput{awaiting(1, "a"), awaiting(2, "a"), awaiting(3, "b")}), t0)
	pubs := settle(t, a, t0, vs)
	if len(pubs) != 1 {
		t.Fatalf("published %d versions, want the first", len(pubs))
	}
	v := mustView(t, a, "new")
	if len(v.Endpoints) != 0 {
		t.Fatalf("published %+v, want no endpoint before any succeeds", v.Endpoints)
	}
	if z := v.Zones["a"]; z.Guard != assembler.GuardOK || z.Total != 0 || z.Registered != 2 {
		t.Fatalf("zone a %+v, want ok with 0 counted and 2 registered", z)
	}
	if al := a.Alarms(); len(al) != 0 {
		t.Fatalf("alarms %+v, want none for a service that never had capacity", al)
	}
}

// A tripped guard publishes the capacity that was there (admitted
// instances out of rotation), never an instance awaiting its first
// success, and names the ones it leaves out in the alarm.
func TestTrippedGuardNeverPublishesAwaiting(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	ins := []assembler.InstanceInput{inst(1, "a", elig), inst(2, "a", inelg), inst(3, "a", inelg), awaiting(4, "a")}
	ins[1].Weight, ins[2].Weight = 0, 0
	a.Update(svc("web", 0.5, ins), t0)
	settle(t, a, t0, vs)
	v := mustView(t, a, "web")
	if z := v.Zones["a"]; z.Guard != assembler.GuardTripped || z.Eligible != 1 || z.Total != 3 || z.Registered != 4 {
		t.Fatalf("zone a %+v, want tripped at 1 of 3 counted, 4 registered", z)
	}
	got := byID(v)
	if _, ok := got[id(4)]; ok {
		t.Fatalf("the awaiting instance is published: %+v", got[id(4)])
	}
	for _, n := range []int{2, 3} {
		if e := got[id(n)]; e.Weight != assembler.TrippedWeight {
			t.Fatalf("instance %d published at %v, want %v (no slow start configured)", n, e.Weight, assembler.TrippedWeight)
		}
	}
	al := a.Alarms()
	if len(al) != 1 || al[0].Kind != assembler.AlarmFractionGuard {
		t.Fatalf("alarms %+v, want one fraction_guard", al)
	}
	const want = "1 of 3 instances in rotation (33%), below the minimum healthy fraction 0.5: publishing all 3 (1 more awaiting their first success are not capacity and stay out)"
	if al[0].Detail != want {
		t.Fatalf("alarm detail\n got %q\nwant %q", al[0].Detail, want)
	}
}

// What clients route to is capacity, whatever the input says: a replica
// dealt a service it never evaluated continues from the previous owner's
// view (Restore) and may hold every instance as awaiting its first
// success (it never heard one). Those the restored view serves count, so
// the guard trips and keeps them instead of withdrawing the service; an
// awaiting instance the view never served stays out; and once the input
// admits them the view is the input's again.
func TestServedInstancesAreCapacityWhateverTheInputSays(t *testing.T) {
	t.Parallel()
	vs := &versions{}
	prev := assembler.New(assembler.Options{})
	ready := zoned(0, elig, 4, "a")
	prev.Update(svc("web", 0.5, ready), t0)
	settle(t, prev, t0, vs)
	base := mustView(t, prev, "web")

	a := assembler.New(assembler.Options{})
	if err := a.Restore(base); err != nil {
		t.Fatal(err)
	}
	var lost []assembler.InstanceInput
	for n := range 4 {
		lost = append(lost, awaiting(n, "a"))
	}
	lost = append(lost, awaiting(9, "a")) // registered since: never served
	now := t0.Add(time.Minute)
	a.Update(svc("web", 0.5, lost), now)
	settle(t, a, now, vs)
	v := mustView(t, a, "web")
	if z := v.Zones["a"]; z.Guard != assembler.GuardTripped || z.Total != 4 || z.Registered != 5 {
		t.Fatalf("zone a %+v, want tripped with the 4 served instances counted, 5 registered", z)
	}
	got := byID(v)
	for n := range 4 {
		if e, ok := got[id(n)]; !ok || e.Weight <= 0 {
			t.Fatalf("served instance %d is %+v (published %v), want kept by the guard", n, e, ok)
		}
	}
	if e, ok := got[id(9)]; ok {
		t.Fatalf("an instance never served is published: %+v", e)
	}

	// The evidence arrives: the input admits them, and the view follows it.
	later := now.Add(time.Minute)
	a.Update(svc("web", 0.5, append(zoned(0, elig, 4, "a"), awaiting(9, "a"))), later)
	settle(t, a, later, vs)
	v = mustView(t, a, "web")
	if z := v.Zones["a"]; z.Guard != assembler.GuardOK || z.Eligible != 4 || z.Total != 4 {
		t.Fatalf("zone a %+v, want ok at 4 of 4", z)
	}
	if al := a.Alarms(); len(al) != 0 {
		t.Fatalf("alarms %+v after the input admitted every served instance", al)
	}
}

// Slow start applies to endpoints the assembler puts into rotation: a
// tripped guard's and a mark_eligible override's. They enter at 1/10 and
// step up to full weight over the contract's slow start, NextDue saying
// when each step is due; an endpoint already serving when its zone trips
// keeps its weight.
func TestSlowStartThroughTrippedGuardAndOverride(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	const ss = 60 * time.Second
	in := func(ins []assembler.InstanceInput) assembler.ServiceInput {
		s := svc("web", 0.5, ins)
		s.SlowStart = ss
		return s
	}
	// Zone a: 1 eligible, 3 admitted but out. Instance 2 was serving
	// before (published in rotation), the other two were not.
	ins := zoned(0, elig, 4, "a")
	a.Update(in(ins), t0)
	settle(t, a, t0, vs)
	now := t0.Add(time.Hour)
	ins = set(ins, inelg, 2, 3) // out, zone still ok at 2 of 4
	a.Update(in(ins), now)
	settle(t, a, now, vs)
	if n := len(mustView(t, a, "web").Endpoints); n != 2 {
		t.Fatalf("published %d, want 2 (zone ok)", n)
	}
	now = now.Add(time.Minute)
	ins = set(ins, inelg, 1) // 1 of 4: trips; 1 was serving, 2 and 3 were not
	a.Update(in(ins), now)
	now = now.Add(time.Second) // the addition window
	drainAt(t, a, now, vs)
	got := byID(mustView(t, a, "web"))
	if w := got[id(1)].Weight; w != assembler.TrippedWeight {
		t.Fatalf("instance 1 was serving when the zone tripped: weight %v, want %v", w, assembler.TrippedWeight)
	}
	for _, n := range []int{2, 3} {
		if w := got[id(n)].Weight; w != 0.1 {
			t.Fatalf("instance %d enters rotation through the guard at %v, want 0.1", n, w)
		}
	}
	tripAt := now.Add(-time.Second)
	// The ramp steps are due on their own: NextDue names each one.
	var seen []float64
	for range 20 {
		due := a.NextDue()
		if due.IsZero() {
			break
		}
		if due.Before(now) {
			t.Fatalf("NextDue %v before the last drain %v", due.Sub(tripAt), now.Sub(tripAt))
		}
		now = due
		drainAt(t, a, now, vs)
		w := byID(mustView(t, a, "web"))[id(2)].Weight
		if len(seen) == 0 || seen[len(seen)-1] != w {
			seen = append(seen, w)
		}
	}
	if last := seen[len(seen)-1]; last != assembler.TrippedWeight {
		t.Fatalf("ramp ended at %v (steps %v), want %v", last, seen, assembler.TrippedWeight)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Fatalf("ramp not increasing: %v", seen)
		}
	}
	if len(seen) > assembler.SlowStartSteps {
		t.Fatalf("ramp took %d weights, want at most %d steps: %v", len(seen), assembler.SlowStartSteps, seen)
	}
	if d := now.Sub(tripAt); d < ss || d > ss+2*time.Second {
		t.Fatalf("ramp finished %v after the trip, want about the slow start %v", d, ss)
	}

	// A mark_eligible override on an out-of-rotation instance of a zone
	// that is not tripped ramps the same way.
	b := zoned(100, elig, 4, "b")
	b = set(b, inelg, 100)
	a.Update(in(b), now)
	settle(t, a, now, vs)
	now = now.Add(time.Minute)
	b[0].Override = &assembler.Override{Action: assembler.OverrideEligible, Reason: "check known wrong"}
	a.Update(in(b), now)
	drainAt(t, a, now.Add(2*time.Second), vs)
	if e := byID(mustView(t, a, "web"))[id(100)]; e.Weight != 0.1 || e.State != "eligible" {
		t.Fatalf("forced-in instance published as %+v, want eligible at 0.1", e)
	}
}

// The Capacity rule is the guard's: for any zone, Capacity.Tripped agrees
// with the zone status Update computes, and Required is the fewest
// routable instances that keep the guard from tripping.
func TestPropCapacityIsTheGuard(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		frac := rapid.SampledFrom([]float64{0, 0.1, 0.3, 0.5, 0.66, 0.75, 1, 2}).Draw(rt, "frac")
		n := rapid.IntRange(0, 25).Draw(rt, "n")
		var ins []assembler.InstanceInput
		var c assembler.Capacity
		for i := range n {
			x := inst(i, "a", eligibility.State(rapid.IntRange(0, 3).Draw(rt, "state")))
			x.Quarantined = rapid.IntRange(0, 4).Draw(rt, "q") == 0
			x.Awaiting = x.State == inelg && rapid.Bool().Draw(rt, "awaiting")
			x.LeaseExpired = rapid.IntRange(0, 6).Draw(rt, "expired") == 0
			switch rapid.IntRange(0, 5).Draw(rt, "override") {
			case 0:
				x.Override = &assembler.Override{Action: assembler.OverrideIneligible}
			case 1:
				x.Override = &assembler.Override{Action: assembler.OverrideEligible}
			}
			ins = append(ins, x)
			c.Add(&x)
		}
		a := assembler.New(assembler.Options{})
		a.Update(svc("s", frac, ins), t0)
		settle(t, a, t0, &versions{})
		z, ok := mustView(t, a, "s").Zones["a"]
		if n > 0 && !ok {
			rt.Fatalf("no zone status")
		}
		if got := z.Guard == assembler.GuardTripped; got != c.Tripped(frac) {
			rt.Fatalf("guard %q, Capacity %+v says tripped=%v", z.Guard, c, c.Tripped(frac))
		}
		if z.Eligible != c.Routable || z.Total != c.Counted {
			rt.Fatalf("zone %+v, capacity %+v", z, c)
		}
		r := c.Required(frac)
		if r < 0 || r > c.Counted {
			rt.Fatalf("Required %d outside [0,%d]", r, c.Counted)
		}
		if (assembler.Capacity{Routable: r, Counted: c.Counted}).Tripped(frac) {
			rt.Fatalf("Required %d of %d trips at %v", r, c.Counted, frac)
		}
		if r > 0 && !(assembler.Capacity{Routable: r - 1, Counted: c.Counted}).Tripped(frac) {
			rt.Fatalf("Required %d of %d is not the fewest at %v", r, c.Counted, frac)
		}
	})
}
