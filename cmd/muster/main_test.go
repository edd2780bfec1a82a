package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/migrations"
)

// syncBuffer is a bytes.Buffer safe for the server goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// devDir makes a data folder the postgres user can reach when the tests
// run as root (t.TempDir's parent is private to root).
func devDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "muster-dev-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

type devServer struct {
	url    string
	stop   func()
	errc   chan error
	stderr *syncBuffer
}

var servingRE = regexp.MustCompile(`serving on (https?://\S+)`)

// realTime skips a test that runs muster (and PostgreSQL) through real
// outages or stories in real time, for tens of seconds to minutes, when
// the tests run with -short: the quick path for a developer. CI runs
// without -short, so every one of them runs there.
func realTime(t *testing.T, what string) {
	t.Helper()
	if testing.Short() {
		t.Skip("real-time test (" + what + "): skipped with -short")
	}
}

// waitDemoReady waits (5 min at most: under CI's load, with the race
// detector, the demo's hundred setup calls can take minutes) until the
// demo has set its estate up, so a test's deadline for the stories
// counts from there and not from a setup still under way. It fails at
// once if the demo stopped.
func (d *devServer) waitDemoReady(t *testing.T) {
	t.Helper()
	wait.For(t, 5*time.Minute, "the demo estate set up", func() bool {
		log := d.stderr.String()
		if strings.Contains(log, "demo stopped") {
			t.Fatalf("the demo stopped during its setup")
		}
		return strings.Contains(log, "demo estate ready")
	})
}

func startDev(t *testing.T, dir string, extra ...string) *devServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errw := &syncBuffer{}, &syncBuffer{}
	d := &devServer{errc: make(chan error, 1), stderr: errw}
	args := append([]string{"dev", "--addr", "127.0.0.1:0", "--data", dir}, extra...)
	go func() { d.errc <- run(ctx, args, out, errw) }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if m := servingRE.FindStringSubmatch(out.String()); m != nil {
			d.url = m[1]
			break
		}
		select {
		case err := <-d.errc:
			t.Fatalf("muster dev exited: %v\n%s", err, errw.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("muster dev did not start within 90 s:\n%s", errw.String())
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	var once sync.Once
	d.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-d.errc; err != nil {
				t.Errorf("muster dev shut down with: %v\n%s", err, errw.String())
			}
		})
	}
	t.Cleanup(d.stop)
	// Registered after stop, so it runs first: a failing test shows what
	// the process said (the demo's refusals and retries included).
	t.Cleanup(func() {
		if t.Failed() {
			logNotable(t, "muster dev", errw.String())
		}
	})
	return d
}

func runCmd(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errw bytes.Buffer
	err := run(context.Background(), args, &out, &errw)
	return out.String(), errw.String(), err
}

func token(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, errOut, err := runCmd(t, append([]string{"token", "--data", dir}, args...)...)
	if err != nil {
		t.Fatalf("muster token %v: %v %s", args, err, errOut)
	}
	return strings.TrimSpace(out)
}

func call(t *testing.T, method, url, tok, body string) (int, []byte) {
	t.Helper()
	return callAs(t, method, url, tok, "", body)
}

