package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/streamcheck"
	"github.com/musterhq/muster/internal/wait"
)

// The region of the handover test: 20,000 seeded instances with a
// minute of observed windows over 60 services, 45 subscribers of two
// services each, 15 on each of the first three replicas.
const (
	handoverServices    = 60
	handoverSubscribers = 45
	// handoverBudget is what the test insists on: ADR-11's budget (99%
	// within 5 s). Before make before break, a service that moved waited
	// for its new owner's rebuild: 4.5 s median, 6.8 s max on a quiet
	// machine and 10.5 to 17.7 s on a loaded one. The figures measured
	// are logged, well under it.
	handoverBudget = 5 * time.Second
)

// handoverInstances is the region's size: 20,000, as the issue asks
// (`go test ./...`, the README's command). Under the race detector (CI)
// each of the four processes holding them runs several times slower and
// the test starved the other real-process tests running beside it (a
// 14-minute package timeout), so it holds 5,000 there: the handover
// protocol is the same, the rebuilds shorter.
var handoverInstances = map[bool]int{false: 20000, true: 5000}[raceDetector]

// withdrawal is one deregistration the test made, and when each of the
// subscribers of its service stopped routing to the instance.
type withdrawal struct {
	service string
	id      uuid.UUID
	sent    time.Time // the DELETE was sent
	done    time.Time // muster answered it
	phase   string    // what the region was doing
	reached map[*streamcheck.Checker]time.Duration
}

