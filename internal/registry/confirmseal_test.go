package registry_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/registry"
)

// TestConfirmationsWrittenByHandReleaseNothing: a database administrator
// inserts confirmation rows by hand (a mass lease expiry's, a
// reconciliation source's, a reload of services and grants'): none
// releases anything, each is alarmed as confirmation_unsealed, and a
// forged row newer than a genuine one does not hide it. A confirmation
// given through muster (sealed) still releases the hold.
func TestConfirmationsWrittenByHandReleaseNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := registry.New(registry.Config{Pool: e.pool, Region: "eu-west-1", Now: e.clock.Now, LeaseClock: e.clock.Now, Sealer: audit.NewKeySigner(key)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sealed.AdoptAuthzUnsealed(ctx); err != nil {
		t.Fatal(err)
	}
	e.reg = sealed
	for i := range 5 {
		e.mustService(t, fmt.Sprintf("svc%d", i), "payments")
	}
	var all []registry.Instance
	for i := range 5 {
		all = append(all, e.register(t, fmt.Sprintf("svc%d", i), 20, 2000)...)
	}
	rp := e.reaper(t, registry.ReaperConfig{})
	alive := all[20:] // svc0 stops: 20 of the region's 100
	for range 6 {
		e.clock.Advance(10 * time.Second)
		e.renew(t, alive)
		if n := e.reap(t, rp); n != 0 {
			t.Fatalf("expired %d of 20 leases that stopped together", n)
		}
	}
	if h := rp.Holds(); len(h) != 1 || h[0].Held != 20 {
		t.Fatalf("holds %+v, want the region's 20 held", h)
	}

	// By hand: a confirmation of the region, of a reconciliation source
	// and of a held authorisation reload, each as muster would have
	// written it but without a seal; then one with a copied seal and
	// another reason.
	at := e.clock.Now().Add(time.Second)
	if _, err := e.pool.Exec(ctx, `INSERT INTO lease_expiry_confirmations (scope, confirmed_at, confirmed_by, reason) VALUES ('', $1, 'operator:mallory', 'by hand')`, at); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO reconcile_confirmations (source, confirmed_at, confirmed_by, reason, instances) VALUES ('snapshot/fleet', $1, 'operator:mallory', 'by hand', $2)`, at, []uuid.UUID{all[0].ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO authz_reload_confirmations (confirmed_at, confirmed_by, reason) VALUES ($1, 'operator:mallory', 'by hand')`, at); err != nil {
		t.Fatal(err)
	}
	if n := e.reap(t, rp); n != 0 {
		t.Fatalf("a confirmation written by hand expired %d leases", n)
	}
	if h := rp.Holds(); len(h) != 1 || h[0].Held != 20 {
		t.Fatalf("holds after a hand-written confirmation: %+v", h)
	}
	confs, err := sealed.SourceConfirmationsSince(ctx, "snapshot/fleet", at.Add(-time.Minute))
	if err != nil || len(confs) != 0 {
		t.Fatalf("reconcile confirmations believed = %+v, %v; want none", confs, err)
	}
	authz, err := registry.NewAuthzCache(registry.AuthzCacheConfig{Registry: sealed, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if err := authz.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	unsealed := map[string]bool{}
	for _, a := range sealed.ConfirmationAlarms() {
		if a.Kind != registry.AlarmConfirmationUnsealed {
			t.Errorf("alarm %+v", a)
		}
		for _, table := range []string{"lease_expiry_confirmations", "reconcile_confirmations", "authz_reload_confirmations"} {
			if strings.HasPrefix(a.Detail, table+" row ") {
				unsealed[table] = true
			}
		}
	}
	if len(unsealed) != 3 {
		t.Fatalf("confirmation_unsealed raised for %v; want all three tables", unsealed)
	}

	// The genuine confirmation releases the hold, and a forged one made
	// later (a genuine row's seal copied onto another reason) hides
	// nothing: the reaper takes the newest that verifies.
	e.clock.Advance(2 * time.Second)
	c, err := sealed.ConfirmLeaseExpiry(ctx, admin, region, "rack 7 lost power; they are gone")
	if err != nil || c.Released != 20 {
		t.Fatalf("genuine confirmation: %+v, %v; want 20 released", c, err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO lease_expiry_confirmations (scope, confirmed_at, confirmed_by, reason, seal, seal_key)
		SELECT scope, confirmed_at + interval '1 second', confirmed_by, 'copied', seal, seal_key FROM lease_expiry_confirmations WHERE seal IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if n := e.reap(t, rp); n != 20 {
		t.Fatalf("after the genuine confirmation: expired %d, want 20", n)
	}
}
