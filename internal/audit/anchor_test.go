package audit_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/audit"
)

// clock is a test clock the checkpointer reads.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// anchored is a database with a chain and a checkpoint sink beside it.
type anchored struct {
	pool   *pgxpool.Pool
	sink   audit.DirSink
	signer *audit.KeyFileSigner
	keys   audit.Keys
	clock  *clock
	cp     *audit.Checkpointer
	n      int
}

func newAnchored(t *testing.T) *anchored {
	t.Helper()
	dir := t.TempDir()
	signer, err := audit.LoadOrCreateKeyFile(filepath.Join(dir, "audit-signing.key"))
	if err != nil {
		t.Fatal(err)
	}
	a := &anchored{pool: dbtest.New(t), sink: audit.DirSink{Dir: filepath.Join(dir, "checkpoints")}, signer: signer,
		keys: audit.Keys{signer.KeyID(): signer.Public()}, clock: &clock{t0}}
	a.cp = a.checkpointer(t, a.pool)
	return a
}

func (a *anchored) checkpointer(t *testing.T, pool *pgxpool.Pool) *audit.Checkpointer {
	t.Helper()
	cp, err := audit.NewCheckpointer(audit.CheckpointerConfig{Pool: pool, Signer: a.signer, Sink: a.sink, Now: a.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// append adds n rows.
func (a *anchored) append(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	for range n {
		a.n++
		a.clock.t = a.clock.t.Add(time.Second)
		if _, err := audit.AppendAlone(context.Background(), pool, a.clock.t, entry(a.n)); err != nil {
			t.Fatal(err)
		}
	}
}

// checkpoint writes a checkpoint a minute on, and returns it.
func (a *anchored) checkpoint(t *testing.T) audit.Checkpoint {
	t.Helper()
	a.clock.t = a.clock.t.Add(time.Minute)
	c, err := a.cp.RunOnce(context.Background(), false)
	if err != nil || c == nil {
		t.Fatalf("checkpoint: %v, %v", c, err)
	}
	return *c
}

func (a *anchored) verify(t *testing.T, pool *pgxpool.Pool) (audit.Report, error) {
	t.Helper()
	ctx := context.Background()
	cps, err := audit.LoadCheckpoints(ctx, a.sink, a.keys)
	if err != nil {
		return audit.Report{}, err
	}
	return audit.VerifyCheckpoints(ctx, db.New(pool), cps)
}

// superuser runs statements in one transaction, as a hostile database
// administrator would, with every trigger of the session disabled.
func superuser(t *testing.T, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, s := range append([]string{"SET LOCAL session_replication_role = replica"}, stmts...) {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// rechain recomputes prev_hash and hash of rows from..to with the
// database's own digest function: a tail rewritten consistently.
func rechain(from, to int) []string {
	var out []string
	for s := from; s <= to; s++ {
		out = append(out,
			fmt.Sprintf("UPDATE audit_events SET prev_hash = (SELECT hash FROM audit_events WHERE seq = %d) WHERE seq = %d", s-1, s),
			fmt.Sprintf("UPDATE audit_events SET hash = audit_event_digest(audit_events.*) WHERE seq = %d", s))
	}
	return out
}

// databaseVerify is the verification muster shipped before issue 15: the
// links and seqs checked in Go, the content by asking the database's own
// audit_event_digest. Each hostile case shows it passing.
func databaseVerify(t *testing.T, pool *pgxpool.Pool) error {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT seq, prev_hash, hash, audit_event_digest(audit_events.*) FROM audit_events ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	prev, last := make([]byte, 32), int64(0)
	for rows.Next() {
		var seq int64
		var p, h, d []byte
		if err := rows.Scan(&seq, &p, &h, &d); err != nil {
			t.Fatal(err)
		}
		if seq != last+1 || !bytes.Equal(p, prev) || !bytes.Equal(h, d) {
			return fmt.Errorf("broken at seq %d", seq)
		}
		prev, last = h, seq
	}
	return rows.Err()
}

func wantBroken(t *testing.T, err error, kind string, seq int64, checkpoint string) *audit.BrokenError {
	t.Helper()
	var b *audit.BrokenError
	if !errors.As(err, &b) {
		t.Fatalf("verify = %v, want a *BrokenError (%s at seq %d)", err, kind, seq)
	}
	if b.Kind != kind || b.Seq != seq || b.Checkpoint != checkpoint {
		t.Fatalf("broken: kind %q seq %d checkpoint %q (%v); want %q at seq %d, checkpoint %q", b.Kind, b.Seq, b.Checkpoint, b, kind, seq, checkpoint)
	}
	return b
}

func TestHonestChainVerifiesAgainstItsCheckpoints(t *testing.T) {
	t.Parallel()
	a := newAnchored(t)
	ctx := context.Background()
	if c, err := a.cp.RunOnce(ctx, false); err != nil || c == nil || c.N != 1 || c.Seq != 0 {
		t.Fatalf("checkpoint of the empty chain: %+v, %v", c, err)
	}
	a.append(t, a.pool, 5)
	a.checkpoint(t)
	// An unchanged head writes nothing until the heartbeat is due.
	a.clock.t = a.clock.t.Add(time.Minute)
	if c, err := a.cp.RunOnce(ctx, false); err != nil || c != nil {
		t.Fatalf("unchanged head: %+v, %v", c, err)
	}
	a.clock.t = a.clock.t.Add(time.Hour)
	if c, err := a.cp.RunOnce(ctx, false); err != nil || c == nil || c.Seq != 5 {
		t.Fatalf("heartbeat: %+v, %v", c, err)
	}
	a.append(t, a.pool, 3)
	last := a.checkpoint(t)
	if last.N != 4 || last.Seq != 8 {
		t.Fatalf("last checkpoint %d at seq %d, want 4 at seq 8", last.N, last.Seq)
	}
	a.append(t, a.pool, 2)
	rep, err := a.verify(t, a.pool)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rows != 10 || rep.Checkpoints != 4 || rep.AnchoredSeq != 8 || rep.HeadSeq != 10 {
		t.Fatalf("report %+v", rep)
	}
}

func TestRewrittenAndRechainedRowIsNamed(t *testing.T) {
	t.Parallel()
	a := newAnchored(t)
	a.append(t, a.pool, 5)
	first := a.checkpoint(t)
	a.append(t, a.pool, 5)
	second := a.checkpoint(t)
	superuser(t, a.pool, append([]string{"UPDATE audit_events SET reason = 'nothing to see', actor = 'operator:nobody' WHERE seq = 7"}, rechain(7, 10)...)...)

	if err := databaseVerify(t, a.pool); err != nil {
		t.Fatalf("the database-only verify should pass on a re-chained tail: %v", err)
	}
	if _, err := audit.Verify(context.Background(), db.New(a.pool)); err != nil {
		t.Fatalf("Verify without checkpoints cannot see a consistent rewrite, yet failed: %v", err)
	}
	_, err := a.verify(t, a.pool)
	b := wantBroken(t, err, "rewritten", 10, second.Name())
	if !strings.Contains(b.Reason, fmt.Sprintf("after seq %d, up to seq 10", first.Seq)) {
		t.Fatalf("reason does not bound the rewrite: %s", b.Reason)
	}
	// And no checkpoint is signed over the rewritten chain.
	a.clock.t = a.clock.t.Add(time.Minute)
	if c, err := a.cp.RunOnce(context.Background(), true); c != nil || err == nil {
		t.Fatalf("checkpointer signed a rewritten chain: %+v, %v", c, err)
	}
}

func TestDeletedTailIsARollback(t *testing.T) {
	t.Parallel()
	a := newAnchored(t)
	a.append(t, a.pool, 6)
	a.checkpoint(t)
	a.append(t, a.pool, 4)
	last := a.checkpoint(t)
	superuser(t, a.pool, "DELETE FROM audit_events WHERE seq > 7")

	if err := databaseVerify(t, a.pool); err != nil {
		t.Fatalf("the database-only verify should pass on a cut tail: %v", err)
	}
	if _, err := audit.Verify(context.Background(), db.New(a.pool)); err != nil {
		t.Fatalf("Verify without checkpoints cannot see a cut tail, yet failed: %v", err)
	}
	_, err := a.verify(t, a.pool)
	b := wantBroken(t, err, "rollback", 7, last.Name())
	if b.LostFrom != 8 || b.LostTo != 10 {
		t.Fatalf("lost %d..%d, want 8..10", b.LostFrom, b.LostTo)
	}
	// The checkpointer refuses to sign over the rollback, and says so.
	if c, err := a.cp.RunOnce(context.Background(), true); c != nil || !errors.As(err, &b) || b.Kind != "rollback" {
		t.Fatalf("checkpointer over a cut tail: %+v, %v", c, err)
	}
}

func TestReplacedDigestFunctionIsNamed(t *testing.T) {
	t.Parallel()
	a := newAnchored(t)
	a.append(t, a.pool, 5)
	cp := a.checkpoint(t)
	superuser(t, a.pool,
		"CREATE OR REPLACE FUNCTION audit_event_digest(e audit_events) RETURNS bytea LANGUAGE sql IMMUTABLE AS 'SELECT e.hash'",
		`UPDATE audit_events SET after = '{"n": 1000}' WHERE seq = 3`)

	if err := databaseVerify(t, a.pool); err != nil {
		t.Fatalf("the database-only verify should pass once the digest function lies: %v", err)
	}
	_, err := audit.Verify(context.Background(), db.New(a.pool))
	wantBroken(t, err, "content", 3, "")
	_, err = a.verify(t, a.pool)
	wantBroken(t, err, "content", 3, "")
	_ = cp
	// A row sealed by the replaced function is caught as it comes.
	b := newAnchored(t)
	b.append(t, b.pool, 5)
	b.checkpoint(t)
	superuser(t, b.pool, "CREATE OR REPLACE FUNCTION audit_event_digest(e audit_events) RETURNS bytea LANGUAGE sql IMMUTABLE AS 'SELECT e.hash'")
	b.append(t, b.pool, 1)
	_, err = b.verify(t, b.pool)
	wantBroken(t, err, "content", 6, "")
	if c, err := b.cp.RunOnce(context.Background(), true); c != nil || err == nil {
		t.Fatalf("checkpointer signed a row the replaced function sealed: %+v, %v", c, err)
	}
}

func TestBrokenOrMissingCheckpointIsNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string, cps []audit.Checkpoint)
		kind   string
		n      int
	}{
		{"signature", func(t *testing.T, dir string, cps []audit.Checkpoint) {
			p := filepath.Join(dir, cps[1].Name())
			b, _ := os.ReadFile(p)
			b = bytes.Replace(b, []byte(`"seq":`), []byte(`"seq":1`), 1)
			os.Remove(p)
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "signature", 2},
		{"missing", func(t *testing.T, dir string, cps []audit.Checkpoint) {
			if err := os.Remove(filepath.Join(dir, cps[1].Name())); err != nil {
				t.Fatal(err)
			}
		}, "checkpoint-chain", 3},
		{"forged with another key", func(t *testing.T, dir string, cps []audit.Checkpoint) {
			other, err := audit.LoadOrCreateKeyFile(filepath.Join(t.TempDir(), "other.key"))
			if err != nil {
				t.Fatal(err)
			}
			_, data, err := audit.Sign(ctx, other, audit.Checkpoint{N: 4, Seq: 9, Head: make([]byte, 32), At: t0, Prev: cps[2].Hash()})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, audit.CheckpointName(4)), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "signature", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := newAnchored(t)
			var cps []audit.Checkpoint
			for range 3 {
				a.append(t, a.pool, 2)
				cps = append(cps, a.checkpoint(t))
			}
			tc.damage(t, a.sink.Dir, cps)
			_, err := a.verify(t, a.pool)
			var b *audit.BrokenError
			if !errors.As(err, &b) || b.Kind != tc.kind || b.Checkpoint != audit.CheckpointName(int64(tc.n)) {
				t.Fatalf("verify = %v, want %s at checkpoint %d", err, tc.kind, tc.n)
			}
		})
	}
}

// TestCheckpointsSurviveARestart: a new checkpointer (a restarted muster)
// reads the chain of checkpoints from the sink and extends it.
func TestCheckpointsSurviveARestart(t *testing.T) {
	t.Parallel()
	a := newAnchored(t)
	a.append(t, a.pool, 3)
	a.checkpoint(t)
	a.append(t, a.pool, 1)
	first := a.checkpoint(t)
	a.cp = a.checkpointer(t, a.pool)
	a.append(t, a.pool, 3)
	second := a.checkpoint(t)
	if second.N != first.N+1 || !bytes.Equal(second.Prev, first.Hash()) {
		t.Fatalf("after a restart: checkpoint %d prev %x, want %d prev %x", second.N, second.Prev, first.N+1, first.Hash())
	}
	if rep, err := a.verify(t, a.pool); err != nil || rep.Checkpoints != 3 {
		t.Fatalf("verify after restart: %+v %v", rep, err)
	}
}

// TestRestoreToAnEarlierPointIsARollback backs the database up (a copy of
// it, as a file-level backup is), lets the chain and its checkpoints move
// on, restores the backup, and verifies it against the checkpoints.
func TestRestoreToAnEarlierPointIsARollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := newAnchored(t)
	a.append(t, a.pool, 4)
	a.checkpoint(t)

	// The backup: CREATE DATABASE … TEMPLATE copies the database as it is.
	name := a.pool.Config().ConnConfig.Database
	backup := name + "_backup"
	adminCfg := a.pool.Config().Copy()
	adminCfg.ConnConfig.Database = "postgres"
	admin, err := pgxpool.NewWithConfig(ctx, adminCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	a.pool.Reset()
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", backup, name)); err != nil {
		t.Fatalf("back up: %v", err)
	}
	a.append(t, a.pool, 5)
	last := a.checkpoint(t)

	restoredCfg := a.pool.Config().Copy()
	restoredCfg.ConnConfig.Database = backup
	restored, err := pgxpool.NewWithConfig(ctx, restoredCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer restored.Close()
	if err := databaseVerify(t, restored); err != nil {
		t.Fatalf("the restored database is self-consistent, yet: %v", err)
	}
	_, err = a.verify(t, restored)
	b := wantBroken(t, err, "rollback", 4, last.Name())
	if b.LostFrom != 5 || b.LostTo != 9 {
		t.Fatalf("lost %d..%d, want 5..9", b.LostFrom, b.LostTo)
	}
	// A muster on the restored database will not sign over the rollback.
	if c, err := a.checkpointer(t, restored).RunOnce(ctx, true); c != nil || !errors.As(err, &b) || b.Kind != "rollback" || b.LostFrom != 5 {
		t.Fatalf("checkpointer on the restored database: %+v, %v", c, err)
	}
}

func TestOneReplicaWritesCheckpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := newAnchored(t)
	a.append(t, a.pool, 2)
	other := a.checkpointer(t, a.pool)
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := db.New(tx).AuditCheckpointLock(ctx); err != nil || !got {
		t.Fatalf("take the lock: %v %v", got, err)
	}
	if c, err := other.RunOnce(ctx, true); c != nil || err != nil {
		t.Fatalf("while another holds the lock: %+v %v", c, err)
	}
	tx.Rollback(ctx)
	first := a.checkpoint(t)
	a.append(t, a.pool, 1)
	// The other replica picks up the checkpoint the first wrote.
	c, err := other.RunOnce(ctx, false)
	if err != nil || c == nil || c.N != first.N+1 {
		t.Fatalf("other replica: %+v %v", c, err)
	}
	if _, err := a.verify(t, a.pool); err != nil {
		t.Fatal(err)
	}
}

func TestKeyFileReadableByOthersIsRefused(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "k")
	if _, err := audit.LoadOrCreateKeyFile(p); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Fatalf("generated key mode %o", st.Mode().Perm())
	}
	// Readable or writable by others, or writable by its group: refused.
	for _, mode := range []os.FileMode{0o604, 0o660, 0o620, 0o644} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := audit.LoadKeyFile(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Fatalf("a key of mode %04o: %v", mode, err)
		}
	}
	// Readable by its group when the group is this process's own (a
	// Kubernetes Secret mounted under the pod's fsGroup, mode 0440).
	for _, mode := range []os.FileMode{0o640, 0o440, 0o400} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := audit.LoadKeyFile(p); err != nil {
			t.Fatalf("a key of mode %04o in this process's group: %v", mode, err)
		}
	}
	// Readable by a group that is not this process's: refused. Only root
	// may give a file to a group it is not in.
	if os.Geteuid() == 0 {
		if err := os.Chown(p, -1, 54321); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o440); err != nil {
			t.Fatal(err)
		}
		if _, err := audit.LoadKeyFile(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Fatalf("a key readable by group 54321, not this process's: %v", err)
		}
	}
	keys, err := audit.LoadPublicKeys(p + ".pub")
	if err != nil || len(keys) != 1 {
		t.Fatalf("public key: %v %v", keys, err)
	}
	for _, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			t.Fatal("bad key")
		}
	}
}

// TestTwoProcessesMakeOneKey: muster processes starting together on one
// data folder end up signing with the same key.
func TestTwoProcessesMakeOneKey(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "k")
	ids := make(chan string, 8)
	for range 8 {
		go func() {
			s, err := audit.LoadOrCreateKeyFile(p)
			if err != nil {
				ids <- err.Error()
				return
			}
			ids <- s.KeyID()
		}()
	}
	first := <-ids
	for range 7 {
		if id := <-ids; id != first {
			t.Fatalf("keys %s and %s", first, id)
		}
	}
}