// TestRoutineTransitionsNeverDelayAWithdrawal: three replicas (real
// processes) on one PostgreSQL holding 20,000 seeded instances, with
// subscribers on every replica, are restarted one after another
// (SIGTERM, start again) and scaled from three to four and back, while
// an instance is deregistered every second, round-robin over the
// services. Every withdrawal reaches every subscriber of its service
// within ADR-11's budget, and the subscribers see no gap, regression or
// empty view: a replica hands its shards over before it stops, and one
// that starts is dealt shards only once it can publish them.
func TestRoutineTransitionsNeverDelayAWithdrawal(t *testing.T) {
	realTime(t, "a rolling restart and a scale-out of three replicas holding 20,000 instances (5,000 under -race)")
	t.Parallel()
	dir := devDir(t)
	ctx := context.Background()
	cluster, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Stop() })
	var out, errb bytes.Buffer
	if err := run(ctx, []string{"loadgen", "seed", "--data", dir, "--services", fmt.Sprint(handoverServices),
		"--instances", fmt.Sprint(handoverInstances), "--minutes", "1", "--history", "0", "--quarantined", "0"}, &out, &errb); err != nil {
		t.Fatalf("seed: %v\n%s", err, errb.String())
	}
	t.Logf("seed: %s", strings.TrimSpace(out.String()))

	env := []string{"MUSTER_OVERRIDE_LIMIT=100000/1m", "MUSTER_DEREGISTRATION_LIMIT=100000/1m", "MUSTER_WRITE_LIMIT=100000/1m",
		"MUSTER_ADMISSION_FLOOR=1000"}
	addrs := []string{freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)}
	urls := make([]string, len(addrs))
	for i, a := range addrs {
		urls[i] = "http://" + a
	}
	var procsMu sync.Mutex
	procs := make([]*exec.Cmd, len(addrs))
	up := func() []string {
		procsMu.Lock()
		defer procsMu.Unlock()
		var out []string
		for i, p := range procs {
			if p != nil {
				out = append(out, urls[i])
			}
		}
		return out
	}
	startAt := func(i int) {
		c := startProcess(t, dir, addrs[i], env...)
		procsMu.Lock()
		procs[i] = c
		procsMu.Unlock()
	}
	stopAt := func(i int) {
		procsMu.Lock()
		c := procs[i]
		procs[i] = nil
		procsMu.Unlock()
		_ = c.Process.Signal(os.Interrupt)
		_ = c.Wait()
	}
	t.Cleanup(func() {
		for i := range procs {
			procsMu.Lock()
			c := procs[i]
			procsMu.Unlock()
			if c != nil {
				stopAt(i)
			}
		}
	})
	for i := range 3 {
		startAt(i)
	}
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	viewer := token(t, dir, "--kind", "operator", "--subject", "vera", "--role", "viewer")
	region := func(base string) (ownership.RegionStatus, bool) {
		code, body := call(t, "GET", base+"/v1/replicas", admin, "")
		if code != 200 {
			return ownership.RegionStatus{}, false
		}
		var r ownership.RegionStatus
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		return r, true
	}
	// balanced: every replica up is ready, lists n replicas, and they
	// hold the shards at their targets with none unowned.
	balanced := func(n int) func() bool {
		return func() bool {
			for _, b := range up() {
				if code, _ := call(t, "GET", b+"/readyz", "", ""); code != 200 {
					return false
				}
				r, ok := region(b)
				if !ok || len(r.Replicas) != n || len(r.Unowned) != 0 {
					return false
				}
				for _, rp := range r.Replicas {
					if rp.Shards < 64/n {
						return false
					}
				}
			}
			return true
		}
	}
	wait.For(t, 3*time.Minute, "three replicas ready and sharing the 64 shards", balanced(3))

	services := make([]string, handoverServices)
	for i := range services {
		services[i] = fmt.Sprintf("lg-%04d", i)
	}
	// The seeded prober reports every instance healthy every 3 s,
	// round-robin over the replicas, until they are admitted: the seed
	// writes a minute of windows but no admission transitions, so without
	// live evidence a replica that rebuilt after the windows aged would
	// hold the instances as awaiting their first success. Once admitted
	// (their owners write the transitions), silence keeps them in
	// rotation as unknown, through every restart.
	prober := token(t, dir, "--kind", "prober", "--subject", "loadgen-prober")
	var ids []string
	for _, name := range services {
		for cursor := ""; ; {
			code, body := call(t, "GET", urls[0]+"/v1/services/"+name+"/instances?limit=1000&cursor="+cursor, admin, "")
			if code != 200 {
				t.Fatalf("list %s's instances: %d %s", name, code, body)
			}
			var page struct {
				Items []struct {
					ID string `json:"id"`
				} `json:"items"`
				NextCursor string `json:"next_cursor"`
			}
			if err := json.Unmarshal(body, &page); err != nil {
				t.Fatal(err)
			}
			for _, it := range page.Items {
				ids = append(ids, it.ID)
			}
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
	}
	if len(ids) != handoverInstances {
		t.Fatalf("listed %d instances, want the %d seeded", len(ids), handoverInstances)
	}
	probeCtx, stopProbing := context.WithCancel(ctx)
	var probing sync.WaitGroup
	t.Cleanup(func() { stopProbing(); probing.Wait() })
	probing.Go(func() {
		hc := &http.Client{Timeout: 10 * time.Second}
		tick := time.NewTicker(3 * time.Second)
		defer tick.Stop()
		for n := 0; ; {
			for k := 0; k < len(ids); k += 5000 {
				items := make([]string, 0, 5000)
				for _, id := range ids[k:min(k+5000, len(ids))] {
					items = append(items, `{"instance_id":"`+id+`","class":"probe","outcome":"success"}`)
				}
				bases := up()
				req, err := http.NewRequestWithContext(probeCtx, "POST", bases[n%len(bases)]+"/v1/reports",
					strings.NewReader(`{"reports":[`+strings.Join(items, ",")+`]}`))
				if err != nil {
					return
				}
				n++
				req.Header.Set("Authorization", "Bearer "+prober)
				req.Header.Set("Content-Type", "application/json")
				if res, err := hc.Do(req); err == nil {
					res.Body.Close() // a replica going away loses one round of reports: the next comes 3 s later
				}
			}
			select {
			case <-probeCtx.Done():
				return
			case <-tick.C:
			}
		}
	})
	// The instances each service routes to, once the probes have
	// admitted them and every replica serves the same views.
	routable := map[string][]uuid.UUID{}
	same := sameViews(t, up, services, viewer)
	wait.For(t, 3*time.Minute, "every service routing to most of its instances, the same at every replica", func() bool {
		for _, name := range services {
			code, body := call(t, "GET", urls[0]+"/v1/resolve/"+name, viewer, "")
			if code != 200 {
				return false
			}
			var v assembler.View
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatal(err)
			}
			routable[name] = routable[name][:0]
			for _, ep := range v.Endpoints {
				if ep.Weight > 0 {
					routable[name] = append(routable[name], ep.InstanceID)
				}
			}
			if len(routable[name]) < handoverInstances/handoverServices*9/10 {
				return false
			}
		}
		d, _ := same()
		return d == ""
	})
	stopProbing()
	probing.Wait()
	runCtx, cancel := context.WithCancel(ctx)
	var running sync.WaitGroup
	t.Cleanup(func() { cancel(); running.Wait() })
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: handoverSubscribers, DisableCompression: true}}
	checkers := make([]*streamcheck.Checker, handoverSubscribers)
	watchers := map[string][]*streamcheck.Checker{}
	for i := range checkers {
		watched := []string{services[(2*i)%len(services)], services[(2*i+1)%len(services)]}
		c, err := streamcheck.New(streamcheck.Config{URL: urls[i%3], Replicas: urls[:3], Services: watched, Token: viewer, HTTPClient: client,
			BaseBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, HeartbeatTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		checkers[i] = c
		for _, s := range watched {
			watchers[s] = append(watchers[s], c)
		}
		running.Go(func() { c.Run(runCtx) })
	}
	wait.For(t, 2*time.Minute, "every subscriber synced", func() bool {
		for _, c := range checkers {
			if !c.Synced() {
				return false
			}
		}
		return true
	})

	// The withdrawals: one a second, round-robin over the services and
	// over the replicas up, each retried on another replica if the one
	// asked is going away.
	var (
		wMu         sync.Mutex
		withdrawals []*withdrawal
		phase       = "steady"
	)
	setPhase := func(p string) {
		wMu.Lock()
		phase = p
		wMu.Unlock()
		t.Logf("%s: %s", time.Now().Format("15:04:05.000"), p)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	deregister := func(id uuid.UUID) (sent, done time.Time, ok bool) {
		for attempt := 0; attempt < 20 && runCtx.Err() == nil; attempt++ {
			bases := up()
			base := bases[attempt%len(bases)]
			req, err := http.NewRequestWithContext(runCtx, "DELETE", base+"/v1/instances/"+id.String(), strings.NewReader(`{"justification":"handover test"}`))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("Authorization", "Bearer "+admin)
			req.Header.Set("Content-Type", "application/json")
			sent = time.Now()
			res, err := hc.Do(req)
			if err != nil {
				continue // that replica is going away: another
			}
			res.Body.Close()
			if res.StatusCode/100 == 2 {
				return sent, time.Now(), true
			}
			if res.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("DELETE %s at %s: %d", id, base, res.StatusCode)
				return
			}
		}
		return sent, time.Time{}, false
	}
	withdrawing := make(chan struct{})
	running.Go(func() {
		defer close(withdrawing)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
			wMu.Lock()
			stop := phase == "done"
			p := phase
			wMu.Unlock()
			if stop {
				return
			}
			name := services[n%len(services)]
			id := routable[name][n/len(services)]
			sent, done, ok := deregister(id)
			if !ok {
				if runCtx.Err() == nil {
					t.Errorf("deregistering %s of %s failed on every replica", id, name)
				}
				return
			}
			w := &withdrawal{service: name, id: id, sent: sent, done: done, phase: p, reached: map[*streamcheck.Checker]time.Duration{}}
			wMu.Lock()
			withdrawals = append(withdrawals, w)
			wMu.Unlock()
		}
	})
	// The tracker: when each subscriber stops routing to each withdrawn
	// instance, sampled every 5 ms.
	// Only the withdrawals some subscriber still routes to are looked at:
	// looking at every withdrawal of the run every 5 ms cost this test
	// a third of a core by its end.
	running.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		var pending []*withdrawal
		seen := 0
		for {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
			now := time.Now()
			wMu.Lock()
			pending = append(pending, withdrawals[seen:]...)
			seen = len(withdrawals)
			pending = slices.DeleteFunc(pending, func(w *withdrawal) bool {
				for _, c := range watchers[w.service] {
					if _, ok := w.reached[c]; !ok && !c.Routable(w.service, w.id) {
						w.reached[c] = now.Sub(w.done)
					}
				}
				return len(w.reached) == len(watchers[w.service])
			})
			wMu.Unlock()
		}
	})

	made := func(n int) func() bool {
		return func() bool { wMu.Lock(); defer wMu.Unlock(); return len(withdrawals) >= n }
	}
	wait.For(t, time.Minute, "two withdrawals in steady state, for comparison", made(2))
	for i := range 3 {
		setPhase(fmt.Sprintf("rolling restart: replica %d stopping", i))
		stopAt(i)
		setPhase(fmt.Sprintf("rolling restart: replica %d starting", i))
		startAt(i)
		wait.For(t, 3*time.Minute, fmt.Sprintf("replica %d back and the region balanced", i), balanced(3))
	}
	setPhase("scale out: a fourth replica starting")
	startAt(3)
	wait.For(t, 3*time.Minute, "four replicas balanced", balanced(4))
	setPhase("scale in: the fourth replica stopping")
	stopAt(3)
	wait.For(t, time.Minute, "three replicas balanced again", balanced(3))
	setPhase("steady")
	wMu.Lock()
	n := len(withdrawals)
	wMu.Unlock()
	wait.For(t, time.Minute, "two more withdrawals in steady state", made(n+2))
	setPhase("done")
	<-withdrawing

	wait.For(t, 30*time.Second, "every withdrawal at every subscriber", func() bool {
		wMu.Lock()
		defer wMu.Unlock()
		for _, w := range withdrawals {
			if len(w.reached) < len(watchers[w.service]) {
				return false
			}
		}
		return true
	})
	wMu.Lock()
	defer wMu.Unlock()
	var lags []time.Duration
	perPhase := map[string]time.Duration{}
	for _, w := range withdrawals {
		worst := time.Duration(0)
		for _, d := range w.reached {
			lags = append(lags, d)
			worst = max(worst, d)
		}
		perPhase[w.phase] = max(perPhase[w.phase], worst)
		if worst > handoverBudget {
			t.Errorf("%s of %s (deregistered during %q, answered in %s) reached its last subscriber %s after the answer",
				w.id, w.service, w.phase, w.done.Sub(w.sent).Round(time.Millisecond), worst.Round(time.Millisecond))
		}
	}
	slices.Sort(lags)
	if len(withdrawals) < 20 || len(lags) == 0 {
		t.Fatalf("only %d withdrawals (%d arrivals) made", len(withdrawals), len(lags))
	}
	pct := func(p float64) time.Duration {
		return lags[min(len(lags)-1, int(p*float64(len(lags))))].Round(time.Millisecond)
	}
	t.Logf("%d withdrawals, %d arrivals at subscribers: lag from muster's answer p50 %s, p90 %s, p99 %s, max %s",
		len(withdrawals), len(lags), pct(0.5), pct(0.9), pct(0.99), lags[len(lags)-1].Round(time.Millisecond))
	for _, p := range slices.Sorted(func(yield func(string) bool) {
		for k := range perPhase {
			if !yield(k) {
				return
			}
		}
	}) {
		t.Logf("  worst during %-45q %s", p, perPhase[p].Round(time.Millisecond))
	}
	var total streamcheck.Counts
	for _, c := range checkers {
		total = total.Add(c.Counts())
	}
	t.Logf("subscribers: %s", total)
	if total.Problems() != 0 {
		for _, c := range checkers {
			for _, e := range c.Events() {
				t.Errorf("subscriber problem: %s", e)
			}
		}
		t.Fatalf("subscribers saw %d problems", total.Problems())
	}
}
