package webui

import (
	"fmt"
	"io"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/views"
)

// fakeEstate stands in for the evaluator and publisher at region scale.
type fakeEstate struct {
	el    map[string]evaluator.ServiceEligibility
	stats []eligibility.ServiceStats
	views map[string]*assembler.View
}

func (f *fakeEstate) AllServiceStats() ([]eligibility.ServiceStats, time.Time, error) {
	return f.stats, time.Now(), nil
}

func (f *fakeEstate) ServiceEligibility(s string) (evaluator.ServiceEligibility, error) {
	return f.el[s], nil
}
func (f *fakeEstate) Alarms() []assembler.Alarm { return nil }
func (f *fakeEstate) View(s string) (*assembler.View, bool) {
	v, ok := f.views[s]
	return v, ok
}

// BenchmarkOverview renders the overview of 450 services and 60,000
// instances (three zones, three evidence classes): the registry is read
// from PostgreSQL, the verdicts and views come from memory as they do in
// production. The figure is server-side time per page.
func BenchmarkOverview(b *testing.B) {
	const services, perService = 450, 134
	pool := dbtest.New(b)
	reg, err := registry.New(registry.Config{Pool: pool, Region: "local"})
	if err != nil {
		b.Fatal(err)
	}
	admin := identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
	now := time.Now()
	age := 3.0
	f := &fakeEstate{el: map[string]evaluator.ServiceEligibility{}, views: map[string]*assembler.View{}}
	for i := range services {
		name := fmt.Sprintf("svc-%03d", i)
		spec := registry.ServiceSpec{Owner: fmt.Sprintf("team-%d", i%20), Capabilities: []registry.Capability{"passive", "probe", "self"}}
		if _, _, err := reg.PutService(b.Context(), admin, name, spec); err != nil {
			b.Fatal(err)
		}
		el := evaluator.ServiceEligibility{Service: name, GeneratedAt: now, Counts: map[string]int{"eligible": perService}}
		for j := range perService {
			ev := map[string]evaluator.ClassEvidence{}
			for _, c := range []string{"probe", "self", "passive"} {
				ev[c] = evaluator.ClassEvidence{Present: true, LastSampleAt: &now, LastSampleAgeSeconds: &age}
			}
			el.Instances = append(el.Instances, evaluator.InstanceVerdict{InstanceID: uuid.New(),
				Zone: fmt.Sprintf("az%d", j%3), State: "eligible", Weight: 1, Health: "known", Evidence: ev})
		}
		f.el[name] = el
		f.stats = append(f.stats, eligibility.ServiceStats{Service: name, Instances: perService, Eligible: perService,
			Classes: []eligibility.Class{eligibility.Probe, eligibility.Self, eligibility.Passive}})
		f.views[name] = &assembler.View{Service: name, Version: uint64(i + 1), GeneratedAt: now, Zones: map[string]assembler.ZoneStatus{
			"az0": {Guard: "ok", Eligible: 45, Total: 45, MinHealthyFraction: 0.5},
			"az1": {Guard: "ok", Eligible: 45, Total: 45, MinHealthyFraction: 0.5},
			"az2": {Guard: "tripped", Eligible: 10, Total: 44, MinHealthyFraction: 0.5},
		}}
	}
	u, err := New(Config{Pool: pool, Registry: reg, Evaluator: ownerread.Local(f), Publisher: f, Audit: audit.NewLog(pool), SessionCleanup: -1,
		OIDC: OIDCConfig{IssuerURL: "https://id.example", ClientID: "ui", RedirectURL: "https://muster.example/ui/auth/callback"}})
	if err != nil {
		b.Fatal(err)
	}
	defer u.Close()
	req := httptest.NewRequest("GET", "/ui/", nil)
	pg := u.pageFor(admin)
	b.ReportAllocs()
	for b.Loop() {
		o, err := u.buildOverview(req, admin, pg, "", "", "")
		if err != nil {
			b.Fatal(err)
		}
		if len(o.Services) != services {
			b.Fatalf("%d services", len(o.Services))
		}
		if err := views.OverviewPage(o).Render(req.Context(), io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}
