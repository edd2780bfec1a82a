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
	// The forged region drain drains nothing; muster's az1 shift, which
	// it applied verified, is held at the weight muster last verified
	// (0.10): a drain is never ended, or deepened, by a verification
	// failure.
	if w := s.Weights(); w == nil || w("az1") != 0.10 || w("az2") != 1 {
		t.Fatal("after the tampering: want az1 held at 0.10 and nothing else drained")
	}
	un := s.Unsealed()
	if len(un) != 1 || un[0].ID != forged.String() || un[0].Reason != seal.ErrUnsealed.Error() {
		t.Fatalf("unsealed: %+v, want the forged region drain alone", un)
	}
	held := s.Held()
	if len(held) != 1 || held[0].Row.ID != az1.ID || held[0].Row.Weight != 0.10 || !strings.Contains(held[0].Reason, seal.ErrBadSeal.Error()) {
		t.Fatalf("held: %+v, want az1 at 0.10, its row not verifying", held)
	}
	kinds := map[string]int{}
	for _, a := range s.Alarms() {
		kinds[a.Kind]++
	}
	if kinds[shift.AlarmShiftUnsealed] != 1 || kinds[shift.AlarmShiftHeld] != 1 {
		t.Fatalf("alarms: %+v", s.Alarms())
	}

	// The forged row cannot be moved by a person (which would seal it) ...
	clk.Advance(2 * time.Minute)
	if _, err := s.StepBack(ctx, admin, forged); !errors.Is(err, registry.ErrConflict) || !strings.Contains(err.Error(), "written outside muster") {
		t.Fatalf("step back of the forged drain: %v", err)
	}
	// ... nor by the worker; the held az1 shift returns on the worker's
	// timer from muster's own copy, written back and sealed anew.
	if err := s.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, admin, az1.ID)
	if err != nil || got.TrafficWeight != 0.25 || got.Step != 2 {
		t.Fatalf("the held az1 shift after the worker's step: %+v %v, want step 2 at 0.25", got, err)
	}
	if w := s.Weights(); w == nil || w("az1") != 0.25 || len(s.Held()) != 0 {
		t.Fatalf("after the step: az1 weight, held %+v", s.Held())
	}

	// The forged rows do not count against a zone drain's budget: az2
	// may be drained (web keeps az1 and az3, 2 of 3; counting the forged
	// region drain, it would keep none and be refused).
	if _, err := s.Drain(ctx, operator, shift.Request{Scope: "zone", Target: "az2", Reason: "az2 maintenance, CHG-12", Manual: &yes}); err != nil {
		t.Fatalf("drain az2 beside the forged rows: %v", err)
	}
	if w := s.Weights(); w == nil || w("az2") != 0 || w("az1") != 0.25 || w("az3") != 1 {
		t.Fatal("after a sealed drain of az2: only az2 is drained")
	}

	// Another replica with the key applies the same; one with another
	// key applies none.
	b := newShifts(t, pool, v, clk, sealed)
	if err := b.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if w := b.Weights(); w == nil || w("az2") != 0 || w("az1") != 0.25 || len(b.Unsealed()) != 1 {
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

// TestDrainNeverEndedByAVerificationFailure (issue 25): a drain muster
// applied stays applied, as muster last verified it, when its row is
// deleted by hand or set to an end muster did not seal; it is alarmed,
// and it returns only in steps, which write muster's copy back. An end
// muster sealed (the final confirmation) does end it.
func TestDrainNeverEndedByAVerificationFailure(t *testing.T) {
	t.Parallel()
	pool, v := fixture(t)
	clk := testclock.New(time.Date(2026, 12, 2, 2, 0, 0, 0, time.UTC))
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := newShifts(t, pool, v, clk, func(c *shift.Config) { c.Sealer = audit.NewKeySigner(priv); c.Steps = []float64{0.5, 1} })
	ctx := context.Background()
	az1, err := s.Drain(ctx, operator, shift.Request{Scope: "zone", Target: "az1", Reason: "az1 packet loss, INC-9", Manual: &yes})
	if err != nil {
		t.Fatal(err)
	}
	drained := func(want float64) {
		t.Helper()
		if err := s.Reload(ctx); err != nil {
			t.Fatal(err)
		}
		if w := s.Weights(); w == nil || w("az1") != want {
			t.Fatalf("az1's traffic weight is not %g (held %+v, unsealed %+v)", want, s.Held(), s.Unsealed())
		}
	}
	drained(0)

	// Deleted by hand: held at 0, alarmed.
	if _, err := pool.Exec(ctx, `DELETE FROM shifts WHERE id = $1`, az1.ID); err != nil {
		t.Fatal(err)
	}
	drained(0)
	if h := s.Held(); len(h) != 1 || !strings.Contains(h[0].Reason, "deleted outside muster") {
		t.Fatalf("held after the delete: %+v", h)
	}
	// A step writes muster's copy back and moves it.
	clk.Advance(2 * time.Minute)
	if sh, err := s.StepBack(ctx, operator, az1.ID); err != nil || sh.TrafficWeight != 0.5 {
		t.Fatalf("step the held drain: %+v %v", sh, err)
	}
	drained(0.5)
	if len(s.Held()) != 0 {
		t.Fatalf("still held after muster wrote it back: %+v", s.Held())
	}

	// Set to completed by hand (with the revision moved, as muster's
	// writes do): not muster's end, so held at 0.5.
	if _, err := pool.Exec(ctx, `UPDATE shifts SET state = 'completed', weight = 1, ended_at = now(), revision = nextval('shift_revisions') WHERE id = $1`, az1.ID); err != nil {
		t.Fatal(err)
	}
	drained(0.5)
	if h := s.Held(); len(h) != 1 || !strings.Contains(h[0].Reason, "that end does not verify") {
		t.Fatalf("held after a forged end: %+v", h)
	}
	// The confirmation, muster's own sealed end, ends it.
	clk.Advance(2 * time.Minute)
	if sh, err := s.Confirm(ctx, operator, az1.ID); err != nil || sh.State != shift.Completed {
		t.Fatalf("confirm the held drain: %+v %v", sh, err)
	}
	if err := s.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if w := s.Weights(); w != nil || len(s.Held()) != 0 {
		t.Fatalf("after muster's own end: weights applied, held %+v", s.Held())
	}
}
