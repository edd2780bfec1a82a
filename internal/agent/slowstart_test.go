package agent_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/testbin"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds/xdstest"
	"github.com/musterhq/muster/resolver"
)

// tallyClient is testdata/grpc-js-xds/client.js in tally mode: one
// stock grpc-js-xds channel to xds:///SERVICE that makes N calls when
// asked and answers how many each backend took.
type tallyClient struct {
	t      *testing.T
	in     io.WriteCloser
	lines  chan []byte
	stderr *strings.Builder
}

func startTallyNode(t *testing.T, modules, bootstrap, service string) *tallyClient {
	t.Helper()
	node := testbin.Require(t, "node")
	script, err := filepath.Abs("testdata/grpc-js-xds/client.js")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, script, "xds:///"+service, "tally")
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(modules, "node_modules"), "GRPC_XDS_BOOTSTRAP="+bootstrap)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &tallyClient{t: t, in: in, lines: make(chan []byte, 1), stderr: &strings.Builder{}}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			c.lines <- slices.Clone(sc.Bytes())
		}
	}()
	t.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Process.Kill()
		for range c.lines {
		}
		<-done
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("node stderr:\n%s", c.stderr.String())
		}
	})
	return c
}

// tally makes n calls and returns how many each backend took; failed
// calls count under "error: CODE DETAILS", as xdstest.Tally counts them.
func (c *tallyClient) tally(n int) map[string]int {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.in, "%d\n", n); err != nil {
		c.t.Fatalf("grpc-js-xds client: %v\n%s", err, c.stderr.String())
	}
	var line []byte
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.t.Fatalf("the grpc-js-xds client exited:\n%s", c.stderr.String())
		}
		line = l
	case <-time.After(2 * time.Minute): // a bound on a hung client, not a wait for a condition
		c.t.Fatalf("the grpc-js-xds client made no tally of %d calls in 2 min:\n%s", n, c.stderr.String())
	}
	var r struct {
		Tally map[string]int
		Errs  []string
	}
	if err := json.Unmarshal(line, &r); err != nil {
		c.t.Fatalf("grpc-js-xds client said %q: %v", line, err)
	}
	out := r.Tally
	if out == nil {
		out = map[string]int{}
	}
	for _, e := range r.Errs {
		out["error: "+e]++
	}
	return out
}

