package evaluator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
)

// BenchmarkIngest is the evaluator's share of a probe report, per report,
// in batches of 1,000 over 60,000 instances of 450 services, one prober
// assigned all of them: as taken from a reporter (Ingest: attributed,
// observed, counted into its window) and as forwarded by another replica
// (IngestForwarded: the same, the two proofs only the receiving replica
// can make left out). The figures are the ingest tier's own, without
// decoding or HTTP:
//
//	go test -run '^$' -bench BenchmarkIngest ./internal/evaluator/
func BenchmarkIngest(b *testing.B) {
	pool := dbtest.New(b)
	reg, err := registry.New(registry.Config{Pool: pool, Region: "local"})
	if err != nil {
		b.Fatal(err)
	}
	e, err := New(Config{Registry: reg, Pool: pool})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	const instances, services = 60_000, 450
	ids := make([]uuid.UUID, instances)
	var names []string
	e.mu.Lock()
	for i := range services {
		names = append(names, fmt.Sprintf("svc-%d", i))
		e.applyService(registry.ServiceContract{Service: registry.Service{Name: names[i]}, Contract: registry.DefaultContract(), ContractVersion: 1})
	}
	for i := range ids {
		ids[i] = uuid.New()
		e.applyInstance(registry.Instance{ID: ids[i], Service: names[i%services], Address: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
			Port: 8080, Zone: "az1", State: registry.StateActive}, now)
	}
	e.probers["prober-1"] = e.applyAssignment(registry.ProberAssignments{Prober: "prober-1", Services: names})
	e.mu.Unlock()
	e.ready.Store(true)
	actor := identity.Principal{Kind: identity.KindProber, Subject: "prober-1"}
	batch := make([]Report, 1000)
	for _, tc := range []struct {
		name   string
		ingest func(context.Context, identity.Principal, []Report) (Result, error)
	}{{"local", e.Ingest}, {"forwarded", e.IngestForwarded}} {
		b.Run(tc.name, func(b *testing.B) {
			next := 0
			for b.Loop() {
				for j := range batch {
					batch[j] = Report{InstanceID: ids[next], Class: "probe", Outcome: "success"}
					next = (next + 1) % instances
				}
				res, err := tc.ingest(context.Background(), actor, batch)
				if err != nil || res.Accepted != len(batch) {
					b.Fatalf("accepted %d of %d: %v %+v", res.Accepted, len(batch), err, res.Refused[:min(1, len(res.Refused))])
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/report")
		})
	}
}
