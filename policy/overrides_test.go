package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/eligibility"
	"github.com/musterhq/muster/evaluator"
)

func TestRequiredMatchesTheGuard(t *testing.T) {
	for _, tc := range []struct {
		total int
		frac  float64
		want  int
	}{
		{6, 0.5, 3}, {5, 0.5, 3}, {1, 0.5, 1}, {10, 0.3, 3}, {10, 0.7, 7}, {3, 1, 3}, {7, 0.01, 1}, {0, 0.5, 0},
	} {
		got := required(tc.total, tc.frac)
		if got != tc.want {
			t.Errorf("required(%d, %g) = %d, want %d", tc.total, tc.frac, got, tc.want)
		}
		// The assembler trips when n/total < frac: required is the first n
		// that does not trip.
		if tc.total > 0 && (float64(got)/float64(tc.total) < tc.frac || (got > 0 && float64(got-1)/float64(tc.total) >= tc.frac)) {
			t.Errorf("required(%d, %g) = %d disagrees with the guard", tc.total, tc.frac, got)
		}
	}
}

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

type snapshot evaluator.ServiceSnapshot

func (s snapshot) Snapshot(string) (evaluator.ServiceSnapshot, bool) {
	return evaluator.ServiceSnapshot(s), true
}

// TestBudgetArithmetic: unknown and quarantined instances are not counted,
// overrides in force are, and the refusals say the numbers.
func TestBudgetArithmetic(t *testing.T) {
	ids := make([]uuid.UUID, 7)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	ev := func(i int, zone string, st eligibility.State, quarantined bool) evaluator.EndpointVerdict {
		return evaluator.EndpointVerdict{ID: ids[i], Zone: zone, State: st, Quarantined: quarantined}
	}
	snap := snapshot{Name: "web", MinHealthyFraction: 0.5, Instances: []evaluator.EndpointVerdict{
		ev(0, "az1", eligibility.Eligible, false),
		ev(1, "az1", eligibility.Degraded, false),
		ev(2, "az1", eligibility.Eligible, false),
		ev(3, "az1", eligibility.Unknown, false),
		ev(4, "az1", eligibility.Eligible, true),
		ev(5, "az1", eligibility.Ineligible, false),
		ev(6, "az2", eligibility.Eligible, false),
	}}
	s := &Service{cfg: Config{Verdicts: snap}}
	// az1: 3 of 6 count (eligible, degraded, eligible); 3 required.
	b, err := s.budget("web", "az1", ids[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	e := b.refusal()
	if !errors.Is(e, ErrBudget) || e.Detail != "would leave 2 of 6 eligible in zone az1; the contract requires 3 (min_healthy_fraction 0.5)" {
		t.Fatalf("refusal %v", e)
	}
	// Removing an unknown instance spends nothing.
	if b, _ := s.budget("web", "az1", ids[3], nil); b.refusal() != nil || b.counted {
		t.Fatalf("unknown target: %+v", b)
	}
	// A mark_eligible override in force counts the ineligible instance.
	inForce := []db.Override{{InstanceID: ids[5], Action: string(MarkEligible)}}
	if b, _ := s.budget("web", "az1", ids[0], inForce); b.refusal() != nil || b.zoneAfter != 3 {
		t.Fatalf("with a mark_eligible in force: %+v", b)
	}
	// The last eligible instance in the region.
	inForce = []db.Override{
		{InstanceID: ids[0], Action: string(MarkIneligible)}, {InstanceID: ids[1], Action: string(MarkIneligible)},
		{InstanceID: ids[2], Action: string(MarkIneligible)},
	}
	b, _ = s.budget("web", "az2", ids[6], inForce)
	if e := b.refusal(); !errors.Is(e, ErrLastInstance) || e.Figures["region_eligible_after"] != 0 {
		t.Fatalf("last instance: %v %+v", e, b)
	}
}
