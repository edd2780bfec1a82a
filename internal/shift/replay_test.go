package shift_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/internal/testclock"
)

// TestCompletedShiftWrittenBackDrainsNothing: a shift muster completed,
// written back by hand to its first, sealed, draining version (issue 25,
// no replay), drains nothing, on this replica and on a new one, and is
// listed and raised as a shift_replayed alarm.
func TestCompletedShiftWrittenBackDrainsNothing(t *testing.T) {
	t.Parallel()
	pool, v := fixture(t)
	clk := testclock.New(time.Date(2026, 12, 2, 2, 0, 0, 0, time.UTC))
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sealed := func(c *shift.Config) { c.Sealer = audit.NewKeySigner(priv) }
	s := newShifts(t, pool, v, clk, sealed)
	ctx := context.Background()

	az1, err := s.Drain(ctx, operator, shift.Request{Scope: "zone", Target: "az1", Reason: "az1 packet loss, INC-10", Manual: &no})
	if err != nil {
		t.Fatal(err)
	}
	// The drain as sealed, kept by whoever means to write it back.
	var (
		sig      []byte
		key      *string
		lastStep time.Time
	)
	if err := pool.QueryRow(ctx, `SELECT seal, seal_key, last_step_at FROM shifts WHERE id = $1`, az1.ID).Scan(&sig, &key, &lastStep); err != nil {
		t.Fatal(err)
	}
	for cur := az1; cur.State != shift.Completed; {
		clk.Advance(10 * time.Minute)
		if cur, err = s.StepBack(ctx, operator, az1.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if w := s.Weights(); w != nil && w("az1") != 1 {
		t.Fatalf("az1 at %g after its shift completed", w("az1"))
	}

	if _, err := pool.Exec(ctx, `UPDATE shifts SET state = 'draining', step = 0, weight = 0, last_step_at = $2, last_step_by = started_by,
		ended_at = NULL, seal = $3, seal_key = $4, revision = nextval('shift_revisions') WHERE id = $1`, az1.ID, lastStep, sig, key); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*shift.Service{s, newShifts(t, pool, v, clk, sealed)} {
		if err := r.Reload(ctx); err != nil {
			t.Fatal(err)
		}
		if w := r.Weights(); w != nil && w("az1") != 1 {
			t.Fatalf("the completed shift written back drains az1 to %g", w("az1"))
		}
		if un := r.Unsealed(); len(un) != 0 {
			t.Fatalf("its seal verifies, yet unsealed lists %+v", un)
		}
		rp := r.Replayed()
		if len(rp) != 1 || rp[0].ID != az1.ID.String() || !strings.Contains(rp[0].Reason, "muster ended it (completed at") {
			t.Fatalf("replayed: %+v", rp)
		}
		alarms := 0
		for _, a := range r.Alarms() {
			if a.Kind == shift.AlarmShiftReplayed && a.Zone == "az1" {
				alarms++
			}
		}
		if alarms != 1 {
			t.Fatalf("alarms: %+v", r.Alarms())
		}
	}
}
