package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// TestMain stops the test cluster apptest stacks use, and removes the
// muster binary the real-process tests ran (musterBinary).
func TestMain(m *testing.M) {
	dbtest.Main(m, removeMusterBinary)
}

// startProcess runs `muster dev` as a child process on addr and waits for it
// to serve.
func startProcess(t *testing.T, dir, addr string, env ...string) *exec.Cmd {
	t.Helper()
	cmd, _ := startProcessServing(t, dir, addr, env...)
	return cmd
}

// startProcessServing is startProcess, also returning the line in which
// the process said where it serves.
func startProcessServing(t *testing.T, dir, addr string, env ...string) (*exec.Cmd, string) {
	t.Helper()
	return startBinaryServing(t, musterBinary(t), dir, addr, env...)
}

// startBinaryServing is startProcessServing for the muster binary exe
// (another release's, say).
func startBinaryServing(t *testing.T, exe, dir, addr string, env ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(exe, "dev", "--addr", addr, "--data", dir)
	cmd.Env = append(os.Environ(), env...)
	// The process's output is kept in a file; a failing test prints what
	// it said about leases, the database and errors.
	// MUSTER_TEST_LOG_DIR keeps every process's whole log there.
	logDir := cmp.Or(os.Getenv("MUSTER_TEST_LOG_DIR"), t.TempDir())
	logf, err := os.CreateTemp(logDir, "muster-"+strings.ReplaceAll(addr, ":", "_")+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	t.Cleanup(func() {
		if t.Failed() {
			dumpProcessLog(t, logf.Name())
		}
	})
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	served := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			_, _ = logf.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "serving on") {
				served <- sc.Text()
			}
		}
		served <- ""
	}()
	var line string
	select {
	case line = <-served:
		if line == "" {
			t.Fatal("muster dev exited before serving")
		}
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("muster dev did not serve within 90 s")
	}
	return cmd, line
}

// dumpProcessLog logs the lines of a muster process's log that speak of
// leases and shards, the database, the demo, warnings or errors (at
// most the last 300).
func dumpProcessLog(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Logf("muster log %s: %v", path, err)
		return
	}
	logNotable(t, filepath.Base(path), string(b))
}

// logNotable logs the lines of a muster log that speak of leases, the
// database, the demo, warnings or errors (at most the last 300).
func logNotable(t *testing.T, name, log string) {
	var keep []string
	for line := range strings.Lines(log) {
		l := strings.ToLower(line)
		if strings.Contains(l, "lease") || strings.Contains(l, "database") || strings.Contains(l, "warn") ||
			strings.Contains(l, "error") || strings.Contains(l, "expire") || strings.Contains(l, "serving") ||
			strings.Contains(l, "demo") || strings.Contains(l, "xds") || strings.Contains(l, "shard") ||
			strings.Contains(l, "no longer live") {
			keep = append(keep, strings.TrimRight(line, "\n"))
		}
	}
	if len(keep) > 300 {
		keep = keep[len(keep)-300:]
	}
	t.Logf("muster log %s (%d of its lines):\n%s", name, len(keep), strings.Join(keep, "\n"))
}

// freeAddr returns a loopback address nothing listens on, for a process
// the test starts (and restarts on the same address) itself. The port is
// drawn below Linux's ephemeral range (32768-60999 by default): a port
// the kernel hands out (127.0.0.1:0) is one it may hand to any outgoing
// connection of the tests running beside this one before the process
// binds it, and a test lost its xDS listener so ("address already in
// use"). Only another freeAddr can draw the same port, one in 12,000.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 100 {
		addr := fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken: draw again
		}
		ln.Close()
		return addr
	}
	t.Fatal("no free loopback port below the ephemeral range in 100 draws")
	return ""
}

