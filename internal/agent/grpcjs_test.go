package agent_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/testbin"
	"github.com/musterhq/muster/internal/wait"
)

// grpcJSXDS is the folder holding node_modules with @grpc/grpc-js-xds
// (scripts/ensure-grpc-js-xds). Without it the test skips, or fails with
// MUSTER_REQUIRE_TOOLS=1.
func grpcJSXDS(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("MUSTER_GRPC_JS_XDS")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "muster", "grpc-js-xds")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@grpc", "grpc-js-xds", "package.json")); err != nil {
		msg := "no @grpc/grpc-js-xds in " + dir + ": run scripts/ensure-grpc-js-xds"
		if os.Getenv("MUSTER_REQUIRE_TOOLS") == "1" {
			t.Fatal(msg + "; MUSTER_REQUIRE_TOOLS=1 makes this a failure")
		}
		t.Skip(msg)
	}
	return dir
}

// nodeClient is testdata/grpc-js-xds/client.js running: a stock
// grpc-js-xds client calling xds:///SERVICE back to back.
type nodeClient struct {
	mu    sync.Mutex
	calls []nodeCall
}

// nodeCall is one call's outcome, stamped when the test read it.
type nodeCall struct {
	at  time.Time
	id  string // the backend that answered
	err string
}

func startNode(t *testing.T, modules, bootstrap, service string) *nodeClient {
	t.Helper()
	node := testbin.Require(t, "node")
	script, err := filepath.Abs("testdata/grpc-js-xds/client.js")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, script, "xds:///"+service, "5")
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(modules, "node_modules"), "GRPC_XDS_BOOTSTRAP="+bootstrap)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &nodeClient{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r struct{ ID, Err string }
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue
			}
			c.mu.Lock()
			c.calls = append(c.calls, nodeCall{at: time.Now(), id: r.ID, err: r.Err})
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("node stderr:\n%s", stderr.String())
		}
	})
	return c
}

// since returns the calls read at or after t.
func (c *nodeClient) since(t time.Time) []nodeCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, _ := slices.BinarySearchFunc(c.calls, t, func(c nodeCall, t time.Time) int { return c.at.Compare(t) })
	return slices.Clone(c.calls[i:])
}

// last returns the last n calls (fewer when there are fewer).
func (c *nodeClient) last(n int) []nodeCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls[max(0, len(c.calls)-n):])
}

// exactly reports whether calls (at least one) reached exactly want, and
// nothing failed.
func exactly(calls []nodeCall, want ...string) bool {
	seen := map[string]bool{}
	for _, c := range calls {
		if c.err != "" || !slices.Contains(want, c.id) {
			return false
		}
		seen[c.id] = true
	}
	return len(calls) > 0 && len(seen) == len(want)
}

// TestGRPCJSXDSThroughTheAgent: the real npm client, @grpc/grpc-js-xds
// 1.14.1 with @grpc/grpc-js 1.14.7 unpatched, bootstrapped with insecure
// channel credentials at muster agent, resolves xds:///web, follows a
// withdrawal within 1 s, and keeps landing on the last known backends
// with muster unreachable and the agent restarted; a new client started
// then resolves from the restarted agent's cache.
func TestGRPCJSXDSThroughTheAgent(t *testing.T) {
	t.Parallel()
	modules := grpcJSXDS(t)
	w := newWeb(t, "a1", "a2", "a3")
	g := newGate(t, strings.TrimPrefix(w.URL, "http://"))
	cfg := w.agentConfig(g.URL(), t.TempDir(), "web")
	ag := startAgent(t, cfg, "127.0.0.1:0")
	bootstrap := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(bootstrap, insecureBootstrap(ag.xdsAddr), 0o600); err != nil {
		t.Fatal(err)
	}

	c := startNode(t, modules, bootstrap, "web")
	start := time.Now()
	wait.For(t, 30*time.Second, "grpc-js-xds calls reaching a1, a2 and a3", func() bool { return exactly(c.last(60), "a1", "a2", "a3") })
	t.Logf("grpc-js-xds: xds:///web resolved through the agent; 60 calls in a row on a1, a2, a3 %s after the client started", time.Since(start).Round(time.Millisecond))

	// A withdrawal: the last call on a3 within 1 s of the report.
	reported := time.Now()
	w.withdraw("hard_failure", "a3")
	published := time.Now()
	wait.For(t, 10*time.Second, "grpc-js-xds calls off a3", func() bool { return exactly(c.last(60), "a1", "a2") })
	var lastOnA3 time.Time
	onA3 := 0
	after := c.since(reported)
	for _, call := range after {
		if call.id == "a3" {
			lastOnA3, onA3 = call.at, onA3+1
		}
		if call.err != "" {
			t.Fatalf("a call failed during the withdrawal: %s", call.err)
		}
	}
	// Round robin over three backends reaches each in any three calls
	// in a row: the client had dropped a3 at the latest by the third
	// call after the last one on a3 (or after the publication).
	from := published
	if lastOnA3.After(from) {
		from = lastOnA3
	}
	var next []nodeCall
	for _, call := range after {
		if call.at.After(from) {
			next = append(next, call)
		}
	}
	if len(next) < 3 {
		t.Fatalf("%d calls after the withdrawal's publication; want at least 3", len(next))
	}
	lag := next[2].at.Sub(reported)
	t.Logf("grpc-js-xds: withdrawal followed within %s of the report (report and publication took %s; of the %d calls since the report was sent, %d reached a3, the last %s after it)",
		lag.Round(time.Millisecond), published.Sub(reported).Round(time.Millisecond), len(after), onA3, max(0, lastOnA3.Sub(reported)).Round(time.Millisecond))
	if lag > time.Second {
		t.Fatalf("a3 was still called %s after its hard failure was reported; want within 1 s", lag)
	}

	// muster unreachable, the agent restarted on the same port and cache
	// folder: the running client keeps landing on a1 and a2 throughout,
	// and a new one resolves from the restarted agent.
	down := time.Now()
	g.Close()
	ag.stop()
	ag2 := startAgent(t, cfg, ag.xdsAddr)
	c2 := startNode(t, modules, bootstrap, "web")
	wait.For(t, 30*time.Second, "a new grpc-js-xds client reaching a1 and a2 through the restarted agent", func() bool { return exactly(c2.last(60), "a1", "a2") })
	wait.For(t, 10*time.Second, "the running client's calls since the restart", func() bool { return len(c.since(time.Now().Add(-time.Second))) > 60 })
	through := c.since(down)
	if !exactly(through, "a1", "a2") {
		var odd []nodeCall
		for _, call := range through {
			if call.err != "" || (call.id != "a1" && call.id != "a2") {
				odd = append(odd, call)
			}
		}
		t.Fatalf("the running client's %d calls since muster went away include %d off a1 and a2: %v", len(through), len(odd), odd[:min(5, len(odd))])
	}
	t.Logf("grpc-js-xds: %d calls since muster went away and the agent restarted, every one on a1 or a2; the agent restarted ready: %v", len(through), ag2.a.Ready())
}
