package evaluator

import (
	"testing"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/registry"
)

// A prober's assignment is checked by service number on every probe
// report: a service it names is covered; one numbered before or after
// the assignment was built and not named is not; an instance named alone
// is; and an instance whose service carries no number is looked up by
// name.
func TestAssignmentCoversByNumber(t *testing.T) {
	e := &Evaluator{serviceNumbers: map[string]int32{}, reporters: map[string]eligibility.ReporterID{},
		probers: map[string]*proberAssignment{}, byService: map[string]map[uuid.UUID]struct{}{},
		engine: eligibility.NewEngine(eligibility.Options{})}
	before := e.serviceNumber("api")
	alone := uuid.New()
	pa := e.applyAssignment(registry.ProberAssignments{Prober: "p", Services: []string{"web", "pay"}, Instances: []uuid.UUID{alone}})
	after := e.serviceNumber("search")
	web, pay := e.serviceNumber("web"), e.serviceNumber("pay")
	for _, c := range []struct {
		name    string
		id      uuid.UUID
		svc     int32
		service string
		want    bool
	}{
		{"named", uuid.New(), web, "web", true},
		{"named too", uuid.New(), pay, "pay", true},
		{"numbered before, not named", uuid.New(), before, "api", false},
		{"numbered after, not named", uuid.New(), after, "search", false},
		{"an instance named alone", alone, after, "search", true},
		{"no number: by name", uuid.New(), 0, "web", true},
		{"no number, not named", uuid.New(), 0, "api", false},
	} {
		if got := pa.covers(c.id, c.svc, c.service); got != c.want {
			t.Errorf("%s: covers = %v, want %v", c.name, got, c.want)
		}
	}
}
