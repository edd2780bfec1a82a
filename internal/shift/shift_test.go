package shift_test

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/internal/testclock"
)

var (
	admin    = identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
	operator = identity.Principal{Kind: identity.KindOperator, Subject: "oscar", Team: "payments", Role: identity.RoleOperator}
	yes, no  = true, false
)

// verdicts serves fixed snapshots; a service it does not know reads as
// "evaluator not ready".
type verdicts map[string]assembler.ServiceInput

func (v verdicts) Snapshot(s string) (assembler.ServiceInput, bool) { x, ok := v[s]; return x, ok }

// fixture registers web with one instance in each of az1..az3 and returns
// matching verdicts (all eligible).
func fixture(t *testing.T) (*pgxpool.Pool, verdicts) {
	t.Helper()
	pool := dbtest.New(t)
	ctx := context.Background()
	reg, err := registry.New(registry.Config{Pool: pool, Region: "local"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := reg.PutService(ctx, admin, "web", registry.ServiceSpec{Owner: "payments", Capabilities: []registry.Capability{registry.CapProbe}}); err != nil {
		t.Fatal(err)
	}
	snap := assembler.ServiceInput{Name: "web", MinHealthyFraction: 0.5}
	for i, z := range []string{"az1", "az2", "az3"} {
		in, err := reg.Register(ctx, admin, netip.Addr{}, "web", registry.Registration{Address: "10.0.0." + string(rune('1'+i)), Port: 80, Zone: z})
		if err != nil {
			t.Fatal(err)
		}
		snap.Instances = append(snap.Instances, assembler.InstanceInput{ID: in.ID, Zone: z, State: eligibility.Eligible, Weight: 1})
	}
	return pool, verdicts{"web": snap}
}

func newShifts(t *testing.T, pool *pgxpool.Pool, v shift.Verdicts, clk *testclock.Clock, adjust func(*shift.Config)) *shift.Service {
	t.Helper()
	cfg := shift.Config{Pool: pool, Region: "local", Verdicts: v, Now: clk.Now}
	if adjust != nil {
		adjust(&cfg)
	}
	s, err := shift.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestValidShiftSteps(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		steps []float64
		ok    bool
	}{
		{shift.DefaultSteps, true},
		{[]float64{1}, true},
		{[]float64{0.5, 1}, true},
		{nil, false},
		{[]float64{0.5}, false},
		{[]float64{0, 1}, false},
		{[]float64{0.5, 0.5, 1}, false},
		{[]float64{0.5, 0.25, 1}, false},
		{[]float64{0.5, 1.5}, false},
	} {
		if err := shift.ValidSteps(tc.steps); (err == nil) != tc.ok {
			t.Errorf("ValidShiftSteps(%v) = %v, want ok=%v", tc.steps, err, tc.ok)
		}
	}
}

// TestWeightsTakeTheLowest: a zone under its own shift and the region's
// gets the lower weight; other zones get the region's.
func TestWeightsTakeTheLowest(t *testing.T) {
	t.Parallel()
	pool, v := fixture(t)
	clk := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	s := newShifts(t, pool, v, clk, nil)
	start := s.Revision()
	ctx := context.Background()
	if w := s.Weights(); w != nil {
		t.Fatalf("no shifts: weights %v, want nil (1 everywhere)", w)
	}
	az1, err := s.Drain(ctx, operator, shift.Request{Scope: "zone", Target: "az1", Reason: "az1 is losing packets", Manual: &no})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	if _, err := s.StepBack(ctx, operator, az1.ID); err != nil {
		t.Fatal(err)
	}
	w := s.Weights()
	if w("az1") != 0.10 || w("az2") != 1 {
		t.Fatalf("az1 %g az2 %g, want 0.10 and 1", w("az1"), w("az2"))
	}
	if _, err := s.Drain(ctx, admin, shift.Request{Scope: "region", Target: "local", Reason: "regional evacuation", Manual: &yes}); err != nil {
		t.Fatal(err)
	}
	w = s.Weights()
	if w("az1") != 0 || w("az2") != 0 || w("anywhere") != 0 {
		t.Fatalf("region drained: az1 %g az2 %g", w("az1"), w("az2"))
	}
	if changed := s.Revision() - start; changed != 3 {
		t.Fatalf("Revision moved %d times for 3 changes", changed)
	}
	// Nothing changed: a reload does not move Revision.
	if err := s.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if changed := s.Revision() - start; changed != 3 {
		t.Fatalf("Revision moved on a reload that found no change")
	}
}

// TestShortLadderAndConfirm: with steps 0.5, 1 a manual shift is pending
// confirmation after one step, and Confirm completes it.
func TestShortLadderAndConfirm(t *testing.T) {
	t.Parallel()
	pool, v := fixture(t)
	clk := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	s := newShifts(t, pool, v, clk, func(c *shift.Config) {
		c.Steps, c.Dwell, c.PendingAlarmAfter = []float64{0.5, 1}, time.Minute, 5*time.Minute
	})
	ctx := context.Background()
	sh, err := s.Drain(ctx, operator, shift.Request{Scope: "zone", Target: "az2", Reason: "az2 network partition", Manual: &yes})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Confirm(ctx, operator, sh.ID); !errors.Is(err, shift.ErrDwell) {
		t.Fatalf("confirm inside the dwell: %v", err)
	}
	clk.Advance(time.Minute)
	// Confirming a drained shift that is not yet at its last step is a
	// state conflict, not a shortcut.
	if _, err := s.Confirm(ctx, operator, sh.ID); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("confirm from drained: %v", err)
	}
	got, err := s.StepBack(ctx, operator, sh.ID)
	if err != nil || got.State != shift.PendingConfirmation || got.TrafficWeight != 0.5 {
		t.Fatalf("step: %+v %v", got, err)
	}
	clk.Advance(5 * time.Minute)
	if al := s.Alarms(); len(al) != 1 || al[0].Kind != shift.AlarmShiftbackPending || al[0].Zone != "az2" {
		t.Fatalf("alarms %+v", al)
	}
	done, err := s.Confirm(ctx, admin, sh.ID)
	if err != nil || done.State != shift.Completed || done.TrafficWeight != 1 || *done.ConfirmedBy != "operator:alice" {
		t.Fatalf("confirm: %+v %v", done, err)
	}
	if al := s.Alarms(); len(al) != 0 {
		t.Fatalf("alarms after confirm %+v", al)
	}
	if w := s.Weights(); w != nil {
		t.Fatalf("weights after completion: az2 %g", w("az2"))
	}
}

// TestDrainWithoutVerdictsIsRefused: the budget cannot be checked while the
// evaluator rebuilds; nothing is drained.
func TestDrainWithoutVerdictsIsRefused(t *testing.T) {
	t.Parallel()
	pool, _ := fixture(t)
	clk := testclock.New(time.Now())
	s := newShifts(t, pool, verdicts{}, clk, nil)
	_, err := s.Drain(context.Background(), operator, shift.Request{Scope: "zone", Target: "az1", Reason: "az1 is losing packets", Manual: &yes})
	if !errors.Is(err, evaluator.ErrNotReady) {
		t.Fatalf("drain with no verdicts: %v", err)
	}
	list, err := s.List(context.Background(), operator, shift.Filter{})
	if err != nil || len(list) != 0 {
		t.Fatalf("shifts after a failed drain: %+v %v", list, err)
	}
}

// TestTwoReplicasTakeOneStep: replicas ticking together take a due
// automatic step once.
func TestTwoReplicasTakeOneStep(t *testing.T) {
	t.Parallel()
	pool, v := fixture(t)
	clk := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	a := newShifts(t, pool, v, clk, nil)
	b := newShifts(t, pool, v, clk, nil)
	ctx := context.Background()
	sh, err := a.Drain(ctx, operator, shift.Request{Scope: "zone", Target: "az3", Reason: "automatic failover of az3", Manual: &no})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	if _, err := a.StepBack(ctx, operator, sh.ID); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, s := range []*shift.Service{a, b} {
		wg.Go(func() { errs[i] = s.RunOnce(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	got, err := b.Get(ctx, admin, sh.ID)
	if err != nil || got.TrafficWeight != 0.25 || got.Step != 2 {
		t.Fatalf("after both replicas ticked: %+v %v", got, err)
	}
	// A replica whose tick found the step being taken by the other (its
	// row locked) loads it on its next tick.
	if err := b.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if w := b.Weights(); w == nil || w("az3") != 0.25 {
		t.Fatal("replica b did not load the step")
	}
	evs, err := audit.List(ctx, db.New(pool), audit.Filter{Actor: "system:shifts", Limit: 10})
	if err != nil || len(evs) != 1 {
		t.Fatalf("system steps audited: %d %v", len(evs), err)
	}
	if _, err := audit.Verify(ctx, db.New(pool)); err != nil {
		t.Fatal(err)
	}
}

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestRedrainDuringTheReturn: a region drain whose traffic is returning
// goes back to traffic weight 0 at once when its target fails again (no
// dwell: draining waits for nothing), audited as shift.redrain; its steps
// back start over after the dwell; a draining shift cannot be drained
// again, and an operator may not drain a region.
func TestRedrainDuringTheReturn(t *testing.T) {
	t.Parallel()
	pool, v := fixture(t)
	clk := testclock.New(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	s := newShifts(t, pool, v, clk, nil)
	ctx := context.Background()
	sh, err := s.Drain(ctx, admin, shift.Request{Scope: "region", Target: "local", Reason: "the routing control turned local off", Manual: &yes})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Redrain(ctx, admin, sh.ID, "off again"); err == nil {
		t.Fatal("a draining shift drained again")
	}
	clk.Advance(2 * time.Minute)
	if _, err := s.StepBack(ctx, admin, sh.ID); err != nil {
		t.Fatal(err)
	}
	if w := s.Weights(); w("az1") != 0.10 {
		t.Fatalf("after a step back: %g", w("az1"))
	}
	if _, err := s.Redrain(ctx, operator, sh.ID, "off again"); err == nil {
		t.Fatal("an operator drained a region")
	}
	got, err := s.Redrain(ctx, admin, sh.ID, "the routing control turned local off again") // within the dwell
	if err != nil {
		t.Fatal(err)
	}
	if got.State != shift.Draining || got.Step != 0 || got.TrafficWeight != 0 {
		t.Fatalf("redrained: %+v", got)
	}
	if w := s.Weights(); w("az1") != 0 || w("az2") != 0 {
		t.Fatalf("redrained weights: az1 %g az2 %g", w("az1"), w("az2"))
	}
	if _, err := s.StepBack(ctx, admin, sh.ID); !errors.Is(err, shift.ErrDwell) {
		t.Fatalf("a step back right after the redrain: %v, want the dwell", err)
	}
	clk.Advance(2 * time.Minute)
	if got, err := s.StepBack(ctx, admin, sh.ID); err != nil || got.TrafficWeight != 0.10 {
		t.Fatalf("the return, starting over: %+v, %v", got, err)
	}
	// A zone drain is never drained again this way: that would skip the
	// budget its drain was checked against.
	az, err := s.Drain(ctx, operator, shift.Request{Scope: "zone", Target: "az1", Reason: "az1 is losing packets", Manual: &no})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	if _, err := s.StepBack(ctx, operator, az.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Redrain(ctx, admin, az.ID, "again"); err == nil {
		t.Fatal("a zone drain drained again without its budget")
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit_events WHERE action = 'shift.redrain' AND outcome = 'accepted'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("shift.redrain audit rows: %d, %v", n, err)
	}
}
