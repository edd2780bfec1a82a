package registry_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/registry"
)

// TestEveryEndIsRecorded: each way the registry ends an instance
// (replaced by a new registration of its endpoint, deregistered, expired
// by the reaper, ended and replaced by reconciliation) records the end in
// the audit chain with the instance's id, sealed, so that EndsOnRecord finds
// it; a live instance has no record, and a record sealed by a key the
// registry does not trust is not believed.
func TestEveryEndIsRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.New(registry.Config{Pool: e.pool, Region: "eu-west-1", Now: e.clock.Now, LeaseClock: e.clock.Now, Sealer: audit.NewKeySigner(key)})
	if err != nil {
		t.Fatal(err)
	}
	// The services newEnv made without a key are adopted, as the first
	// keyed replica's authorisation copy does at its start.
	if _, err := reg.AdoptAuthzUnsealed(ctx); err != nil {
		t.Fatal(err)
	}
	register := func(addr string, port int) registry.Instance {
		t.Helper()
		in, err := reg.Register(ctx, oscar, loopback, "web", registry.Registration{Address: addr, Port: port, Zone: "az1"})
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	replaced := register("10.0.0.1", 8080)
	replacement := register("10.0.0.1", 8080) // replaces it; expired below
	deregistered := register("10.0.0.2", 8080)
	if _, err := reg.Deregister(ctx, oscar, deregistered.ID); err != nil {
		t.Fatal(err)
	}
	live := register("10.0.0.4", 8080)
	expired := register("10.0.0.3", 8080)
	rp, err := registry.NewReaper(registry.ReaperConfig{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := rp.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(25 * time.Second)
		if _, err := reg.Renew(ctx, oscar, live.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rp.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	const source = "snapshot/fleet"
	rec := func(key, addr string) registry.Instance {
		return registry.Instance{ID: registry.ReconciledID(source, "web", key), Service: "web", Address: addr, Port: 9090, Zone: "az1"}
	}
	if _, err := reg.ApplyReconcile(ctx, source, registry.ReconcileChange{Create: []registry.Instance{rec("a", "10.0.1.1"), rec("b", "10.0.1.2")}}); err != nil {
		t.Fatal(err)
	}
	reconciledEnd := rec("a", "").ID
	if _, err := reg.ApplyReconcile(ctx, source, registry.ReconcileChange{End: []uuid.UUID{reconciledEnd}}); err != nil {
		t.Fatal(err)
	}

	want := map[uuid.UUID]string{
		replaced.ID: registry.StateReplaced, deregistered.ID: registry.StateDeregistered,
		expired.ID: registry.StateExpired, replacement.ID: registry.StateExpired, reconciledEnd: registry.StateDeregistered,
	}
	ids := []uuid.UUID{live.ID, rec("b", "").ID}
	for id := range want {
		ids = append(ids, id)
	}
	ends, forged, err := reg.EndsOnRecord(ctx, ids)
	if err != nil || forged != 0 {
		t.Fatalf("EndsOnRecord: %v (%d forged)", err, forged)
	}
	if len(ends) != len(want) {
		t.Fatalf("%d ends on record, want %d: %+v", len(ends), len(want), ends)
	}
	for id, state := range want {
		got, err := reg.GetInstance(ctx, admin, id)
		if err != nil {
			t.Fatal(err)
		}
		if end := ends[id]; end.State != state || got.EndedAt == nil || !end.EndedAt.Equal(*got.EndedAt) {
			t.Errorf("the end of %s on record: %+v, want %s at %v", id, end, state, got.EndedAt)
		}
	}
	if n := len(e.events(t, audit.Filter{Action: audit.ActionEndRecord})); n != len(want) {
		t.Errorf("%d end.record events, want %d", n, len(want))
	}

	// A replica that trusts another key only believes none of them.
	_, otherKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, err := registry.New(registry.Config{Pool: e.pool, Region: "eu-west-1", Now: e.clock.Now, LeaseClock: e.clock.Now, Sealer: audit.NewKeySigner(otherKey)})
	if err != nil {
		t.Fatal(err)
	}
	ends, forged, err = other.EndsOnRecord(ctx, ids)
	if err != nil || len(ends) != 0 || forged != len(want) {
		t.Fatalf("another key: %d ends believed, %d not (%v); want 0 and %d", len(ends), forged, err, len(want))
	}
	if _, err := audit.Verify(ctx, e.q); err != nil {
		t.Fatal(err)
	}
}
