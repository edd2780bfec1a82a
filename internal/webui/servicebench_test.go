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
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/guardlog"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/views"
)

// BenchmarkServicePage renders the page of a service with 1,000 instances
// in a registry of 450 services and 60,000 instances (PostgreSQL): the
// service, its contract, its instances' addresses, overrides, guard
// history and quarantine transitions are read from the database, the
// verdicts and view from memory as in production. The figure is
// server-side time per page.
func BenchmarkServicePage(b *testing.B) {
	const services, total, big = 450, 60000, 1000
	pool := dbtest.New(b)
	ctx := b.Context()
	reg, err := registry.New(registry.Config{Pool: pool, Region: "local"})
	if err != nil {
		b.Fatal(err)
	}
	admin := identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
	for i := range services {
		spec := registry.ServiceSpec{Owner: fmt.Sprintf("team-%d", i%20), Capabilities: []registry.Capability{"passive", "probe", "self"}}
		if _, _, err := reg.PutService(ctx, admin, fmt.Sprintf("svc-%03d", i), spec); err != nil {
			b.Fatal(err)
		}
	}
	// svc-000 gets 1,000 instances, the others share the rest in turn.
	if _, err := pool.Exec(ctx, `
		INSERT INTO instances (id, service, address, port, zone, region, source, registered_by, created_at, updated_at)
		SELECT gen_random_uuid(), CASE WHEN g <= $1 THEN 'svc-000' ELSE format('svc-%s', lpad((1 + (g - $1 - 1) % $2)::text, 3, '0')) END,
		       format('10.%s.%s.%s', g / 65536, (g / 256) % 256, g % 256), 8080, format('az%s', g % 3), 'local', 'static', 'bench', now(), now()
		FROM generate_series(1, $3) AS g`, big, services-1, total); err != nil {
		b.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM instances`).Scan(&n); err != nil || n != total {
		b.Fatalf("%d instances in the registry: %v", n, err)
	}
	var ids []uuid.UUID
	rows, err := pool.Query(ctx, `SELECT id FROM instances WHERE service = 'svc-000' ORDER BY id`)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
	}
	if rows.Err() != nil || len(ids) != big {
		b.Fatalf("%d instances of svc-000: %v", len(ids), rows.Err())
	}

	now := time.Now()
	age := 3.0
	el := evaluator.ServiceEligibility{Service: "svc-000", GeneratedAt: now, Counts: map[string]int{"eligible": big}}
	for j, id := range ids {
		ev := map[string]evaluator.ClassEvidence{}
		for _, c := range []string{"probe", "self", "passive"} {
			ev[c] = evaluator.ClassEvidence{Present: true, LastSampleAt: &now, LastSampleAgeSeconds: &age}
		}
		el.Instances = append(el.Instances, evaluator.InstanceVerdict{InstanceID: id, Zone: fmt.Sprintf("az%d", j%3),
			State: "eligible", Weight: 1, Health: "known", Evidence: ev, Reasons: []string{}})
	}
	f := &fakeEstate{el: map[string]evaluator.ServiceEligibility{"svc-000": el}, views: map[string]*assembler.View{
		"svc-000": {Service: "svc-000", Version: 7, GeneratedAt: now, Zones: map[string]assembler.ZoneStatus{
			"az0": {Guard: "ok", Eligible: 333, Total: 333, MinHealthyFraction: 0.5, TrafficWeight: 1},
			"az1": {Guard: "ok", Eligible: 334, Total: 334, MinHealthyFraction: 0.5, TrafficWeight: 1},
			"az2": {Guard: "tripped", Eligible: 100, Total: 333, MinHealthyFraction: 0.5, TrafficWeight: 1},
		}}}}
	guards := guardlog.New(pool, nil)
	for i := range 20 {
		at := now.Add(-time.Duration(20-i) * time.Hour)
		guards.Record([]guardlog.Event{{Service: "svc-000", Zone: "az2", Tripped: true, At: at, Detail: "100 of 333 in rotation"},
			{Service: "svc-000", Zone: "az2", At: at.Add(10 * time.Minute)}})
	}
	if err := guards.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	pol, err := policy.New(policy.Config{Pool: pool, Verdicts: policy.VerdictsFunc(func(string) (assembler.ServiceInput, bool) {
		return assembler.ServiceInput{}, false
	})})
	if err != nil {
		b.Fatal(err)
	}
	u, err := New(Config{Pool: pool, Registry: reg, Evaluator: ownerread.Local(f), Publisher: f, Audit: audit.NewLog(pool), SessionCleanup: -1,
		Overrides: pol, Guards: guards,
		OIDC: OIDCConfig{IssuerURL: "https://id.example", ClientID: "ui", RedirectURL: "https://muster.example/ui/auth/callback"}})
	if err != nil {
		b.Fatal(err)
	}
	defer u.Close()
	req := httptest.NewRequest("GET", "/ui/services/svc-000", nil)
	pg := u.pageFor(admin)
	b.ReportAllocs()
	for b.Loop() {
		sp, err := u.buildServicePage(req.Context(), admin, pg, "svc-000")
		if err != nil {
			b.Fatal(err)
		}
		if len(sp.Instances) != big || len(sp.Guards) != 20 {
			b.Fatalf("%d instances, %d guard episodes", len(sp.Instances), len(sp.Guards))
		}
		for _, in := range sp.Instances {
			if in.Address == "" {
				b.Fatal("an instance without its address")
			}
		}
		if err := views.ServicePageView(sp).Render(req.Context(), io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}