// TestResolverOutlivesAKilledServer (ADR-01): a resolver keeps routing on
// its view when the server is SIGKILLed, a second resolver started during
// the outage routes from the cache file, and after the server restarts the
// resolvers re-subscribe and converge without a version going backwards.
func TestResolverOutlivesAKilledServer(t *testing.T) {
	realTime(t, "muster SIGKILLed under two resolvers")
	t.Parallel() // its own data folder, port and process
	dir := devDir(t)
	addr := freeAddr(t)
	url := "http://" + addr
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir) // the killed server's cluster stays up
	})
	first := startProcess(t, dir, addr)
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = first.Process.Kill()
			_ = first.Wait()
		}
	})

	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	// No readiness signal: an instance enters as eligible with health
	// unknown (ADR-16), so the view has it without any health reports.
	if code, body := call(t, "PUT", url+"/v1/services/web", admin, `{"owner":"payments","capabilities":[]}`); code != 201 {
		t.Fatalf("create web: %d %s", code, body)
	}
	if code, body := call(t, "POST", url+"/v1/services/web/instances", admin, `{"address":"10.1.2.3","port":8080,"zone":"az1"}`); code != 201 {
		t.Fatalf("register: %d %s", code, body)
	}

	viewer := func(context.Context) (string, error) {
		return token(t, dir, "--kind", "operator", "--subject", "vera", "--role", "viewer"), nil
	}
	cacheDir := t.TempDir()
	ctx := context.Background()
	c1, err := resolver.New(ctx, resolver.Config{URLs: []string{url}, Token: viewer, Services: []string{"web"},
		CacheDir: cacheDir, BaseBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	// The view that holds the instance (web's first view may come before
	// its addition window closes, with nothing in it).
	var before uint64
	wait.For(t, 60*time.Second, "a view of web holding 10.1.2.3", func() bool {
		r, err := c1.Resolve("web")
		if err != nil || len(r.Endpoints()) != 1 {
			return false
		}
		before = r.Version()
		return true
	})
	// Routing switches to a view before its last-known-good file is
	// written (the write must not delay routing), so wait for the file
	// before pulling the plug.
	wait.For(t, 30*time.Second, fmt.Sprintf("a last-known-good file of web v%d in %s", before, cacheDir), func() bool {
		v, err := resolver.LoadView(cacheDir, "web")
		return err == nil && v.Version >= before
	})
	endpoints := func(c *resolver.Client) string {
		r, err := c.Resolve("web")
		if err != nil {
			t.Fatalf("resolve: %v", err)
		}
		var s []string
		for _, ep := range r.Endpoints() {
			s = append(s, ep.Address)
		}
		return strings.Join(s, ",")
	}
	want := endpoints(c1)
	if want != "10.1.2.3" {
		t.Fatalf("endpoints before the outage: %q", want)
	}
	// muster resolve --json says where its answer came from, and how old
	// it is: live while muster serves...
	resolveJSON := func(cache string) resolveOutput {
		t.Helper()
		tok, _ := viewer(ctx)
		var out, errb bytes.Buffer
		if err := run(ctx, []string{"resolve", "web", "--json", "--server", url, "--token", tok, "--cache", cache, "--timeout", "10s"}, &out, &errb); err != nil {
			t.Fatalf("muster resolve web --json: %v\n%s", err, errb.String())
		}
		return decodeResolveJSON(t, out.Bytes())
	}
	if r := resolveJSON(t.TempDir()); r.Source != "live" || r.Version < before || len(r.Endpoints) != 1 {
		t.Fatalf("resolve --json while muster serves: %+v", r)
	}

	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	killed = true
	if got := endpoints(c1); got != want {
		t.Fatalf("after SIGKILL the resolver answers %q, want %q", got, want)
	}
	// ...and, with muster killed, the cached view, marked as the cache's,
	// with its age.
	if r := resolveJSON(cacheDir); r.Source != "cache" || !strings.Contains(r.SourceReason, "muster unreachable") ||
		r.Version < before || len(r.Endpoints) != 1 || r.Endpoints[0].Address != "10.1.2.3" ||
		r.AgeSeconds <= 0 || r.ResolvedAt.Before(r.GeneratedAt) {
		t.Fatalf("resolve --json with muster killed: %+v", r)
	}

	// A resolver started during the outage routes from the file.
	c2, err := resolver.New(ctx, resolver.Config{URLs: []string{url}, Token: viewer, Services: []string{"web"},
		CacheDir: cacheDir, BaseBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got := endpoints(c2); got != want {
		t.Fatalf("a resolver started during the outage answers %q, want %q", got, want)
	}

	// The server comes back; both converge on a newer version.
	second := startProcess(t, dir, addr)
	t.Cleanup(func() {
		_ = second.Process.Signal(os.Interrupt)
		_ = second.Wait()
	})
	after1 := waitVersion(t, c1, before+1)
	after2 := waitVersion(t, c2, before+1)
	if got := endpoints(c1); got != want || endpoints(c2) != want {
		t.Fatalf("after the restart: %q / %q, want %q", got, endpoints(c2), want)
	}
	// Both re-subscribed through the restarted server's admission control
	// (a cold server admits its floor, 50 per 10 s) without a refusal, and
	// both stream to a synced state.
	for i, c := range []*resolver.Client{c1, c2} {
		wait.For(t, 30*time.Second, fmt.Sprintf("resolver %d synced with the restarted server", i+1), func() bool { return c.Stats().Synced })
	}
	code, metrics := call(t, "GET", url+"/metrics", admin, "")
	if code != 200 || !regexp.MustCompile(`(?m)^muster_watch_admission_refused_total 0$`).Match(metrics) ||
		!regexp.MustCompile(`(?m)^muster_watch_subscribers 2$`).Match(metrics) {
		t.Fatalf("restarted server's admission: %d\n%s", code, grepLines(metrics, "muster_watch_"))
	}
	t.Logf("version %d before the outage, %d and %d after the restart; reconnects %d and %d",
		before, after1, after2, c1.Stats().Reconnects, c2.Stats().Reconnects)
}

// grepLines returns the lines of b containing s.
func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// waitVersion polls (with a deadline) until the client holds web at a
// version of at least min, and checks that what it holds never goes back.
func waitVersion(t *testing.T, c *resolver.Client, min uint64) uint64 {
	t.Helper()
	var last uint64
	wait.For(t, 60*time.Second, fmt.Sprintf("a view of web at version >= %d", min), func() bool {
		r, err := c.Resolve("web")
		if err != nil {
			return false
		}
		v := r.Version()
		if v < last {
			t.Fatalf("version went back from %d to %d", last, v)
		}
		last = v
		return v >= min
	})
	return last
}

// TestDevStopsAnAdoptedCluster (issue 11): a muster dev that adopted the
// cluster of a SIGKILLed predecessor stops it on Ctrl-C, as the README
// promises, but not while another live muster dev still uses it.
func TestDevStopsAnAdoptedCluster(t *testing.T) {
	t.Parallel()
	dir := devDir(t)
	ctx := context.Background()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	running := func() bool {
		t.Helper()
		up, err := db.ClusterRunning(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		return up
	}
	stop := func(p *exec.Cmd, sig os.Signal) {
		t.Helper()
		if err := p.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if err := p.Wait(); err != nil && sig != syscall.SIGKILL {
			t.Fatalf("muster dev after %v: %v", sig, err)
		}
	}

	stop(startProcess(t, dir, freeAddr(t)), syscall.SIGKILL)
	if !running() {
		t.Fatal("the cluster of the SIGKILLed muster dev is not running; nothing to adopt")
	}
	adopter := startProcess(t, dir, freeAddr(t))
	neighbourAddr := freeAddr(t)
	neighbour := startProcess(t, dir, neighbourAddr)
	t.Cleanup(func() {
		for _, p := range []*exec.Cmd{adopter, neighbour} {
			if p.ProcessState == nil {
				_ = p.Process.Kill()
				_ = p.Wait()
			}
		}
	})

	// The neighbour still uses the cluster: Ctrl-C on the adopter leaves it
	// running, and the neighbour keeps writing to it.
	stop(adopter, os.Interrupt)
	if !running() {
		t.Fatal("Ctrl-C on one muster dev stopped the cluster another one is using")
	}
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	if code, body := call(t, "PUT", "http://"+neighbourAddr+"/v1/services/web", admin, `{"owner":"payments","capabilities":[]}`); code != 201 {
		t.Fatalf("the remaining muster dev cannot write: %d %s", code, body)
	}

	// The last one out stops it: SIGTERM as well as Ctrl-C.
	stop(neighbour, syscall.SIGTERM)
	if running() {
		t.Fatal("the cluster is still running after its last muster dev stopped")
	}
	if _, err := os.Stat(filepath.Join(dir, "pgdata", "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("postmaster.pid after the last muster dev stopped: %v", err)
	}
}
