package evaluator

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/eligibility"
)

func transitionsN(n int) []eligibility.Transition {
	ts := make([]eligibility.Transition, n)
	for i := range ts {
		ts[i] = eligibility.Transition{
			Instance: eligibility.InstanceID(uuid.New()), Service: "web", From: eligibility.Eligible,
			To: eligibility.Ineligible, At: time.Now().UTC(), Reason: "test",
			History: []eligibility.Transition{{From: eligibility.Unknown, To: eligibility.Eligible, At: time.Now().UTC(), Reason: "first success"}},
		}
	}
	return ts
}

func TestTransitionWriterAppends(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	m, _ := newMetrics(nil)
	w := newTransitionWriter(pool, 100, m, slog.New(slog.DiscardHandler))
	w.add(transitionsN(7))
	w.flush(context.Background())
	rows, err := db.New(pool).TransitionsList(context.Background(), db.TransitionsListParams{Lim: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 7 || rows[0].ToState != "ineligible" || len(rows[0].History) == 0 {
		t.Fatalf("rows: %d %+v", len(rows), rows)
	}
	if got := testutil.ToFloat64(m.transitionsWritten); got != 7 {
		t.Fatalf("written counter %v", got)
	}
	if _, err := pool.Exec(context.Background(), "UPDATE transitions SET reason = 'x'"); err == nil {
		t.Fatal("the transitions table accepted an UPDATE")
	}
}

// TestTransitionWriterBuffersWhileDatabaseAway points the writer at a
// database that is not there: nothing blocks, at most the limit is kept,
// and the rest is counted as dropped.
func TestTransitionWriterBuffersWhileDatabaseAway(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres:///x?host="+t.TempDir()+"&user=postgres&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	m, _ := newMetrics(nil)
	w := newTransitionWriter(pool, 5, m, slog.New(slog.DiscardHandler))
	w.add(transitionsN(3))
	w.flush(context.Background()) // fails: the 3 go back in line
	w.add(transitionsN(4))        // 7 > 5: the 2 oldest are dropped
	if len(w.pending) != 5 {
		t.Fatalf("pending %d, want 5", len(w.pending))
	}
	if got := testutil.ToFloat64(m.transitionsDropped); got != 2 {
		t.Fatalf("dropped %v, want 2", got)
	}
}
