package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/wait"
)

// TestAuditVerifyAgainstCheckpoints drives `muster audit verify
// --checkpoints`, `muster audit export` and `muster audit verify --export`
// on a database a hostile superuser then works on: re-chaining a rewritten
// row and cutting the tail each pass the database-only `muster audit
// verify`, and fail against the checkpoints with the place named.
// (Not parallel: the commands read DATABASE_URL.)
func TestAuditVerifyAgainstCheckpoints(t *testing.T) {
	ctx := context.Background()
	url := dbtest.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	dir := t.TempDir()
	keyFile, sinkDir := filepath.Join(dir, "audit-signing.key"), filepath.Join(dir, "checkpoints")
	signer, err := audit.LoadOrCreateKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	cp, err := audit.NewCheckpointer(audit.CheckpointerConfig{Pool: pool, Signer: signer, Sink: audit.DirSink{Dir: sinkDir}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 12; i++ {
		now = now.Add(time.Second)
		if _, err := audit.AppendAlone(ctx, pool, now, audit.Entry{ActorKind: "operator", Actor: "operator:oscar", Action: "contract.update",
			TargetKind: "service", Target: fmt.Sprint("svc-", i), Outcome: audit.Accepted, After: map[string]int{"n": i}}); err != nil {
			t.Fatal(err)
		}
		if i%4 == 0 {
			now = now.Add(time.Minute)
			if _, err := cp.RunOnce(ctx, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Setenv("DATABASE_URL", url)
	pub := keyFile + ".pub"
	verify := func() (string, error) {
		out, errOut, err := runCmd(t, "audit", "verify", "--checkpoints", sinkDir, "--key", pub)
		return out + errOut, err
	}
	if out, err := verify(); err != nil || !strings.Contains(out, "checked against 3 checkpoints") {
		t.Fatalf("honest chain: %v %s", err, out)
	}

	// Export November's first hour and verify it offline, without a
	// database (DATABASE_URL pointing nowhere).
	export := filepath.Join(dir, "export.jsonl")
	if _, errOut, err := runCmd(t, "audit", "export", "--since", "2026-11-01T00:00:00Z", "--until", "2026-11-01T01:00:00Z",
		"--checkpoints", sinkDir, "--key", pub, "--out", export); err != nil {
		t.Fatalf("export: %v %s", err, errOut)
	}
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
	if out, errOut, err := runCmd(t, "audit", "verify", "--export", export, "--key", pub); err != nil || !strings.Contains(out, "rows 1 to 12, anchored by 3 checkpoints up to seq 12") {
		t.Fatalf("verify export: %v %s %s", err, out, errOut)
	}
	b, _ := os.ReadFile(export)
	if err := os.WriteFile(export+".bad", []byte(strings.Replace(string(b), `"svc-6"`, `"svc-0"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, "audit", "verify", "--export", export+".bad", "--key", pub); err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "seq 6") {
		t.Fatalf("a changed export: %v", err)
	}
	t.Setenv("DATABASE_URL", url)

	// Rewrite row 6 and re-chain 6..12 as the superuser.
	stmts := []string{"SET LOCAL session_replication_role = replica", "UPDATE audit_events SET actor = 'operator:nobody' WHERE seq = 6"}
	for s := 6; s <= 12; s++ {
		stmts = append(stmts,
			fmt.Sprintf("UPDATE audit_events SET prev_hash = (SELECT hash FROM audit_events WHERE seq = %d) WHERE seq = %d", s-1, s),
			fmt.Sprintf("UPDATE audit_events SET hash = audit_event_digest(audit_events.*) WHERE seq = %d", s))
	}
	asSuperuser(t, pool, stmts...)
	if out, errOut, err := runCmd(t, "audit", "verify"); err != nil || !strings.Contains(out, "audit chain intact") {
		t.Fatalf("the database-only verify should pass a re-chained rewrite: %v %s %s", err, out, errOut)
	}
	out, err := verify()
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "seq 8 (checkpoint "+audit.CheckpointName(2)+"): rewritten") ||
		!strings.Contains(err.Error(), "after seq 4, up to seq 8") {
		t.Fatalf("verify --checkpoints after a re-chained rewrite: %v %s", err, out)
	}

	// Cut the tail (rows 6-12) as well: a rollback, with the seqs lost.
	asSuperuser(t, pool, "SET LOCAL session_replication_role = replica", "DELETE FROM audit_events WHERE seq >= 6")
	if out, errOut, err := runCmd(t, "audit", "verify"); err != nil {
		t.Fatalf("the database-only verify should pass a cut tail: %v %s %s", err, out, errOut)
	}
	out, err = verify()
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "rollback") || !strings.Contains(err.Error(), "seqs 6 to 12 are lost") {
		t.Fatalf("verify --checkpoints after a cut tail: %v %s", err, out)
	}
}

func asSuperuser(t *testing.T, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDevCheckpointsSurviveARestart: muster dev signs checkpoints with a
// key it makes (0600) into DATA/audit-checkpoints, at start, every
// interval and at shutdown; a restarted muster extends the same chain of
// checkpoints, and `muster audit verify --data DIR` checks against them.
func TestDevCheckpointsSurviveARestart(t *testing.T) {
	t.Setenv("MUSTER_AUDIT_CHECKPOINT_INTERVAL", "1s")
	dir := devDir(t)
	sinkDir := filepath.Join(dir, "audit-checkpoints")
	dev := startDev(t, dir)
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	if code, body := call(t, "PUT", dev.url+"/v1/services/web", admin, `{"owner":"payments","capabilities":["self"]}`); code != 201 {
		t.Fatalf("create web: %d %s", code, body)
	}
	// The service's audit row (seq 1) is anchored within an interval.
	cps := func() []audit.Checkpoint {
		keys, err := audit.LoadPublicKeys(filepath.Join(dir, "audit-signing.key.pub"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := audit.LoadCheckpoints(context.Background(), audit.DirSink{Dir: sinkDir}, keys)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	wait.For(t, 30*time.Second, "a checkpoint of seq 1", func() bool {
		c := cps()
		return len(c) > 0 && c[len(c)-1].Seq >= 1
	})
	if st, err := os.Stat(filepath.Join(dir, "audit-signing.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("signing key: %v %v", st, err)
	}
	if code, body := call(t, "PUT", dev.url+"/v1/services/api", admin, `{"owner":"search","capabilities":["passive"]}`); code != 201 {
		t.Fatalf("create api: %d %s", code, body)
	}
	dev.stop()
	// The shutdown checkpoint covers the last row.
	before := cps()
	if last := before[len(before)-1]; last.Seq != 2 {
		t.Fatalf("after shutdown the newest checkpoint is at seq %d, want 2", last.Seq)
	}

	dev2 := startDev(t, dir)
	admin = token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	if code, body := call(t, "PUT", dev2.url+"/v1/services/db", admin, `{"owner":"data","capabilities":["passive"]}`); code != 201 {
		t.Fatalf("create db: %d %s", code, body)
	}
	dev2.stop()
	after := cps() // LoadCheckpoints checked the chain links across the restart
	if len(after) <= len(before) || after[len(after)-1].Seq != 3 {
		t.Fatalf("checkpoints across a restart: %d then %d, newest at seq %d", len(before), len(after), after[len(after)-1].Seq)
	}
	out, errOut, err := runCmd(t, "audit", "verify", "--data", dir)
	if err != nil || !strings.Contains(out, fmt.Sprintf("checked against %d checkpoints", len(after))) {
		t.Fatalf("audit verify --data: %v %s %s", err, out, errOut)
	}
}

// TestAuditVerifyAgainstS3 runs `muster audit verify --checkpoints
// s3://…` through the AWS SDK's default configuration (credentials and
// region from the environment, MUSTER_AUDIT_S3_ENDPOINT) against gofakes3,
// an in-process stand-in for S3.
func TestAuditVerifyAgainstS3(t *testing.T) {
	ctx := context.Background()
	backend := s3mem.New()
	if err := backend.CreateBucket("audit"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	defer srv.Close()
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_REGION", "eu-west-1")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("MUSTER_AUDIT_S3_ENDPOINT", srv.URL)
	sink, err := openSink(ctx, AuditConfig{S3Endpoint: srv.URL, S3Retention: 24 * time.Hour}, "s3://audit/muster/test")
	if err != nil {
		t.Fatal(err)
	}
	url := dbtest.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	keyFile := filepath.Join(t.TempDir(), "k")
	signer, err := audit.LoadOrCreateKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := audit.NewCheckpointer(audit.CheckpointerConfig{Pool: pool, Signer: signer, Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := audit.AppendAlone(ctx, pool, time.Now(), audit.Entry{ActorKind: "system", Actor: "system", Action: "test", TargetKind: "service", Target: "web", Outcome: audit.Accepted}); err != nil {
			t.Fatal(err)
		}
	}
	if c, err := cp.RunOnce(ctx, false); err != nil || c == nil {
		t.Fatalf("checkpoint: %v %v", c, err)
	}
	t.Setenv("DATABASE_URL", url)
	out, errOut, err := runCmd(t, "audit", "verify", "--checkpoints", "s3://audit/muster/test", "--key", keyFile+".pub")
	if err != nil || !strings.Contains(out, "checked against 1 checkpoints in s3://audit/muster/test/, the newest at seq 3") {
		t.Fatalf("verify against S3: %v %s %s", err, out, errOut)
	}
}

// TestSecretFilesAllowSharedReachesTheKeyLoader: MUSTER_SECRET_FILES_ALLOW_SHARED
// is read with the audit settings and handed to the signing key's loader:
// without it a 0644 key is refused naming the setting; with it, the same
// key on a writable file system is still refused, for not being on a
// read-only mount (internal/audit's tests show one accepted there). A
// value that is not a boolean is refused. (Not parallel: it sets the
// environment.)
func TestSecretFilesAllowSharedReachesTheKeyLoader(t *testing.T) {
	key := filepath.Join(t.TempDir(), "signing.key")
	if _, err := audit.LoadOrCreateKeyFile(key); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MUSTER_AUDIT_SIGNING_KEY_FILE", key)
	for _, tc := range []struct{ env, want string }{
		{"", "MUSTER_SECRET_FILES_ALLOW_SHARED=true"},
		{"false", "MUSTER_SECRET_FILES_ALLOW_SHARED=true"},
		{"true", "on a writable one"},
		{"yes please", `MUSTER_SECRET_FILES_ALLOW_SHARED: "yes please"`},
	} {
		t.Setenv("MUSTER_SECRET_FILES_ALLOW_SHARED", tc.env)
		cfg := Config{}
		err := loadAuditEnv(&cfg)
		if err == nil {
			_, _, err = regionKey(cfg)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("MUSTER_SECRET_FILES_ALLOW_SHARED=%q: %v, want an error saying %q", tc.env, err, tc.want)
		}
	}
}