// callAs is call by an instance presenting its credential (cred, as its
// registration returned it; "" for none).
func callAs(t *testing.T, method, url, tok, cred, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if cred != "" {
		req.Header.Set("Muster-Instance-Credential", cred)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// TestDevEndToEnd drives `muster dev` as a newcomer would: tokens from
// `muster token`, the API over loopback HTTP, a lease running out under the
// real reaper, `muster audit verify` before and after a row is changed by
// hand, shutdown, and a restart that keeps the data.
func TestDevEndToEnd(t *testing.T) {
	t.Setenv("MUSTER_LEASE_TTL", "2s")
	dir := devDir(t)
	dev := startDev(t, dir)

	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	web := token(t, dir, "--kind", "workload", "--service", "web")
	api := token(t, dir, "--kind", "workload", "--service", "api")

	if code, body := call(t, "GET", dev.url+"/v1/services", "", ""); code != 401 || !bytes.Contains(body, []byte("unauthenticated")) {
		t.Fatalf("no token: %d %s", code, body)
	}
	for _, s := range []struct{ name, body string }{
		{"web", `{"owner":"payments","capabilities":["probe","self","passive"]}`},
		{"api", `{"owner":"search","capabilities":["passive"]}`},
	} {
		if code, body := call(t, "PUT", dev.url+"/v1/services/"+s.name, admin, s.body); code != 201 {
			t.Fatalf("create %s: %d %s", s.name, code, body)
		}
	}
	if code, body := call(t, "POST", dev.url+"/v1/services/web/instances", api, `{"address":"127.0.0.1","port":9000,"zone":"az1"}`); code != 403 {
		t.Fatalf("api registering into web: %d %s", code, body)
	}
	if code, body := call(t, "PUT", dev.url+"/v1/services/web/contract", admin, `{"dependencies":[{"name":"db","shared":true,"authority":"unready"}]}`); code != 422 || !bytes.Contains(body, []byte(`"dependencies[0].authority"`)) {
		t.Fatalf("shared+unready: %d %s", code, body)
	}
	code, body := call(t, "POST", dev.url+"/v1/services/web/instances", web, `{"address":"127.0.0.1","port":9000,"zone":"az1"}`)
	if code != 201 {
		t.Fatalf("register: %d %s", code, body)
	}
	var inst struct {
		ID             string
		LeaseExpiresAt time.Time `json:"lease_expires_at"`
		Credential     string
	}
	if err := json.Unmarshal(body, &inst); err != nil || inst.Credential == "" {
		t.Fatalf("registration %s: %v", body, err)
	}
	// Evidence in, verdicts out, through the embedded evaluator. A report
	// about an instance registered a moment ago may be refused as unknown
	// until the evaluator has seen the registration; it asks for an early
	// refresh when that happens, so a retry soon succeeds.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body = callAs(t, "POST", dev.url+"/v1/reports", web, inst.Credential, `{"reports":[{"instance_id":"`+inst.ID+`","class":"self","outcome":"success"}]}`)
		if code == 200 && bytes.Contains(body, []byte(`"accepted":1`)) {
			break
		}
		// 503 not-ready: the evaluator is still rebuilding after the
		// start (slow on a loaded machine); it comes.
		if (code != 200 && code != 503) || time.Now().After(deadline) {
			t.Fatalf("report: %d %s", code, body)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	wait.For(t, time.Until(deadline), "eligibility showing the instance eligible", func() bool {
		code, body = call(t, "GET", dev.url+"/v1/services/web/eligibility", admin, "")
		return code == 200 && bytes.Contains(body, []byte(`"state":"eligible"`))
	})
	// Shift-backs are wired: draining az1 would leave web no instance in
	// rotation, so the budget refuses it; az2 holds nothing and drains.
	code, body = call(t, "POST", dev.url+"/v1/shifts", admin, `{"scope":"zone","target":"az1","reason":"drill: drain az1","manual":true}`)
	if code != 409 || !bytes.Contains(body, []byte("budget-exceeded")) || !bytes.Contains(body, []byte("web would keep 0 of 1")) {
		t.Fatalf("drain az1: %d %s", code, body)
	}
	if code, body = call(t, "POST", dev.url+"/v1/shifts", admin, `{"scope":"zone","target":"az2","reason":"drill: drain az2","manual":true}`); code != 201 {
		t.Fatalf("drain az2: %d %s", code, body)
	}

	code, body = callAs(t, "PUT", dev.url+"/v1/instances/"+inst.ID+"/lease", web, inst.Credential, "")
	if code != 200 {
		t.Fatalf("renew: %d %s", code, body)
	}
	var renewed struct {
		LeaseExpiresAt time.Time `json:"lease_expires_at"`
		UpdatedAt      time.Time `json:"updated_at"`
	}
	_ = json.Unmarshal(body, &renewed)
	if got := renewed.LeaseExpiresAt.Sub(renewed.UpdatedAt); got != 2*time.Second {
		t.Fatalf("lease runs %s after renewal, want the configured 2s", got)
	}

	// The real reaper ends it once the lease has run out, and not before.
	deadline = time.Now().Add(30 * time.Second)
	var ended struct {
		State   string
		EndedAt time.Time `json:"ended_at"`
	}
	wait.For(t, time.Until(deadline), "the lease expired after registration", func() bool {
		_, body = call(t, "GET", dev.url+"/v1/instances/"+inst.ID, admin, "")
		_ = json.Unmarshal(body, &ended)
		return ended.State == "expired"
	})
	if ended.EndedAt.Before(renewed.LeaseExpiresAt) {
		t.Fatalf("expired at %s, before the lease ran out at %s", ended.EndedAt, renewed.LeaseExpiresAt)
	}

	// The migrations are at the latest version, read through the running cluster.
	out, errOut, err := runCmd(t, "migrate", "version", "--data", dir)
	// The latest version is the highest file number (numbers may skip).
	ups, _ := fs.Glob(migrations.FS, "*.up.sql")
	latest := 0
	for _, f := range ups { // numbered files; the numbering may have gaps
		n, _ := strconv.Atoi(f[:strings.IndexByte(f, '_')])
		latest = max(latest, n)
	}
	if err != nil || !strings.Contains(out, fmt.Sprintf("schema version %d\n", latest)) {
		t.Fatalf("migrate version: %q %q %v", out, errOut, err)
	}

	// The audit chain verifies, then fails at the row changed by hand.
	out, errOut, err = runCmd(t, "audit", "verify", "--data", dir)
	if err != nil || !strings.Contains(out, "audit chain intact") {
		t.Fatalf("audit verify: %q %q %v", out, errOut, err)
	}
	tamper(t, dir, 3)
	out, errOut, err = runCmd(t, "audit", "verify", "--data", dir)
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "seq 3") {
		t.Fatalf("audit verify after tampering: %q %q err=%v", out, errOut, err)
	}

	// Shutdown stops the cluster; a restart on the same folder keeps the data.
	dev.stop()
	if _, err := os.Stat(filepath.Join(dir, "pgdata", "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the cluster is still running after shutdown (postmaster.pid: %v)", err)
	}
	dev2 := startDev(t, dir)
	if code, body := call(t, "GET", dev2.url+"/v1/services/web", admin, ""); code == 401 {
		// The issuer URL moved with the new port: tokens are minted anew.
		admin = token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
		code, body = call(t, "GET", dev2.url+"/v1/services/web", admin, "")
		if code != 200 {
			t.Fatalf("after restart: %d %s", code, body)
		}
	} else if code != 200 {
		t.Fatalf("after restart: %d %s", code, body)
	}
}

// tamper rewrites one audit row behind the trigger's back, as an attacker
// with database access would.
func tamper(t *testing.T, dir string, seq int) {
	t.Helper()
	ctx := context.Background()
	c, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Adopted() {
		t.Fatal("expected to adopt the running dev cluster")
	}
	defer c.Stop() // leaves it running for the dev server
	pool, err := db.Open(ctx, c.URL("muster"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, stmt := range []string{
		"ALTER TABLE audit_events DISABLE TRIGGER audit_events_append_only",
		"UPDATE audit_events SET reason = 'nothing happened here' WHERE seq = $1",
		"ALTER TABLE audit_events ENABLE TRIGGER audit_events_append_only",
	} {
		var args []any
		if strings.Contains(stmt, "$1") {
			args = append(args, seq)
		}
		if _, err := tx.Exec(ctx, stmt, args...); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestUsageErrors(t *testing.T) {
	untouched := filepath.Join(t.TempDir(), "never-created")
	defer func() {
		if _, err := os.Stat(untouched); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused command line created %s", untouched)
		}
	}()
	for _, args := range [][]string{
		{}, {"frobnicate"}, {"migrate"}, {"migrate", "sideways", "--data", untouched}, {"audit"}, {"token"},
		{"dev", "--no-such-flag"}, {"dev", "extra-arg"},
		{"breakglass", "--data", untouched}, {"breakglass", "--operator", "alice", "--data", untouched},
		{"breakglass", "revoke"}, {"breakglass", "revoke", "not-a-grant", "--data", untouched},
	} {
		_, _, err := runCmd(t, args...)
		if exitCode(err) != 2 {
			t.Errorf("muster %v: exit %d (%v), want 2", args, exitCode(err), err)
		}
	}
	t.Setenv("DATABASE_URL", "")
	t.Setenv("MUSTER_ISSUERS", "")
	_, _, err := runCmd(t, "serve", "--addr", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("serve without DATABASE_URL: %v", err)
	}
	_, _, err = runCmd(t, "dev", "--data", untouched, "--shift-steps", "0.5,0.2")
	if err == nil || !strings.Contains(err.Error(), "shift steps") {
		t.Fatalf("dev with decreasing shift steps: %v", err)
	}
	_, _, err = runCmd(t, "token", "--data", t.TempDir(), "--kind", "operator", "--subject", "x")
	if err == nil || !strings.Contains(err.Error(), "run `muster dev") {
		t.Fatalf("token without a dev issuer: %v", err)
	}
}
