package shift_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/internal/testclock"
)

// TestShiftsWrittenOutsideMusterDrainNothing plays a hostile database
// administrator against the shifts table: a region drain inserted by
// hand, and a sealed zone shift on its way back set to weight 0 again.
// Neither drains anything, neither counts against a drain's budget, both
// are listed and alarmed, neither can be stepped (which would seal it),
// and the worker leaves them alone; the shifts muster wrote (a drain, its
// steps by a person and by the worker) are applied by every replica with
// the key.
func TestShiftsWrittenOutsideMusterDrainNothing(t *testing.T) {
	t.Parallel()
	pool, v := fixture(t)
	clk := testclock.New(time.Date(2026, 12, 2, 2, 0, 0, 0, time.UTC))
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key := audit.NewKeySigner(priv)
	sealed := func(c *shift.Config) { c.Sealer = key }
	s := newShifts(t, pool, v, clk, sealed)
	ctx := context.Background()

	// muster's own drain of az1, automatic, stepped back once by oscar.
	az1, err := s.Drain(ctx, operator, shift.Request{Scope: "zone", Target: "az1", Reason: "az1 packet loss, INC-9", Manual: &no})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	if _, err := s.StepBack(ctx, operator, az1.ID); err != nil {
		t.Fatal(err)
	}
	if w := s.Weights(); w == nil || w("az1") != 0.10 {
		t.Fatal("muster's own shift of az1 is not applied at 0.10")
	}

	// 1. A region drain inserted by hand in alice's name.
	forged := uuid.Must(uuid.NewV7())
	if _, err := pool.Exec(ctx, `INSERT INTO shifts (id, scope, target, reason, manual, state, step, weight,
		started_by, started_at, last_step_at, last_step_by, updated_at)
		VALUES ($1, 'region', 'local', 'looks like a real failover', true, 'draining', 0, 0,
		'operator:alice', $2, $2, 'operator:alice', $2)`, forged, clk.Now()); err != nil {
		t.Fatal(err)
	}
	// 2. muster's az1 shift set back to weight 0 by hand.
	if _, err := pool.Exec(ctx, `UPDATE shifts SET weight = 0, step = 0, revision = nextval('shift_revisions') WHERE id = $1`, az1.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if w := s.Weights(); w != nil {
		t.Fatalf("shifts written outside muster are applied: az1 %g, az2 %g", w("az1"), w("az2"))
	}
	un := s.Unsealed()
	if len(un) != 2 {
		t.Fatalf("unsealed: %+v", un)
	}
	reasons := map[string]string{}
	for _, u := range un {
		reasons[u.ID] = u.Reason
	}
	if reasons[forged.String()] != seal.ErrUnsealed.Error() || reasons[az1.ID.String()] != seal.ErrBadSeal.Error() {
		t.Fatalf("unsealed reasons: %v", reasons)
	}
	alarms := 0
	for _, a := range s.Alarms() {
		if a.Kind == shift.AlarmShiftUnsealed && strings.Contains(a.Detail, "the table was written outside muster") {
			alarms++
		}
	}
	if alarms != 2 {
		t.Fatalf("%d shift_unsealed alarms, want 2: %+v", alarms, s.Alarms())
	}

	// Neither can be moved by a person (which would seal it) ...
	clk.Advance(2 * time.Minute)
	for _, id := range []uuid.UUID{forged, az1.ID} {
		if _, err := s.StepBack(ctx, admin, id); !errors.Is(err, registry.ErrConflict) || !strings.Contains(err.Error(), "written outside muster") {
			t.Fatalf("step back of %s: %v", id, err)
		}
	}
	// ... nor by the worker, due as it is.
	if err := s.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, admin, az1.ID)
	if err != nil || got.TrafficWeight != 0 || got.Step != 0 {
		t.Fatalf("the worker moved a tampered shift: %+v %v", got, err)
	}

	// The forged rows do not count against a zone drain's budget: az2
	// may be drained (web keeps az1 and az3, 2 of 3; counting the forged
	// region drain, it would keep none and be refused).
	if _, err := s.Drain(ctx, operator, shift.Request{Scope: "zone", Target: "az2", Reason: "az2 maintenance, CHG-12", Manual: &yes}); err != nil {
		t.Fatalf("drain az2 beside the forged rows: %v", err)
	}
	if w := s.Weights(); w == nil || w("az2") != 0 || w("az1") != 1 || w("az3") != 1 {
		t.Fatal("after a sealed drain of az2: only az2 is drained")
	}

	// Another replica with the key applies the same; one with another
	// key applies none.
	b := newShifts(t, pool, v, clk, sealed)
	if err := b.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if w := b.Weights(); w == nil || w("az2") != 0 || w("az1") != 1 || len(b.Unsealed()) != 2 {
		t.Fatalf("replica b: unsealed %+v", b.Unsealed())
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	c := newShifts(t, pool, v, clk, func(c *shift.Config) { c.Sealer = audit.NewKeySigner(other) })
	if err := c.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if w := c.Weights(); w != nil || len(c.Unsealed()) != 3 {
		t.Fatalf("a replica with another key: unsealed %+v", c.Unsealed())
	}
}
