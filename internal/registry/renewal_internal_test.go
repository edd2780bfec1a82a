package registry

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/testclock"
)

// TestRefusedRenewalsAreBounded: refused renewals are kept per instance,
// the latest per identity, for at most maxRefusedActors identities (the
// oldest gives way), and at most maxRefusedRenewals in all: those older
// than a TTL make room, and past that a refused renewal is dropped and
// counted. Nothing here touches the database.
func TestRefusedRenewalsAreBounded(t *testing.T) {
	pool, err := pgxpool.New(t.Context(), "host=/nonexistent dbname=none") // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	clk := testclock.New(time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC))
	reg, err := New(Config{Pool: pool, Region: "local", Now: clk.Now, LeaseClock: clk.Now, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	workload := func(service string) identity.Principal {
		return identity.Principal{Kind: identity.KindWorkload, Service: service, Subject: service}
	}
	id := uuid.Must(uuid.NewV7())
	one := []LeaseRenewal{{ID: id, Credential: PresentedCredential("first")}}

	reg.NoteRefusedRenewals(workload("web"), one)
	clk.Advance(time.Second)
	reg.NoteRefusedRenewals(workload("web"), []LeaseRenewal{{ID: id, Credential: PresentedCredential("second")}})
	notes := reg.refused.byID[id]
	if len(notes) != 1 || !notes[0].at.Equal(clk.Now()) || *notes[0].cred.sum != *PresentedCredential("second").sum {
		t.Fatalf("web's two refused renewals of one instance: %+v, want the latest alone", notes)
	}
	for i := range maxRefusedActors {
		clk.Advance(time.Second)
		reg.NoteRefusedRenewals(workload(fmt.Sprint("svc", i)), one)
	}
	notes = reg.refused.byID[id]
	if len(notes) != maxRefusedActors {
		t.Fatalf("%d refused renewals of one instance kept, want %d", len(notes), maxRefusedActors)
	}
	for _, n := range notes {
		if n.key == workload("web").String() {
			t.Fatalf("the oldest identity's refused renewal was kept over newer ones: %+v", notes)
		}
	}
	if got := reg.RefusedRenewalsPending(); got != maxRefusedActors {
		t.Fatalf("pending %d, want %d", got, maxRefusedActors)
	}

	fill := func() {
		batch := make([]LeaseRenewal, maxRefusedRenewals)
		for i := range batch {
			batch[i].ID = uuid.New()
		}
		reg.NoteRefusedRenewals(workload("web"), batch)
	}
	fill()
	if got := reg.RefusedRenewalsPending(); got != maxRefusedRenewals {
		t.Fatalf("pending %d after filling, want the cap %d", got, maxRefusedRenewals)
	}
	dropped := testutil.ToFloat64(reg.metrics.refusedRenewals.WithLabelValues("dropped"))
	if dropped != maxRefusedActors {
		t.Fatalf("dropped %v filling up, want %d (the cap was reached that many short)", dropped, maxRefusedActors)
	}
	// A TTL on, they make room for new ones.
	clk.Advance(DefaultLeaseTTL)
	reg.NoteRefusedRenewals(workload("web"), []LeaseRenewal{{ID: uuid.New()}})
	if got := reg.RefusedRenewalsPending(); got != 1 {
		t.Fatalf("pending %d after the old ones made room, want 1", got)
	}
	if got := testutil.ToFloat64(reg.metrics.renewalsRefused); got != float64(2+maxRefusedActors+maxRefusedRenewals+1) {
		t.Fatalf("muster_lease_renewals_refused_total %v", got)
	}
}