// TestClientsFollowSlowStartThroughTheAgent: two stock clients through
// muster agent with an insecure bootstrap, the npm @grpc/grpc-js-xds
// (unpatched) and grpc-go's own xDS resolver, send a new instance,
// ramping through slow start (on the stack's clock) beside two
// instances of its zone and two of another at full weight, the share
// its published weight gives it at every step of the ramp, within ±5
// percentage points over 2,000 calls each. Before muster split ramping
// endpoints into localities of their own, gRPC clients gave such an
// instance a third of its zone's calls from its first step.
func TestClientsFollowSlowStartThroughTheAgent(t *testing.T) {
	t.Parallel()
	modules := grpcJSXDS(t)
	old := []string{"a1", "a2", "b1", "b2"}
	w := newWebIn(t, old, []string{"az1", "az1", "az2", "az2"})

	view := func() (resolver.View, *resolver.Snapshot) {
		t.Helper()
		f, ok := w.Hub.View("web")
		if !ok {
			t.Fatal("no view of web")
		}
		var v resolver.View
		if err := json.Unmarshal(f.JSON, &v); err != nil {
			t.Fatal(err)
		}
		s, err := resolver.SnapshotOf(v, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return v, s
	}
	weight := func(id string) float64 {
		v, _ := view()
		for _, ep := range v.Endpoints {
			if ep.InstanceID == w.ids[id] {
				return ep.Weight
			}
		}
		return 0
	}
	// step moves the stack's clock on by two of slow start's steps (a
	// step is 6 s of its 60 s), the prober reporting every backend
	// healthy, and publishes: five measured steps rather than ten keep
	// the test's time down and still show the ramp.
	step := func(backends ...string) {
		w.Clock.Advance(11 * time.Second)
		w.report("success", backends...) // adds 1.1 s
	}
	// The first instances ramp together (one weight per zone: one
	// locality each); take them to full weight before any client.
	for i := 0; weight("a1") < 1 || weight("b2") < 1; i++ {
		if i == 20 {
			t.Fatalf("the first instances never reached full weight: a1 at %v", weight("a1"))
		}
		step(old...)
	}

	g := newGate(t, strings.TrimPrefix(w.URL, "http://"))
	ag := startAgent(t, w.agentConfig(g.URL(), t.TempDir(), "web"), "127.0.0.1:0")
	bootstrap := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(bootstrap, insecureBootstrap(ag.xdsAddr), 0o600); err != nil {
		t.Fatal(err)
	}
	js := startTallyNode(t, modules, bootstrap, "web")
	goc := dial(t, ag.xdsAddr, "web")
	clients := []struct {
		name  string
		tally func(n int) map[string]int
	}{
		{"grpc-js-xds", js.tally},
		{"grpc-go", func(n int) map[string]int { return xdstest.Tally(t.Context(), goc, n) }},
	}
	keys := func(m map[string]int) []string { return slices.Sorted(maps.Keys(m)) }
	for _, c := range clients {
		wait.For(t, 30*time.Second, c.name+" reaching a1, a2, b1 and b2 through the agent", func() bool { return slices.Equal(keys(c.tally(200)), old) })
	}

	// A new instance in az1, admitted by its first success.
	w.register("n1", "az1")
	if err := w.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	all := append(slices.Clone(old), "n1")
	w.report("success", all...)

	const calls = 2000
	var last map[string]int // the last calls' tally, shown should the test fail
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last calls: %v", last)
		}
	})
	table := []string{"weight  published share  grpc-js-xds  grpc-go"}
	var ramped []float64
	for i := 0; ; i++ {
		if i == 20 {
			t.Fatalf("n1 never reached full weight: at %v", weight("n1"))
		}
		wt := weight("n1")
		if len(ramped) > 0 && wt == ramped[len(ramped)-1] {
			step(all...)
			continue
		}
		ramped = append(ramped, wt)
		v, s := view()
		var total, mine float64
		for _, target := range s.Targets() {
			total += target.Share
			if target.InstanceID == w.ids["n1"] {
				mine = target.Share
			}
		}
		want := mine / total
		// The agent holds the step once its /v1/resolve answers the
		// view's version; its xDS clients follow right after.
		wait.For(t, 10*time.Second, fmt.Sprintf("the agent holding view %d", v.Version), func() bool {
			st, body := get(t, ag.httpURL+"/v1/resolve/web")
			var got resolver.View
			return st == http.StatusOK && json.Unmarshal(body, &got) == nil && got.Version >= v.Version
		})
		within := func(got map[string]int, n int) bool {
			sum := 0
			for _, b := range all {
				sum += got[b]
			}
			return sum == n && math.Abs(float64(got["n1"])/float64(n)-want) <= 0.05
		}
		row := fmt.Sprintf("%6.2f  %15.3f", wt, want)
		for _, c := range clients {
			// Settled: a quarter of the calls already within the bound
			// (the client has taken up the assignment and connected to
			// n1); then measured afresh.
			wait.For(t, 20*time.Second, fmt.Sprintf("%s: n1 at weight %v taking %.3f of the calls", c.name, wt, want), func() bool {
				last = c.tally(calls / 4)
				return within(last, calls/4)
			})
			got := c.tally(calls)
			if last = got; !within(got, calls) {
				t.Errorf("%s: n1 at weight %v: %d of %d calls (%.3f), want %.3f ± 0.05: %v", c.name, wt, got["n1"], calls, float64(got["n1"])/calls, want, got)
			}
			row += fmt.Sprintf("  %11.3f", float64(got["n1"])/calls)
		}
		table = append(table, row)
		if wt >= 1 {
			break
		}
		step(all...)
	}
	t.Logf("n1's share of %d calls from each client through muster agent at each step of its ramp:\n%s", calls, strings.Join(table, "\n"))
	if len(ramped) < 4 || ramped[0] >= 0.5 {
		t.Errorf("the ramp went %v: want it to start low and take several steps", ramped)
	}
}
