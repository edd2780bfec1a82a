package db_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/wait"
)

// writeLoad writes through db.WithTx from a few goroutines until stopped:
// write i inserts two rows (scopes "i-a" and "i-b") in one transaction,
// so a half-applied write shows as one row without the other. It counts
// what it sees.
type writeLoad struct {
	pool *pgxpool.Pool
	next atomic.Int64

	mu       sync.Mutex
	acked    []int64
	readOnly int     // writes refused with 25006
	failed   int     // writes refused as unavailable (any cause)
	other    []error // writes refused otherwise: a classification bug

	stop func()
	done sync.WaitGroup
}

func startWrites(t *testing.T, pool *pgxpool.Pool, writers int) *writeLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &writeLoad{pool: pool, stop: cancel}
	for range writers {
		w.done.Go(func() {
			for ctx.Err() == nil {
				w.writeOnce(ctx)
			}
		})
	}
	t.Cleanup(w.Stop)
	return w
}

func (w *writeLoad) writeOnce(ctx context.Context) {
	i := w.next.Add(1)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	at := time.Now()
	err := db.WithTx(wctx, w.pool, func(q *db.Queries) error {
		for _, half := range []string{"a", "b"} {
			if err := q.RateLimitRecord(wctx, db.RateLimitRecordParams{Actor: "failover", Scope: fmt.Sprintf("%d-%s", i, half), At: at}); err != nil {
				return err
			}
		}
		return nil
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		w.acked = append(w.acked, i)
	case ctx.Err() != nil:
		// stopping
	case db.IsUnavailable(err):
		w.failed++
		if errors.As(err, &pgErr) && pgErr.Code == "25006" {
			w.readOnly++
		}
	default:
		w.other = append(w.other, err)
	}
}

// Stop ends the writers and waits for them. Safe to call twice.
func (w *writeLoad) Stop() { w.stop(); w.done.Wait() }

func (w *writeLoad) counts() (acked, readOnly, failed int, other []error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked), w.readOnly, w.failed, append([]error(nil), w.other...)
}

