package registry

import (
	"fmt"
	"slices"
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

// TestRefusedRenewalsShareOfTheTable: one identity refused for a storm
// of renewals of made-up instances cannot take the table of refused
// renewals from the others. Once it is full, an identity with fewer kept
// than the one holding most takes that one's oldest place; the one
// holding most gets nothing more (its new ones are dropped and counted).
// So genuine refused renewals noted after the flood are kept, those noted
// before it survive it, and an identity holding most of the table keeps
// at least an even share against a flooder.
func TestRefusedRenewalsShareOfTheTable(t *testing.T) {
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
	mallory := identity.Principal{Kind: identity.KindWorkload, Service: "mallory", Subject: "mallory"}
	web := identity.Principal{Kind: identity.KindWorkload, Service: "web", Subject: "web"}
	api := identity.Principal{Kind: identity.KindWorkload, Service: "api", Subject: "api"}
	flood := func(p identity.Principal, n int) []uuid.UUID {
		ids := make([]uuid.UUID, n)
		for done := 0; done < n; {
			batch := make([]LeaseRenewal, min(MaxRenewalBatch, n-done)) // as the batch endpoint takes them
			for i := range batch {
				batch[i].ID = uuid.New()
				ids[done+i] = batch[i].ID
			}
			reg.NoteRefusedRenewals(p, batch)
			done += len(batch)
			clk.Advance(time.Millisecond)
		}
		return ids
	}
	kept := func(p identity.Principal, ids []uuid.UUID) int {
		n := 0
		for _, id := range ids {
			if slices.ContainsFunc(reg.refused.byID[id], func(x refusedRenewal) bool { return x.key == p.String() }) {
				n++
			}
		}
		return n
	}
	dropped := func() float64 { return testutil.ToFloat64(reg.metrics.refusedRenewals.WithLabelValues("dropped")) }

	// api's refused renewals come before the flood, web's after it.
	before := flood(api, 1000)
	flood(mallory, maxRefusedRenewals)
	if got := reg.RefusedRenewalsPending(); got != maxRefusedRenewals {
		t.Fatalf("pending %d after the flood, want the cap %d", got, maxRefusedRenewals)
	}
	if d := dropped(); d != 1000 {
		t.Fatalf("dropped %v, want mallory's 1,000 past the cap", d)
	}
	after := flood(web, 1000)
	if got := kept(web, after); got != len(after) {
		t.Errorf("web's refused renewals after the flood: %d of %d kept", got, len(after))
	}
	if got := kept(api, before); got != len(before) {
		t.Errorf("api's refused renewals before the flood: %d of %d kept", got, len(before))
	}
	// More of the flood changes nothing for them: mallory holds the most.
	flood(mallory, maxRefusedRenewals)
	if d := dropped(); d != 1000+maxRefusedRenewals {
		t.Errorf("dropped %v, want all of mallory's second flood (%d more)", d, maxRefusedRenewals)
	}
	if kept(web, after) != len(after) || kept(api, before) != len(before) {
		t.Errorf("a second flood pushed out web's (%d kept) or api's (%d kept)", kept(web, after), kept(api, before))
	}
	if got := reg.RefusedRenewalsPending(); got != maxRefusedRenewals {
		t.Fatalf("pending %d, want the cap %d", got, maxRefusedRenewals)
	}

	// A large genuine fleet holding most of the table keeps an even share.
	reg.refused.take()
	big := flood(web, maxRefusedRenewals*3/4)
	flood(mallory, maxRefusedRenewals)
	if got := kept(web, big); got < maxRefusedRenewals/2 {
		t.Errorf("web's fleet kept %d against mallory's flood, want at least half the table (%d)", got, maxRefusedRenewals/2)
	}
	if got := reg.RefusedRenewalsPending(); got != maxRefusedRenewals {
		t.Fatalf("pending %d, want the cap %d", got, maxRefusedRenewals)
	}
}
