package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds/xdstest"
)

// TestProxylessGRPCOutlivesAKilledMuster (ADR-01, ADR-10): a grpc-go
// client dialling xds:///web through grpc-go's own xDS resolver, its
// bootstrap pointing at a real `muster dev` process, reaches web's real
// gRPC backends; muster is SIGKILLed and stays away for 1 min
// (MUSTER_TEST_XDS_OUTAGE), and every call in that time still reaches the
// same backends; after a restart the client follows the new process
// (a backend registered then starts getting calls) within 30 s. The
// client's channel to muster retries every second (xdstest.DialReconnecting):
// with grpc-go's default backoffs it would come back 1 to 3 min after the
// restart, a wait that is grpc-go's and proves nothing about muster.
func TestProxylessGRPCOutlivesAKilledMuster(t *testing.T) {
	realTime(t, "muster SIGKILLed for 1 min under a proxyless gRPC client")
	t.Parallel() // mostly waiting: its own cluster, ports and backends
	// Twice muster's default lease TTL and four times grpc-go's 15 s
	// resource-watch timer: no client timer is left to run out after that
	// (grpc-go keeps what it received with no expiry, and its channel to
	// muster is at its 1 s retry cap within seconds), so a longer outage
	// repeats the same steady state; MUSTER_TEST_XDS_OUTAGE=2m runs one.
	outage := time.Minute
	if v := os.Getenv("MUSTER_TEST_XDS_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		outage = d
	}
	dir := devDir(t)
	addr, xaddr := freeAddr(t), freeAddr(t)
	url := "http://" + addr
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir) // the killed server's cluster stays up
	})
	// Leases outlast the test: the restarted process would otherwise
	// expire the backends' leases 30 s after it starts serving.
	env := []string{"MUSTER_XDS_ADDR=" + xaddr, "MUSTER_LEASE_TTL=1h"}
	first := startProcess(t, dir, addr, env...)
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = first.Process.Kill()
			_ = first.Wait()
		}
	})
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	// No readiness signal: instances enter eligible with health unknown.
	if code, body := call(t, "PUT", url+"/v1/services/web", admin, `{"owner":"payments","capabilities":[]}`); code != 201 {
		t.Fatalf("create web: %d %s", code, body)
	}
	register := func(b *xdstest.Backend, zone string) {
		t.Helper()
		body := fmt.Sprintf(`{"address":"127.0.0.1","port":%d,"zone":%q}`, b.Addr.Port, zone)
		if code, resp := call(t, "POST", url+"/v1/services/web/instances", admin, body); code != 201 {
			t.Fatalf("register %s: %d %s", b.ID, code, resp)
		}
	}
	register(xdstest.StartBackend(t, "b1"), "az1")
	register(xdstest.StartBackend(t, "b2"), "az2")

	conn := xdstest.DialReconnecting(t, xaddr, token(t, dir, "--kind", "workload", "--service", "web"), "web", time.Second)
	reaches := func(n int) []string { return slices.Sorted(maps.Keys(xdstest.Tally(t.Context(), conn, n))) }
	want := []string{"b1", "b2"}
	wait.For(t, time.Minute, "the client reaching b1 and b2", func() bool { return slices.Equal(reaches(100), want) })

	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	killed = true
	// Calls through the outage, looked at every 5 s: the same backends,
	// no error.
	end := time.Now().Add(outage)
	tick := time.NewTicker(5 * time.Second)
	looks := 0
	for time.Now().Before(end) {
		if got := reaches(50); !slices.Equal(got, want) {
			t.Fatalf("%s into the outage the client reaches %v, want %v", time.Until(end).Round(time.Second), got, want)
		}
		looks++
		<-tick.C
	}
	tick.Stop()
	t.Logf("muster away %s: %d looks of 50 calls, each reaching exactly %v", outage, looks, want)

	second := startProcess(t, dir, addr, env...)
	restarted := time.Now()
	t.Cleanup(func() {
		_ = second.Process.Signal(os.Interrupt)
		_ = second.Wait()
	})
	register(xdstest.StartBackend(t, "b3"), "az1")
	// The client's channel retries every second and its ADS stream waits
	// for it, so it reconnects about a second after muster serves again;
	// the rest is muster's: a fresh ADS stream gets the current view.
	want = []string{"b1", "b2", "b3"}
	last := time.Now()
	wait.For(t, 30*time.Second, "the client following the restarted muster to b3", func() bool {
		got := reaches(60)
		if time.Since(last) > 5*time.Second {
			last = time.Now()
			t.Logf("%s after the restart the client reaches %v", time.Since(restarted).Round(time.Second), got)
		}
		if slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "error") }) {
			t.Fatalf("calls failed after the restart: %v", got)
		}
		return slices.Equal(got, want)
	})
	t.Logf("the client followed the restarted muster %s after it served", time.Since(restarted).Round(time.Second))
}

