package policy

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"pgregory.net/rapid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/shift"
)

type fixedVersions struct{ n uint64 }

func (v *fixedVersions) Next(n int) (uint64, error) {
	v.n += uint64(n)
	return v.n - uint64(n) + 1, nil
}

// guardZones runs the assembler's guard on snap with the overrides in
// force and returns its zone statuses.
func guardZones(t *rapid.T, snap assembler.ServiceInput, forced map[uuid.UUID]Action) map[string]assembler.ZoneStatus {
	in := assembler.ServiceInput{Name: snap.Name, MinHealthyFraction: snap.MinHealthyFraction}
	for _, v := range snap.Instances {
		x := v
		if a, ok := forced[v.ID]; ok {
			x.Override = &assembler.Override{Action: string(a)}
		}
		in.Instances = append(in.Instances, x)
	}
	a := assembler.New(assembler.Options{})
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	a.Update(in, now)
	if _, err := a.Drain(now.Add(time.Hour), &fixedVersions{}); err != nil {
		t.Fatalf("drain: %v", err)
	}
	v, ok := a.View(snap.Name)
	if !ok {
		t.Fatalf("no view")
	}
	return v.Zones
}

func drawSnapshot(t *rapid.T) (assembler.ServiceInput, map[uuid.UUID]Action) {
	snap := assembler.ServiceInput{Name: "web",
		MinHealthyFraction: rapid.SampledFrom([]float64{0, 0.2, 0.34, 0.5, 0.75, 1}).Draw(t, "frac")}
	forced := map[uuid.UUID]Action{}
	n := rapid.IntRange(1, 14).Draw(t, "n")
	for i := range n {
		var id uuid.UUID
		id[0], id[15] = byte(i), 7
		v := assembler.InstanceInput{ID: id, Zone: fmt.Sprintf("az%d", rapid.IntRange(1, 3).Draw(t, "zone")),
			State: eligibility.State(rapid.IntRange(0, 3).Draw(t, "state")), Weight: 1}
		v.Quarantined = rapid.IntRange(0, 5).Draw(t, "q") == 0
		v.Awaiting = v.State == eligibility.Ineligible && rapid.Bool().Draw(t, "awaiting")
		v.LeaseExpired = rapid.IntRange(0, 7).Draw(t, "expired") == 0
		snap.Instances = append(snap.Instances, v)
		switch rapid.IntRange(0, 6).Draw(t, "override") {
		case 0:
			forced[id] = MarkIneligible
		case 1:
			forced[id] = MarkEligible
		}
	}
	return snap, forced
}

// The override budget, the drain budget and the fraction guard give the
// same answer on the same input (issue 12): marking an instance ineligible
// is refused exactly when the guard, given that override, would trip the
// instance's zone (or nothing in the region would stay in rotation); a
// drain is refused exactly when the guard, counting the region as one
// zone with the drained zone's instances out of rotation, would trip.
func TestPropBudgetsAgreeWithTheGuard(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		snap, forced := drawSnapshot(t)
		target := snap.Instances[rapid.IntRange(0, len(snap.Instances)-1).Draw(t, "target")]

		before := guardZones(t, snap, forced)
		after := map[uuid.UUID]Action{}
		for k, v := range forced {
			after[k] = v
		}
		after[target.ID] = MarkIneligible
		zones := guardZones(t, snap, after)
		b := overrideBudget(snap, target.Zone, target.ID, forced)
		refused := b.refusal() != nil

		x := target
		if a, ok := forced[target.ID]; ok {
			x.Override = &assembler.Override{Action: string(a)}
		}
		inRotation := assembler.Routable(&x)
		regionRoutable := 0
		for _, z := range zones {
			regionRoutable += z.Eligible
		}
		guardSays := inRotation && (zones[target.Zone].Guard == assembler.GuardTripped || regionRoutable == 0)
		if refused != guardSays {
			t.Fatalf("budget refused=%v (%+v), guard: in rotation %v, zone before %+v after %+v, region routable after %d",
				refused, b, inRotation, before[target.Zone], zones[target.Zone], regionRoutable)
		}
		if z := zones[target.Zone]; b.zoneAfter != z.Eligible || b.zoneTotal != z.Total {
			t.Fatalf("budget figures %d of %d, guard's zone %+v", b.zoneAfter, b.zoneTotal, z)
		}

		// The drain budget: the region as one zone, the drained zone out.
		drainZone := fmt.Sprintf("az%d", rapid.IntRange(1, 3).Draw(t, "drain"))
		region := assembler.ServiceInput{Name: snap.Name, MinHealthyFraction: snap.MinHealthyFraction}
		drainForced := map[uuid.UUID]Action{}
		for _, v := range snap.Instances {
			v.Override = nil
			if a, ok := forced[v.ID]; ok {
				v.Override = &assembler.Override{Action: string(a)}
			}
			if a, ok := forced[v.ID]; ok {
				drainForced[v.ID] = a
			}
			if v.Zone == drainZone {
				// Drained: there, but serving nothing.
				drainForced[v.ID] = MarkIneligible
			}
			v.Zone = "region"
			region.Instances = append(region.Instances, v)
		}
		rz := guardZones(t, region, drainForced)["region"]
		withOverrides := assembler.ServiceInput{Name: snap.Name, MinHealthyFraction: snap.MinHealthyFraction}
		for _, v := range snap.Instances {
			if a, ok := forced[v.ID]; ok {
				v.Override = &assembler.Override{Action: string(a)}
			}
			withOverrides.Instances = append(withOverrides.Instances, v)
		}
		c := shift.DrainCapacity(withOverrides, map[string]bool{drainZone: true})
		if got, want := c.Tripped(snap.MinHealthyFraction), rz.Guard == assembler.GuardTripped; got != want {
			t.Fatalf("drain of %s: budget refuses=%v (%+v), the guard on the region says tripped=%v (%+v)", drainZone, got, c, want, rz)
		}
	})
}
