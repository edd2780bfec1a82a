package assembler_test

import (
	"testing"
	"time"

	"github.com/musterhq/muster/internal/assembler"
)

// Overrides are applied before the guard: a mark_ineligible instance is out
// of its zone's fraction and published at weight 0 with its reason, and a
// tripped guard restores the health-removed instances but never it; a
// mark_eligible instance is forced into rotation.
func TestOverridesApplyBeforeTheGuard(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	ins := zoned(0, elig, 4, "a")
	out := &assembler.Override{ID: id(100), Action: assembler.OverrideIneligible, Reason: "override: corrupting orders"}
	ins[0].Override = out
	a.Update(svc("web", 0.5, ins), t0)
	settle(t, a, t0, vs)
	v := mustView(t, a, "web")
	e := byID(v)[id(0)]
	if e.Weight != 0 || e.State != "ineligible" || e.Override == nil || e.Override.Reason != out.Reason {
		t.Fatalf("forced out: %+v", e)
	}
	if z := v.Zones["a"]; z.Eligible != 3 || z.Total != 4 || z.Guard != assembler.GuardOK {
		t.Fatalf("zone a: %+v", z)
	}

	// Two more fail by health: 1 of 4 routable, the guard trips and
	// republishes the health-removed ones, not the overridden one.
	now := t0.Add(time.Minute)
	ins = set(ins, inelg, 1, 2)
	a.Update(svc("web", 0.5, ins), now)
	settle(t, a, now, vs)
	v = mustView(t, a, "web")
	if z := v.Zones["a"]; z.Guard != assembler.GuardTripped || z.Eligible != 1 {
		t.Fatalf("zone a after failures: %+v", z)
	}
	eps := byID(v)
	if eps[id(0)].Weight != 0 || eps[id(1)].Weight != assembler.TrippedWeight || eps[id(2)].Weight != assembler.TrippedWeight {
		t.Fatalf("under the tripped guard: %+v", eps)
	}

	// mark_eligible forces a failed instance in; the zone recovers.
	now = now.Add(time.Minute)
	ins[1].Override = &assembler.Override{ID: id(101), Action: assembler.OverrideEligible, Reason: "probe is wrong"}
	a.Update(svc("web", 0.5, ins), now)
	settle(t, a, now, vs)
	v = mustView(t, a, "web")
	if z := v.Zones["a"]; z.Guard != assembler.GuardOK || z.Eligible != 2 {
		t.Fatalf("zone a with a forced-in instance: %+v", z)
	}
	if e := byID(v)[id(1)]; e.State != "eligible" || e.Weight == 0 || e.Override == nil {
		t.Fatalf("forced in: %+v", e)
	}
	if _, ok := byID(v)[id(2)]; ok {
		t.Fatalf("health-removed instance still published once the guard untripped")
	}

	// Lifting (no override in the input) returns instance 0 to its verdict.
	now = now.Add(time.Minute)
	ins[0].Override = nil
	a.Update(svc("web", 0.5, ins), now)
	settle(t, a, now, vs)
	if e := byID(mustView(t, a, "web"))[id(0)]; e.Weight == 0 || e.Override != nil || e.State != "eligible" {
		t.Fatalf("after lifting: %+v", e)
	}
}
