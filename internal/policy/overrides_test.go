package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
)

func TestJustification(t *testing.T) {
	for _, tc := range []struct {
		j  string
		ok bool
	}{
		{"", false}, {"   ", false}, {"x", false}, {"xxxxxxxxxxxxxxx", false}, {"ab ab ab ab ab ab", false},
		{"too short", false}, {"stale prices, INC-42", true}, {strings.Repeat("stale cache ", 200), false}, {"cache bug: az1", true}, {"cachebug", false},
	} {
		e := checkJustification("justification", tc.j)
		if (e == nil) != tc.ok {
			t.Errorf("checkJustification(%q) = %v, want ok=%v", tc.j, e, tc.ok)
		}
		if e != nil && (!errors.Is(e, ErrJustification) || len(e.Fields) != 1) {
			t.Errorf("checkJustification(%q): %+v", tc.j, e)
		}
	}
}

type snapshot assembler.ServiceInput

func (s snapshot) Snapshot(string) (assembler.ServiceInput, bool) {
	return assembler.ServiceInput(s), true
}

// TestBudgetArithmetic: the budget counts what the guard counts (unknown
// is in rotation, quarantined and ineligible are not, an instance awaiting
// its first success is not capacity), overrides in force are applied, and
// the refusals say the numbers.
func TestBudgetArithmetic(t *testing.T) {
	ids := make([]uuid.UUID, 8)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	ev := func(i int, zone string, st eligibility.State, quarantined bool) assembler.InstanceInput {
		return assembler.InstanceInput{ID: ids[i], Zone: zone, State: st, Quarantined: quarantined}
	}
	waiting := ev(7, "az1", eligibility.Ineligible, false)
	waiting.Awaiting = true
	snap := snapshot{Name: "web", MinHealthyFraction: 0.5, Instances: []assembler.InstanceInput{
		ev(0, "az1", eligibility.Eligible, false),
		ev(1, "az1", eligibility.Degraded, false),
		ev(2, "az1", eligibility.Ineligible, false),
		ev(3, "az1", eligibility.Unknown, false),
		ev(4, "az1", eligibility.Eligible, true),
		ev(5, "az1", eligibility.Ineligible, false),
		ev(6, "az2", eligibility.Eligible, false),
		waiting,
	}}
	budget := func(zone string, target uuid.UUID, inForce []db.Override) (budgetCheck, error) {
		return budgetOf(assembler.ServiceInput(snap), nil, zone, target, inForce), nil
	}
	// az1: 3 of 6 in rotation (eligible, degraded, unknown); the awaiting
	// instance is not capacity; 3 required.
	b, err := budget("az1", ids[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	e := b.refusal()
	if !errors.Is(e, ErrBudget) || e.Detail != "would leave 2 of 6 eligible in zone az1; the contract requires 3 (min_healthy_fraction 0.5)" {
		t.Fatalf("refusal %v", e)
	}
	// Removing an instance out of rotation spends nothing.
	if b, _ := budget("az1", ids[5], nil); b.refusal() != nil || b.counted {
		t.Fatalf("ineligible target: %+v", b)
	}
	if b, _ := budget("az1", ids[7], nil); b.refusal() != nil || b.counted || b.zoneTotal != 6 {
		t.Fatalf("awaiting target: %+v", b)
	}
	// A mark_eligible override in force counts the ineligible instance.
	inForce := []db.Override{{InstanceID: ids[5], Action: string(MarkEligible)}}
	if b, _ := budget("az1", ids[0], inForce); b.refusal() != nil || b.zoneAfter != 3 {
		t.Fatalf("with a mark_eligible in force: %+v", b)
	}
	// The last instance in rotation in the region.
	inForce = []db.Override{
		{InstanceID: ids[0], Action: string(MarkIneligible)}, {InstanceID: ids[1], Action: string(MarkIneligible)},
		{InstanceID: ids[3], Action: string(MarkIneligible)},
	}
	b, _ = budget("az2", ids[6], inForce)
	if e := b.refusal(); !errors.Is(e, ErrLastInstance) || e.Figures["region_eligible_after"] != 0 {
		t.Fatalf("last instance: %v %+v", e, b)
	}
}

// TestBudgetFollowsTheRegistry: an instance the evaluator still holds but
// the registry has ended a moment ago is counted as the evaluator will
// count it once it catches up: deregistered (or replaced) is gone, a lapsed
// lease is out of rotation but still capacity. Two deregistrations a
// moment apart cannot spend the same headroom.
func TestBudgetFollowsTheRegistry(t *testing.T) {
	ids := make([]uuid.UUID, 5)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	snap := assembler.ServiceInput{Name: "web", MinHealthyFraction: 0.5}
	for _, id := range ids {
		snap.Instances = append(snap.Instances, assembler.InstanceInput{ID: id, Zone: "az1", State: eligibility.Eligible})
	}
	// As the evaluator holds it: 4 of 5 left, 3 required.
	if b := budgetOf(snap, nil, "az1", ids[0], nil); b.refusal() != nil || b.zoneAfter != 4 || b.zoneTotal != 5 {
		t.Fatalf("without the registry's states: %+v", b)
	}
	states := map[uuid.UUID]string{
		ids[0]: "active", ids[1]: "deregistered", ids[2]: "replaced", ids[3]: "expired", ids[4]: "active",
	}
	// ids[1] and ids[2] are gone, ids[3] is capacity out of rotation: 1 of
	// 3 would be left, 2 required.
	b := budgetOf(snap, states, "az1", ids[0], nil)
	e := b.refusal()
	if !errors.Is(e, ErrBudget) || b.zoneBefore != 2 || b.zoneAfter != 1 || b.zoneTotal != 3 || b.required != 2 {
		t.Fatalf("with the registry's states: %v %+v", e, b)
	}
}