// TestGRPCClientDropsAHardFailure: on a real `muster dev` (its own
// evaluator tick, publisher and clock), a grpc-go xds:/// client reaching
// three eligible backends stops sending to one after a prober reports its
// hard failure, and the test prints how long that took. The budget (2 s)
// is a figure, measured by `muster loadgen xds` (TestLoadgenXDSWithdrawals
// prints it), not a deadline here: on a loaded CI machine a poll of 30
// calls alone can take longer.
func TestGRPCClientDropsAHardFailure(t *testing.T) {
	realTime(t, "muster dev under a proxyless gRPC client")
	t.Parallel()
	dir := devDir(t)
	xaddr := freeAddr(t)
	d := startDev(t, dir, "--xds-addr", xaddr)
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	if code, body := call(t, "PUT", d.url+"/v1/services/web", admin, `{"owner":"payments","capabilities":["probe"]}`); code != 201 {
		t.Fatalf("create web: %d %s", code, body)
	}
	// An idempotent PUT, retried while a loaded machine answers 503
	// (its database past the 1.5 s timeout).
	var assigned string
	wait.For(t, 30*time.Second, "the prober assigned", func() bool {
		code, body := call(t, "PUT", d.url+"/v1/probers/prober-1/assignments", admin, `{"services":["web"]}`)
		assigned = fmt.Sprintf("%d %s", code, body)
		if code != 200 && code != 503 {
			t.Fatalf("assign: %s", assigned)
		}
		return code == 200
	})
	prober := token(t, dir, "--kind", "prober", "--subject", "prober-1")
	ids := map[string]string{}
	for _, id := range []string{"b1", "b2", "b3"} {
		b := xdstest.StartBackend(t, id)
		code, body := call(t, "POST", d.url+"/v1/services/web/instances", admin, fmt.Sprintf(`{"address":"127.0.0.1","port":%d,"zone":"az1"}`, b.Addr.Port))
		if code != 201 {
			t.Fatalf("register %s: %d %s", id, code, body)
		}
		ids[id] = string(regexp.MustCompile(`"id":"([^"]+)"`).FindSubmatch(body)[1])
	}
	// report sends the outcomes; false while muster answers 503 (still
	// rebuilding after its start, or its database slow on a loaded
	// machine: the prober sends again).
	report := func(outcome string, backends ...string) bool {
		t.Helper()
		var items []string
		for _, b := range backends {
			items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":%q}`, ids[b], outcome))
		}
		code, body := call(t, "POST", d.url+"/v1/reports", prober, `{"reports":[`+strings.Join(items, ",")+`]}`)
		if code == 503 {
			return false
		}
		if code != 200 || strings.Contains(string(body), `"code"`) {
			t.Fatalf("report: %d %s", code, body)
		}
		return true
	}
	// Probes succeed until a first success admits each instance.
	conn := xdstest.Dial(t, xaddr, token(t, dir, "--kind", "workload", "--service", "web"), "web")
	reaches := func(n int) []string { return slices.Sorted(maps.Keys(xdstest.Tally(t.Context(), conn, n))) }
	wait.For(t, time.Minute, "the client reaching b1, b2 and b3", func() bool {
		return report("success", "b1", "b2", "b3") && slices.Equal(reaches(60), []string{"b1", "b2", "b3"})
	})
	var start time.Time
	wait.For(t, 30*time.Second, "the hard failure of b3 accepted", func() bool {
		start = time.Now()
		return report("hard_failure", "b3")
	})
	wait.For(t, 30*time.Second, "no call reaching b3", func() bool { return slices.Equal(reaches(30), []string{"b1", "b2"}) })
	t.Logf("b3 out of the client's rotation %s after its hard failure was reported (budget: 2 s)", time.Since(start).Round(time.Millisecond))
}