// check asserts that every acknowledged write is in the table and that no
// write is there by half.
func (w *writeLoad) check(t *testing.T, admin *pgxpool.Pool) {
	t.Helper()
	rows, err := admin.Query(context.Background(),
		"SELECT split_part(scope, '-', 1)::bigint, count(*) FROM rate_limit_attempts WHERE actor = 'failover' GROUP BY 1")
	if err != nil {
		t.Fatal(err)
	}
	found := map[int64]int64{}
	for rows.Next() {
		var i, n int64
		if err := rows.Scan(&i, &n); err != nil {
			t.Fatal(err)
		}
		found[i] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for i, n := range found {
		if n != 2 {
			t.Errorf("write %d is half applied: %d of its 2 rows", i, n)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	lost := 0
	for _, i := range w.acked {
		if found[i] != 2 {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged writes are missing", lost, len(w.acked))
	}
	t.Logf("%d writes acknowledged, %d rows' worth found (unacknowledged ones may have committed), %d refused as unavailable (%d with 25006)",
		len(w.acked), len(found), w.failed, w.readOnly)
}

// adminPool opens a pool on the cluster's "postgres" database, for the
// test's own statements (it must not land in the pool under test, nor be
// terminated with it).
func adminPool(t *testing.T, pc *dbtest.Cluster) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(pc.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/postgres"
	p, err := db.OpenPool(context.Background(), db.PoolConfig{URL: u.String(), MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// checkPool opens a pool on the cluster's database "muster" to read what
// the writes left.
func checkPool(t *testing.T, pc *dbtest.Cluster) *pgxpool.Pool {
	t.Helper()
	p, err := db.OpenPool(context.Background(), db.PoolConfig{URL: pc.URL(), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestWriterFailoverDropsReadOnlySessions simulates an Aurora writer
// failover on a real PostgreSQL: the server turns read-only under a load
// of writes (default_transaction_read_only, reloaded into every session),
// then every session of muster's database is terminated. Writes fail as
// unavailable (503 at the HTTP layer) and none is half applied; each
// connection that met 25006 is dropped rather than handed out again, and
// target_session_attrs=read-write keeps new ones off the read-only server;
// once it is writable again the pool recovers within seconds, every
// connection it holds is read-write, and every acknowledged write is
// there.
func TestWriterFailoverDropsReadOnlySessions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pc := dbtest.NewCluster(t)
	admin := adminPool(t, pc)
	rwURL, err := db.WithReadWrite(pc.URL())
	if err != nil {
		t.Fatal(err)
	}
	const maxConns = 4
	pool, err := db.OpenPool(ctx, db.PoolConfig{URL: rwURL, MaxConns: maxConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	w := startWrites(t, pool, maxConns)
	wait.For(t, 10*time.Second, "writes before the failover", func() bool {
		acked, _, _, _ := w.counts()
		return acked >= 50
	})

	// The writer is demoted: it stays up and turns read-only.
	if _, err := admin.Exec(ctx, "ALTER SYSTEM SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "writes refused with 25006", func() bool {
		_, readOnly, _, _ := w.counts()
		return readOnly > 0
	})
	// Every connection that met 25006 was closed, and no new one can land
	// on the read-only server: the pool empties while writes go on.
	// (Connections being attempted count in TotalConns; they fail.)
	wait.For(t, 10*time.Second, "the pool dropping its read-only connections", func() bool {
		st := pool.Stat()
		return st.IdleConns()+st.AcquiredConns() == 0
	})
	// The rest of the failover: every session is cut.
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'muster' AND pid <> pg_backend_pid()"); err != nil {
		t.Fatal(err)
	}
	ackedDuring, _, failedDuring, _ := w.counts()

	// The new writer is up.
	if _, err := admin.Exec(ctx, "ALTER SYSTEM RESET default_transaction_read_only"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	recovered := time.Now()
	wait.For(t, 10*time.Second, "writes after the failover", func() bool {
		acked, _, _, _ := w.counts()
		return acked >= ackedDuring+50
	})
	t.Logf("writes resumed %s after the server became writable", time.Since(recovered).Round(time.Millisecond))
	w.Stop()

	acked, readOnly, failed, other := w.counts()
	for _, err := range other {
		t.Errorf("a write failed with an error not classified as unavailable: %v", err)
	}
	if failed < failedDuring || readOnly == 0 || acked == 0 {
		t.Errorf("acked %d, failed %d, read-only %d", acked, failed, readOnly)
	}
	// A connection meets 25006 once: then it is closed. Only those open
	// when the server turned read-only can have met it.
	if readOnly > maxConns {
		t.Errorf("%d writes refused with 25006 on a pool of %d connections: a read-only connection was reused", readOnly, maxConns)
	}
	// No connection is stuck on the read-only session state, none is held.
	conns := make([]*pgxpool.Conn, 0, maxConns)
	for range maxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		var ro string
		if err := c.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro); err != nil {
			t.Fatal(err)
		}
		if ro != "off" {
			t.Errorf("a pooled connection (pid %d) is read-only after the failover", c.Conn().PgConn().PID())
		}
		c.Release()
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired after the writes stopped", n)
	}
	w.check(t, checkPool(t, pc))
}

// TestRestartUnderWritesLosesNothing: PostgreSQL stopped (every session
// cut) and started again under a load of writes through db.WithTx: writes
// in between fail as unavailable, the pool reconnects by itself, and
// every write that was acknowledged is there, none by half.
func TestRestartUnderWritesLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pc := dbtest.NewCluster(t)
	rwURL, err := db.WithReadWrite(pc.URL())
	if err != nil {
		t.Fatal(err)
	}
	pool, err := db.OpenPool(ctx, db.PoolConfig{URL: rwURL, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	w := startWrites(t, pool, 4)
	wait.For(t, 10*time.Second, "writes before the restart", func() bool {
		acked, _, _, _ := w.counts()
		return acked >= 50
	})
	pc.Stop(t)
	wait.For(t, 10*time.Second, "writes refused while stopped", func() bool {
		_, _, failed, _ := w.counts()
		return failed > 0
	})
	ackedBefore, _, _, _ := w.counts()
	pc.Start(t)
	wait.For(t, 20*time.Second, "writes after the restart", func() bool {
		acked, _, _, _ := w.counts()
		return acked >= ackedBefore+50
	})
	w.Stop()
	_, _, _, other := w.counts()
	for _, err := range other {
		t.Errorf("a write failed with an error not classified as unavailable: %v", err)
	}
	w.check(t, checkPool(t, pc))
}
