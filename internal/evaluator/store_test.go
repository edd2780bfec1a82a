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
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/registry"
)

func transitionsN(n int) []fencedTransition {
	ts := make([]fencedTransition, n)
	for i := range ts {
		ts[i].Transition = eligibility.Transition{
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
	w := newTransitionWriter(pool, nil, 100, time.Second, nil, m, slog.New(slog.DiscardHandler))
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
	w := newTransitionWriter(pool, nil, 5, time.Second, nil, m, slog.New(slog.DiscardHandler))
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

// TestFlushKeepsWindowsItCannotWrite: a flush that fails keeps its windows,
// the next flushes that fail keep theirs after them up to the bound (the
// oldest beyond it dropped and counted), and the first flush that
// succeeds writes every kept window.
func TestFlushKeepsWindowsItCannotWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	reg, err := registry.New(registry.Config{Pool: pool, Region: "local"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	e, err := New(Config{Registry: reg, Pool: pool, MaxPendingWindows: 5, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	count := func(n int) {
		e.mu.Lock()
		defer e.mu.Unlock()
		for range n {
			e.countSample(eligibility.Sample{Instance: eligibility.InstanceID(uuid.New()), Class: eligibility.Probe, Outcome: eligibility.Success, Reporter: 1})
		}
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	written := func() (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM observed_windows").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// PostgreSQL refuses the writes (the table is away).
	exec("ALTER TABLE observed_windows RENAME TO observed_windows_away")
	count(3)
	if err := e.FlushNow(ctx); err == nil {
		t.Fatal("a flush into a missing table succeeded")
	}
	if got := testutil.ToFloat64(e.metrics.windowsPending); got != 3 {
		t.Fatalf("pending %v after the first failure, want 3", got)
	}
	firstEnd := now
	now = now.Add(10 * time.Second)
	count(4)
	if err := e.FlushNow(ctx); err == nil {
		t.Fatal("a flush into a missing table succeeded")
	}
	if p, d := testutil.ToFloat64(e.metrics.windowsPending), testutil.ToFloat64(e.metrics.windowsDropped); p != 5 || d != 2 {
		t.Fatalf("pending %v, dropped %v after the second failure; want 5 and 2", p, d)
	}

	// It comes back: everything kept is written, with the new windows.
	exec("ALTER TABLE observed_windows_away RENAME TO observed_windows")
	now = now.Add(10 * time.Second)
	count(2)
	if err := e.FlushNow(ctx); err != nil {
		t.Fatal(err)
	}
	if n := written(); n != 7 {
		t.Fatalf("%d windows written, want 5 kept + 2 new", n)
	}
	var oldest int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM observed_windows WHERE window_end = $1", firstEnd).Scan(&oldest); err != nil {
		t.Fatal(err)
	}
	if oldest != 1 {
		t.Fatalf("%d windows of the first flush written, want 1 (its 2 oldest were dropped over the bound)", oldest)
	}
	if p, w := testutil.ToFloat64(e.metrics.windowsPending), testutil.ToFloat64(e.metrics.windowsWritten); p != 0 || w != 7 {
		t.Fatalf("pending %v, written %v after the recovery; want 0 and 7", p, w)
	}
}

// TestTransitionWriterFlushHasADeadline: a flush against a frozen
// PostgreSQL gives up after its timeout and keeps the batch.
func TestTransitionWriterFlushHasADeadline(t *testing.T) {
	t.Parallel()
	pc := dbtest.NewCluster(t)
	pool, err := db.OpenPool(context.Background(), db.PoolConfig{URL: pc.URL(), IOTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	m, _ := newMetrics(nil)
	w := newTransitionWriter(pool, nil, 100, 300*time.Millisecond, nil, m, slog.New(slog.DiscardHandler))
	w.add(transitionsN(3))
	thaw := pc.Freeze(t)
	start := time.Now()
	w.flush(context.Background())
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a flush against a frozen server took %s", took)
	}
	if len(w.pending) != 3 {
		t.Fatalf("pending %d after the failed flush, want 3", len(w.pending))
	}
	thaw()
	deadline := time.Now().Add(15 * time.Second)
	for len(w.pending) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the kept transitions were not written within 15 s of the thaw")
		}
		w.flush(context.Background())
	}
	if got := testutil.ToFloat64(m.transitionsWritten); got != 3 {
		t.Fatalf("written %v, want 3", got)
	}
}

// TestFlushWritesInPieces: more windows than one COPY takes are all
// written.
func TestFlushWritesInPieces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	reg, err := registry.New(registry.Config{Pool: pool, Region: "local"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Registry: reg, Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	const n = 2*windowChunk + 123
	e.mu.Lock()
	for range n {
		e.countSample(eligibility.Sample{Instance: eligibility.InstanceID(uuid.New()), Class: eligibility.Passive, Outcome: eligibility.Failure, Reporter: 1})
	}
	e.mu.Unlock()
	if err := e.FlushNow(ctx); err != nil {
		t.Fatal(err)
	}
	var got int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM observed_windows").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != n || testutil.ToFloat64(e.metrics.windowsWritten) != n {
		t.Fatalf("%d windows in the table, %v counted written; want %d", got, testutil.ToFloat64(e.metrics.windowsWritten), n)
	}
}

// countSample counts s into the current window as ingest does, for an
// instance the evaluator may not know (its windows are then made here,
// once per instance the evaluator knows, once per call otherwise).
func (e *Evaluator) countSample(s eligibility.Sample) {
	id := uuid.UUID(s.Instance)
	in, ok := e.instances[id]
	if ok && in.win == nil {
		in.win = &instanceWindows{id: id}
		e.instances[id] = in
	}
	if !ok {
		in.win = &instanceWindows{id: id}
	}
	e.countWindow(in.win, s)
}
