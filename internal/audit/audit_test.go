package audit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/audit"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func entry(i int) audit.Entry {
	return audit.Entry{
		ActorKind: "operator", Actor: "operator:oscar", Action: "contract.update",
		TargetKind: "service", Target: fmt.Sprintf("svc-%d", i), Outcome: audit.Accepted,
		Before: map[string]any{"n": i}, After: map[string]any{"n": i + 1, "note": "ünïcode"},
	}
}

func TestAppendAndVerify(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	for i := range 5 {
		ev, err := audit.AppendAlone(ctx, pool, t0.Add(time.Duration(i)*time.Second), entry(i))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Seq != int64(i+1) || len(ev.Hash) != 64 {
			t.Fatalf("event %d: seq %d hash %q", i, ev.Seq, ev.Hash)
		}
	}
	rep, err := audit.Verify(ctx, db.New(pool))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rows != 5 || len(rep.Head) != 64 {
		t.Fatalf("report %+v", rep)
	}
}

func TestVerifyEmptyChain(t *testing.T) {
	t.Parallel()
	rep, err := audit.Verify(context.Background(), db.New(dbtest.New(t)))
	if err != nil || rep.Rows != 0 {
		t.Fatalf("rows %d err %v", rep.Rows, err)
	}
}

func TestTriggersRefuseUpdateAndDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	if _, err := audit.AppendAlone(ctx, pool, t0, entry(0)); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		"UPDATE audit_events SET actor = 'operator:mallory'",
		"DELETE FROM audit_events",
		"TRUNCATE audit_events",
	} {
		_, err := pool.Exec(ctx, stmt)
		if err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: err = %v, want append-only refusal", stmt, err)
		}
	}
}

func TestVerifyNamesTamperedRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		tamper []string
		seq    int64
	}{
		{"content", []string{"UPDATE audit_events SET reason = 'nothing to see' WHERE seq = 3"}, 3},
		{"json", []string{`UPDATE audit_events SET after = '{"n": 99}' WHERE seq = 2`}, 2},
		{"rehashed row breaks the next link", []string{
			"UPDATE audit_events SET actor = 'x' WHERE seq = 2",
			"UPDATE audit_events SET hash = audit_event_digest(audit_events.*) WHERE seq = 2",
		}, 3},
		{"deleted row leaves a gap", []string{"DELETE FROM audit_events WHERE seq = 4"}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.New(t)
			for i := range 5 {
				if _, err := audit.AppendAlone(ctx, pool, t0, entry(i)); err != nil {
					t.Fatal(err)
				}
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			stmts := append(append([]string{"ALTER TABLE audit_events DISABLE TRIGGER USER"}, tc.tamper...), "ALTER TABLE audit_events ENABLE TRIGGER USER")
			for _, s := range stmts {
				if _, err := tx.Exec(ctx, s); err != nil {
					t.Fatalf("%s: %v", s, err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			_, err = audit.Verify(ctx, db.New(pool))
			var broken *audit.BrokenError
			if !errors.As(err, &broken) {
				t.Fatalf("Verify = %v, want *BrokenError", err)
			}
			if broken.Seq != tc.seq {
				t.Fatalf("broken at seq %d (%s), want %d", broken.Seq, broken.Reason, tc.seq)
			}
		})
	}
}

func TestConcurrentAppendsKeepOneChain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := audit.AppendAlone(ctx, pool, t0, entry(i))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	rep, err := audit.Verify(ctx, db.New(pool))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rows != n {
		t.Fatalf("rows %d, want %d", rep.Rows, n)
	}
}

func TestRolledBackChangeLeavesNoAuditRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	boom := errors.New("business write failed")
	err := db.WithTx(ctx, pool, func(q *db.Queries) error {
		if _, err := audit.Append(ctx, q, t0, entry(1)); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if _, err := audit.AppendAlone(ctx, pool, t0, entry(2)); err != nil {
		t.Fatal(err)
	}
	evs, err := audit.List(ctx, db.New(pool), audit.Filter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Seq != 1 || evs[0].Target != "svc-2" {
		t.Fatalf("events after rollback: %+v", evs)
	}
}

func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	for i := range 6 {
		e := entry(i)
		if i%2 == 1 {
			e.Outcome, e.Reason, e.Actor = audit.Refused, "forbidden", "workload:web/w1"
		}
		if _, err := audit.AppendAlone(ctx, pool, t0, e); err != nil {
			t.Fatal(err)
		}
	}
	q := db.New(pool)
	refused, err := audit.List(ctx, q, audit.Filter{Outcome: audit.Refused, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(refused) != 3 || refused[0].Seq != 6 || refused[2].Seq != 2 {
		t.Fatalf("refused: %+v", refused)
	}
	page1, _ := audit.List(ctx, q, audit.Filter{Limit: 4})
	page2, _ := audit.List(ctx, q, audit.Filter{Limit: 4, BeforeSeq: page1[len(page1)-1].Seq})
	if len(page1) != 4 || len(page2) != 2 || page2[0].Seq != 2 || page2[1].Seq != 1 {
		t.Fatalf("pages: %d then %d", len(page1), len(page2))
	}
	byActor, _ := audit.List(ctx, q, audit.Filter{Actor: "workload:web/w1", Target: "svc-3", Limit: 10})
	if len(byActor) != 1 || byActor[0].Seq != 4 {
		t.Fatalf("by actor and target: %+v", byActor)
	}
}

// TestTransitionsRefuseTruncate: the evaluation transitions are on the
// record too (ADR-02), and TRUNCATE fires no row trigger, so it has a
// statement trigger of its own (issue 15).
func TestTransitionsRefuseTruncate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	// Row triggers fire only on rows: give them one.
	if _, err := pool.Exec(ctx, `INSERT INTO transitions (instance_id, service, from_state, to_state, weight, at, reason)
		VALUES (gen_random_uuid(), 'web', 'eligible', 'ineligible', 0, now(), 'test')`); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		"TRUNCATE transitions",
		"DELETE FROM transitions",
		"UPDATE transitions SET reason = 'x'",
	} {
		_, err := pool.Exec(ctx, stmt)
		if err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: err = %v, want append-only refusal", stmt, err)
		}
	}
}
