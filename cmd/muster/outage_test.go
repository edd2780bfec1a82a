package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/wait"
)

// outageScale is the outage length and lease TTL of the outage tests. By
// default they are scaled down (an 8 s TTL, a 24 s outage: three
// leases) so CI stays fast; MUSTER_TEST_OUTAGE=2m runs the figures
// (the default 30 s TTL, a 2 min outage).
func outageScale(t *testing.T) (outage, ttl time.Duration) {
	if v := os.Getenv("MUSTER_TEST_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("MUSTER_TEST_OUTAGE: %v", err)
		}
		return d, 30 * time.Second
	}
	// An 8 s lease renewed every 8/3 s: the outage is three leases long.
	// Shorter leases made the test measure the machine instead: under
	// the race detector on 2 cores busy with the whole suite, a renewal
	// round of 200 instances right after PostgreSQL's return could take
	// longer than a 3 or 5 s lease.
	return 24 * time.Second, 8 * time.Second
}

// fleet is n registered instances of service web whose workloads renew
// their leases every TTL/3, except one that stopped for good.
type fleet struct {
	url, admin string
	ids        []string
	stopped    string
	override   string
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	mu         sync.Mutex // guards ids, stopped and last
	// last is each instance's last renewal attempt: when, and how it
	// went; a failing test prints it for the instances that expired.
	last map[string]renewal
}

type renewal struct {
	okAt, failAt time.Time
	fail         string
}

func newFleet(t *testing.T, url, admin string, n int, ttl time.Duration) *fleet {
	t.Helper()
	f := &fleet{url: url, admin: admin, last: map[string]renewal{}}
	if code, body := call(t, "PUT", url+"/v1/services/web", admin, `{"owner":"payments","capabilities":[]}`); code != 201 {
		t.Fatalf("create web: %d %s", code, body)
	}
	// The workloads renew from the moment they are registered: under load
	// registering 200 instances may take longer than a lease.
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	client := &http.Client{Timeout: 2 * time.Second}
	// Each worker renews n/workers instances in turn; with a 2 s timeout
	// per call, few workers could not get round their share within a
	// lease on a machine too loaded to answer quickly (one did not, in
	// a CI run with a load of 17 on 2 cores). Real workloads renew each
	// on its own.
	const workers = 25
	for w := range workers {
		f.wg.Go(func() {
			tick := time.NewTicker(ttl / 3)
			defer tick.Stop()
			for {
				f.mu.Lock()
				ids, stopped := slices.Clone(f.ids), f.stopped
				f.mu.Unlock()
				for i := w; i < len(ids); i += workers {
					if ids[i] == stopped {
						continue
					}
					req, _ := http.NewRequestWithContext(ctx, "PUT", url+"/v1/instances/"+ids[i]+"/lease", nil)
					req.Header.Set("Authorization", "Bearer "+admin)
					res, err := client.Do(req)
					// Refused or failed while muster is away: keep trying.
					at, fail := time.Now(), ""
					if err != nil {
						fail = err.Error()
					} else {
						if res.StatusCode != 200 {
							b, _ := io.ReadAll(io.LimitReader(res.Body, 300))
							fail = fmt.Sprintf("%d %s", res.StatusCode, b)
						}
						res.Body.Close()
					}
					f.mu.Lock()
					r := f.last[ids[i]]
					if fail == "" {
						r.okAt = at
					} else {
						r.failAt, r.fail = at, fail
					}
					f.last[ids[i]] = r
					f.mu.Unlock()
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	t.Cleanup(f.stop)
	for i := range n {
		// A registration that meets 503 (a database call past its budget
		// on a loaded machine) changed nothing: register again, as a
		// workload would.
		var code int
		var body []byte
		wait.For(t, 30*time.Second, fmt.Sprintf("registration %d answered other than 503", i), func() bool {
			code, body = call(t, "POST", url+"/v1/services/web/instances", admin,
				fmt.Sprintf(`{"address":"10.7.%d.%d","port":8080,"zone":"az%d"}`, i/250, i%250+1, i%2+1))
			return code != 503
		})
		if code != 201 {
			t.Fatalf("register %d: %d %s", i, code, body)
		}
		var in struct{ ID string }
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		if i == 0 {
			f.stopped = in.ID // the one that never renews
		}
		f.ids = append(f.ids, in.ID)
		f.mu.Unlock()
	}
	// An operator's override on another instance must survive too. Until
	// the evaluator's next refresh has seen the instances (within a
	// second) admission answers 503 not-ready: try again, as a client would.
	var (
		code int
		body []byte
	)
	wait.For(t, 30*time.Second, "the override admitted or refused", func() bool {
		code, body = call(t, "POST", url+"/v1/overrides", admin,
			fmt.Sprintf(`{"instance_id":%q,"action":"mark_ineligible","justification":"disk errors on the host","expires_in":86400}`, f.ids[1]))
		return code != 503
	})
	if code != 201 {
		t.Fatalf("override: %d %s", code, body)
	}
	var o struct{ ID string }
	_ = json.Unmarshal(body, &o)
	f.override = o.ID

	t.Cleanup(f.stop)
	return f
}

func (f *fleet) stop() { f.cancel(); f.wg.Wait() }

// states returns every instance's state by id.
func (f *fleet) states(t *testing.T) map[string]string {
	t.Helper()
	// Just after PostgreSQL returns, muster may still answer 503
	// database-unavailable until its monitor's next ping (within a
	// second): try again for a while.
	var code int
	var body []byte
	wait.For(t, 10*time.Second, "an answer other than 503 to the instance list", func() bool {
		code, body = call(t, "GET", f.url+"/v1/services/web/instances?state=all&limit=1000", f.admin, "")
		return code != 503
	})
	if code != 200 {
		t.Fatalf("list instances: %d %s", code, body)
	}
	var page struct{ Items []struct{ ID, State string } }
	if err := json.Unmarshal(body, &page); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, in := range page.Items {
		out[in.ID] = in.State
	}
	return out
}

// check waits for the stopped instance to expire, no later than TTL and
// the expiry delay (TTL/3) after renewals could land again (plus two reaper
// sweeps and scheduling slack), then holds on for another TTL and checks
// that every other instance is active under its own id and the override
// is in force.
func (f *fleet) check(t *testing.T, back time.Time, ttl time.Duration) {
	t.Helper()
	budget := ttl + ttl/3 + 2*time.Second + 3*time.Second
	wait.For(t, time.Until(back.Add(budget+30*time.Second)), "the instance that stopped renewing expired after muster heard again",
		func() bool { return f.states(t)[f.stopped] == "expired" })
	took := time.Since(back)
	if took > budget {
		t.Errorf("the stopped instance expired %s after renewals could land again; TTL + grace is %s", took.Round(time.Millisecond), budget)
	}
	time.Sleep(ttl + ttl/3 + time.Second) // a wrongful expiry would have happened by now
	st := f.states(t)
	var active, other []string
	for _, id := range f.ids[1:] {
		if st[id] == "active" {
			active = append(active, id)
		} else {
			other = append(other, id+"="+st[id])
		}
	}
	if len(other) > 0 || len(st) != len(f.ids) {
		f.mu.Lock()
		for _, o := range other {
			id, _, _ := strings.Cut(o, "=")
			r := f.last[id]
			t.Logf("%s: last renewed %s after muster heard again; last refused %s after (%s)",
				id, r.okAt.Sub(back).Round(time.Millisecond), r.failAt.Sub(back).Round(time.Millisecond), r.fail)
		}
		f.mu.Unlock()
		t.Fatalf("after the outage %d of %d renewing instances are active (ids kept); not: %s; %d instances listed",
			len(active), len(f.ids)-1, strings.Join(other, ", "), len(st))
	}
	code, body := call(t, "GET", f.url+"/v1/overrides/"+f.override, f.admin, "")
	if code != 200 || !strings.Contains(string(body), `"state":"active"`) {
		t.Fatalf("the override after the outage: %d %s", code, body)
	}
	t.Logf("the instance that stopped renewing expired %s after renewals could land again (TTL %s); %d others kept their ids",
		took.Round(time.Millisecond), ttl, len(active))
}

// TestMusterKilledLongerThanALease (issue 11): muster is SIGKILLed for
// longer than a lease (3 leases by default; MUSTER_TEST_OUTAGE=2m for the
// issue's 2 min at the default 30 s TTL) while 200 registered instances
// keep trying to renew. After the restart nothing expired from muster's
// own absence: every renewing instance is active under its id, the
// override is in force, and the one instance that really stopped renewing
// expires within TTL + grace.
func TestMusterKilledLongerThanALease(t *testing.T) {
	realTime(t, "muster SIGKILLed for three leases")
	t.Parallel()
	outage, ttl := outageScale(t)
	dir := devDir(t)
	addr := freeAddr(t)
	url := "http://" + addr
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	env := "MUSTER_LEASE_TTL=" + ttl.String()
	first := startProcess(t, dir, addr, env)
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = first.Process.Kill()
			_ = first.Wait()
		}
	})
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	f := newFleet(t, url, admin, 200, ttl)

	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	killed = true
	time.Sleep(outage) // the outage itself: muster is gone this long

	second := startProcess(t, dir, addr, env)
	back := time.Now()
	t.Cleanup(func() {
		_ = second.Process.Signal(os.Interrupt)
		_ = second.Wait()
	})
	f.check(t, back, ttl)
}

// TestDatabaseStoppedLongerThanALease (issue 11): PostgreSQL is stopped for
// longer than a lease while muster runs and 200 instances keep trying to
// renew (their renewals fail meanwhile). When it returns, every lease gets a
// full TTL to be renewed: nothing expires but the instance that really
// stopped, within TTL + grace of the database's return.
func TestDatabaseStoppedLongerThanALease(t *testing.T) {
	realTime(t, "PostgreSQL stopped for three leases")
	t.Parallel()
	outage, ttl := outageScale(t)
	dir := devDir(t)
	addr := freeAddr(t)
	url := "http://" + addr
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	proc := startProcess(t, dir, addr, "MUSTER_LEASE_TTL="+ttl.String())
	t.Cleanup(func() {
		_ = proc.Process.Signal(os.Interrupt)
		_ = proc.Wait()
	})
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	f := newFleet(t, url, admin, 200, ttl)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := db.StopDir(ctx, dir); err != nil {
		t.Fatal(err)
	}
	time.Sleep(outage) // the outage itself: PostgreSQL is gone this long
	if _, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	f.check(t, time.Now(), ttl)
}
