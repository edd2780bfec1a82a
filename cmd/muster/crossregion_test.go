package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// TestCrossRegionResolution (issue 29): two muster dev processes on
// loopback, each with its own PostgreSQL, are regions a and b; a follows
// b. A caller in a (workload checkout) that b granted billing, a service
// only b has, resolves it through a's muster: the view names region b on
// the view and on every endpoint, and carries the aggregate's age. A
// caller b did not grant is refused. The resolver library in a, with
// Regions [b], picks billing's endpoints in b, and web's in a while a has
// capacity. The routing control turning region a off drains a (a region
// shift) and moves a's clients to b for web; turning it on again brings
// them back in ADR-13's capped steps (off again during the return drains
// it back to 0), the last one confirmed by an operator. When a's only web instance leaves,
// the client picks b's, without a request to muster. With b stopped, a's own resolution is untouched, and
// billing stays served from the copy (stale, with its age and the
// peer_stale alarm), and the client still routes on it.
func TestCrossRegionResolution(t *testing.T) {
	realTime(t, "two regions, one stopped")
	t.Parallel() // its own two regions, data folders and ports
	dirs := regionDirs(t, 2)
	dirA, dirB := dirs[0], dirs[1]
	p := newProcs(t)
	start, stop := p.start, p.stop
	addrA, addrB := freeAddr(t), freeAddr(t)
	urlA, urlB := "http://"+addrA, "http://"+addrB
	must := func(code int, body []byte, want int, what string) {
		t.Helper()
		if code != want {
			t.Fatalf("%s: %d %s", what, code, body)
		}
	}

	// Region b: billing (two instances) and web (two), both granted to
	// checkout.
	b := start(dirB, addrB, "MUSTER_REGION=b", "MUSTER_LEASE_TTL=10m", "MUSTER_XDS_ADDR=", "MUSTER_DNS_ADDR=")
	adminB := token(t, dirB, "--kind", "operator", "--subject", "alice", "--role", "admin")
	// b's grants name services b knows: the caller is declared there
	// (no instances), as service names are shared across regions.
	code, body := call(t, "PUT", urlB+"/v1/services/checkout", adminB, `{"owner":"storefront","capabilities":[]}`)
	must(code, body, 201, "declare checkout in b")
	for _, svc := range []string{"billing", "web", "ledger"} {
		code, body := call(t, "PUT", urlB+"/v1/services/"+svc, adminB, `{"owner":"payments","capabilities":[]}`)
		must(code, body, 201, "create "+svc+" in b")
		code, body = call(t, "PUT", urlB+"/v1/services/"+svc+"/grants", adminB, `{"callers":["checkout"]}`)
		must(code, body, 200, "grant "+svc+" to checkout in b")
		for i := 1; i <= 2; i++ {
			code, body := call(t, "POST", urlB+"/v1/services/"+svc+"/instances", adminB, fmt.Sprintf(`{"address":"10.2.%d.%d","port":8080,"zone":"az1"}`, len(svc), i))
			must(code, body, 201, "register in b")
		}
	}
	tokFile := filepath.Join(t.TempDir(), "b.token")
	if err := os.WriteFile(tokFile, []byte(token(t, dirB, "--kind", "tool", "--subject", "region-a", "--role", "viewer", "--ttl", "24h")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Region a follows b; web has one instance here.
	// The out-of-band routing control a reads: a file here.
	controls := filepath.Join(t.TempDir(), "routing.json")
	setControls := func(doc string) {
		t.Helper()
		tmp := controls + ".tmp"
		if err := os.WriteFile(tmp, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, controls); err != nil {
			t.Fatal(err)
		}
	}
	setControls(`{"regions": {"a": "on", "b": "on"}}`)
	start(dirA, addrA, "MUSTER_REGION=a", "MUSTER_LEASE_TTL=10m", "MUSTER_XDS_ADDR=", "MUSTER_DNS_ADDR=",
		"MUSTER_PEER_REGIONS=b="+urlB, "MUSTER_PEER_TOKENS=b="+tokFile,
		"MUSTER_PEER_STALE_AFTER=3s", "MUSTER_PEER_DISCOVER_EVERY=1s",
		"MUSTER_ROUTING_CONTROL=file:"+controls, "MUSTER_ROUTING_CONTROL_INTERVAL=200ms", "MUSTER_SHIFT_DWELL=1s")
	adminA := token(t, dirA, "--kind", "operator", "--subject", "alice", "--role", "admin")
	for _, svc := range []string{"web", "checkout", "intruder"} {
		code, body := call(t, "PUT", urlA+"/v1/services/"+svc, adminA, `{"owner":"storefront","capabilities":[]}`)
		must(code, body, 201, "create "+svc+" in a")
	}
	// web's instance in a registers itself (from 127.0.0.1), so it can
	// leave by itself later.
	webA := token(t, dirA, "--kind", "workload", "--service", "web")
	code, body = call(t, "POST", urlA+"/v1/services/web/instances", webA, `{"address":"127.0.0.1","port":8080,"zone":"az1"}`)
	must(code, body, 201, "register web in a")
	var local struct{ ID, Credential string }
	_ = json.Unmarshal(body, &local)
	code, body = call(t, "PUT", urlA+"/v1/services/web/grants", adminA, `{"callers":["checkout"]}`)
	must(code, body, 200, "grant web to checkout in a")
	checkout := token(t, dirA, "--kind", "workload", "--service", "checkout")
	intruder := token(t, dirA, "--kind", "workload", "--service", "intruder")

	// billing exists only in b: a answers from its copy, naming b.
	var remote resolver.View
	wait.For(t, 90*time.Second, "a resolving b's billing for checkout", func() bool {
		code, body := call(t, "GET", urlA+"/v1/resolve/billing", checkout, "")
		remote = resolver.View{}
		return code == 200 && json.Unmarshal(body, &remote) == nil && len(remote.Endpoints) == 2
	})
	if remote.Region != "b" || remote.Service != "billing@b" {
		t.Fatalf("a's answer for billing names region %q, series %q: %+v", remote.Region, remote.Service, remote)
	}
	for _, e := range remote.Endpoints {
		if e.Region != "b" || !strings.HasPrefix(e.Address, "10.2.") {
			t.Fatalf("an endpoint of b's billing served by a: %+v", e)
		}
	}
	if remote.AgeSeconds < 0 || remote.AgeSeconds > 3 {
		t.Fatalf("the age of b's billing while b answers: %v s", remote.AgeSeconds)
	}
	if got := resolver.Checksum(remote.Endpoints); got != remote.Checksum {
		t.Fatalf("b's checksum does not verify at a: %s, view says %s", got, remote.Checksum)
	}
	// b granted billing to checkout, not to intruder.
	code, body = call(t, "GET", urlA+"/v1/resolve/billing", intruder, "")
	must(code, body, 403, "intruder resolving b's billing through a")
	code, body = call(t, "GET", urlA+"/v1/watch?service=billing&regions=b", intruder, "")
	must(code, body, 403, "intruder watching b's billing through a")
	// A service no region has: 404 for an operator; a workload cannot
	// tell it from one it may not resolve (no enumeration of the estate).
	code, body = call(t, "GET", urlA+"/v1/resolve/nothing-anywhere", adminA, "")
	must(code, body, 404, "a service no region has, for an operator")
	code, body = call(t, "GET", urlA+"/v1/resolve/nothing-anywhere", checkout, "")
	must(code, body, 403, "a service no region has, for a workload")

	// The client library in a, falling back to b.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cl, err := resolver.New(ctx, resolver.Config{
		URLs: []string{urlA}, Services: []string{"billing", "web"}, Regions: []string{"b"},
		Token:          func(context.Context) (string, error) { return checkout, nil },
		ReportInterval: -1, MaxBackoff: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pick := func(svc string) resolver.Endpoint {
		t.Helper()
		e, err := cl.Pick(svc)
		if err != nil {
			return resolver.Endpoint{}
		}
		return e
	}
	wait.For(t, time.Minute, "the client synced, picking billing in b and web in a", func() bool {
		return cl.Stats().Synced && pick("billing").Region == "b" && pick("web").Address == "127.0.0.1"
	})
	for range 50 {
		if e := pick("web"); e.Address != "127.0.0.1" || e.Region != "" {
			t.Fatalf("web picked %+v while a has capacity", e)
		}
	}

	// The routing control turns region a off: a drains itself (a region
	// shift by system:routing-control) and a's clients move to b for web,
	// a service both regions have.
	picks := func(svc string) map[string]int {
		n := map[string]int{}
		for range 400 {
			n[pick(svc).Region]++
		}
		return n
	}
	setControls(`{"regions": {"a": "off", "b": "on"}}`)
	wait.For(t, 30*time.Second, "a's clients picking web in b with a turned off", func() bool { return picks("web")["b"] == 400 })
	type shiftRow struct {
		ID, Scope, Target, State string
		StartedBy                string  `json:"started_by"`
		LastStepBy               string  `json:"last_step_by"`
		Manual                   bool    `json:"manual"`
		Step                     int     `json:"step"`
		TrafficWeight            float64 `json:"traffic_weight"`
	}
	var drain shiftRow
	wait.For(t, 10*time.Second, "the region drain listed", func() bool {
		code, body := call(t, "GET", urlA+"/v1/shifts", adminA, "")
		var l struct{ Items []shiftRow }
		if code != 200 || json.Unmarshal(body, &l) != nil {
			return false
		}
		for _, sh := range l.Items {
			if sh.Scope == "region" && sh.Target == "a" {
				drain = sh
				return true
			}
		}
		return false
	})
	if drain.StartedBy != "tool:system:routing-control" || !drain.Manual || drain.TrafficWeight != 0 {
		t.Fatalf("the region drain: %+v", drain)
	}
	// On again: traffic returns in ADR-13's capped steps (the dwell is
	// 1 s here), the local share of picks following each step, up to the
	// last: a failover declared by the routing control is a manual one,
	// and its return to full traffic waits for an operator's confirmation.
	setControls(`{"regions": {"a": "on", "b": "on"}}`)
	shiftNow := func() shiftRow {
		t.Helper()
		code, body := call(t, "GET", urlA+"/v1/shifts/"+drain.ID, adminA, "")
		var sh shiftRow
		if code != 200 || json.Unmarshal(body, &sh) != nil {
			t.Fatalf("GET the region drain: %d %s", code, body)
		}
		return sh
	}
	wait.For(t, 30*time.Second, "the first step back", func() bool { return shiftNow().TrafficWeight == 0.10 })
	// Off again during the return: drained back to 0 at once, and a's
	// clients all on b again; then on, and the return starts over.
	setControls(`{"regions": {"a": "off", "b": "on"}}`)
	wait.For(t, 30*time.Second, "the return drained back to 0", func() bool {
		sh := shiftNow()
		return sh.State == "draining" && sh.TrafficWeight == 0
	})
	wait.For(t, 30*time.Second, "a's clients all on b again", func() bool { return picks("web")["b"] == 400 })
	// The steps of the return are read from the audit log afterwards, not
	// watched as they happen: each step is one audited write, and on a
	// loaded machine a poll can miss a step that lasts one 1 s dwell.
	type auditRow struct {
		Seq   int64
		After struct {
			ShiftID string  `json:"shift_id"`
			Weight  float64 `json:"traffic_weight"`
		}
	}
	stepsSince := func(mark int64) []float64 {
		t.Helper()
		code, body := call(t, "GET", urlA+"/v1/audit?action=shift.step&outcome=accepted&limit=200", adminA, "")
		var l struct{ Items []auditRow }
		if code != 200 || json.Unmarshal(body, &l) != nil {
			t.Fatalf("GET the shift steps in the audit log: %d %s", code, body)
		}
		var w []float64
		for _, e := range slices.Backward(l.Items) { // newest first
			if e.Seq > mark && e.After.ShiftID == drain.ID {
				w = append(w, e.After.Weight)
			}
		}
		return w
	}
	var mark int64
	{
		code, body := call(t, "GET", urlA+"/v1/audit?limit=1", adminA, "")
		var l struct{ Items []auditRow }
		if code != 200 || json.Unmarshal(body, &l) != nil || len(l.Items) != 1 {
			t.Fatalf("GET the newest audit row: %d %s", code, body)
		}
		mark = l.Items[0].Seq
	}
	setControls(`{"regions": {"a": "on", "b": "on"}}`)
	wait.For(t, time.Minute, "the region drain walked back to its confirmation", func() bool {
		code, body := call(t, "GET", urlA+"/v1/shifts/"+drain.ID, adminA, "")
		var sh shiftRow
		if code != 200 || json.Unmarshal(body, &sh) != nil {
			return false
		}
		drain = sh
		return sh.State == "pending_confirmation"
	})
	if got, want := stepsSince(mark), []float64{0.10, 0.25, 0.50}; !slices.Equal(got, want) {
		t.Errorf("the return's steps in the audit log: %v, want %v", got, want)
	}
	// Held at 0.50 until the operator confirms: web's picks split
	// between a and b.
	wait.For(t, 30*time.Second, "web's picks split between a and b at traffic weight 0.50", func() bool {
		n := picks("web")
		return n[""] > 0 && n["b"] > 0
	})
	if drain.LastStepBy != "tool:system:routing-control" || drain.TrafficWeight != 0.5 {
		t.Fatalf("the return before its confirmation: %+v", drain)
	}
	wait.For(t, 30*time.Second, "the operator's confirmation taken", func() bool {
		code, _ := call(t, "POST", urlA+"/v1/shifts/"+drain.ID+"/confirm", adminA, `{}`)
		return code == 200
	})
	wait.For(t, 30*time.Second, "a's clients back on a's web", func() bool { return picks("web")[""] == 400 })

	// a's only web instance leaves: the client moves to b's web
	// (it leaves by itself, with its instance credential: an operator may
	// never remove the last eligible instance of a service)
	code, body = callAs(t, "DELETE", urlA+"/v1/instances/"+local.ID, webA, local.Credential, "")
	if code/100 != 2 {
		t.Fatalf("deregister a's web instance: %d %s", code, body)
	}
	wait.For(t, time.Minute, "web picked in b once a has none", func() bool {
		e := pick("web")
		return e.Region == "b" && strings.HasPrefix(e.Address, "10.2.3.")
	})

	// b withdraws its grant of ledger: a's open stream of ledger@b for
	// checkout ends with grant_revoked (the peer decides).
	ctxW, cancelW := context.WithTimeout(context.Background(), time.Minute)
	defer cancelW()
	req, _ := http.NewRequestWithContext(ctxW, "GET", urlA+"/v1/watch?service=ledger&regions=b", nil)
	req.Header.Set("Authorization", "Bearer "+checkout)
	var res *http.Response
	wait.For(t, 30*time.Second, "a watch of ledger@b opened for checkout", func() bool {
		r, err := http.DefaultClient.Do(req.Clone(ctxW))
		if err != nil {
			return false
		}
		if r.StatusCode != 200 {
			r.Body.Close()
			return false
		}
		res = r
		return true
	})
	defer res.Body.Close()
	events := make(chan string, 64)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			events <- sc.Text()
		}
	}()
	next := func(prefix string) string {
		t.Helper()
		for {
			select {
			case line, ok := <-events:
				if !ok {
					t.Fatalf("the stream ended before %q", prefix)
				}
				if strings.HasPrefix(line, prefix) {
					return line
				}
			case <-ctxW.Done():
				t.Fatalf("no %q within a minute", prefix)
			}
		}
	}
	next("event: view")
	code, body = call(t, "PUT", urlB+"/v1/services/ledger/grants", adminB, `{"callers":[]}`)
	must(code, body, 200, "b withdraws ledger's grant")
	next("event: drain")
	if line := next("data: "); !strings.Contains(line, "grant_revoked") || !strings.Contains(line, "ledger@b") {
		t.Fatalf("the drain after b withdrew the grant: %s", line)
	}

	// muster loadgen regions: withdrawals in b timed at a's subscribers.
	out, errOut, err := runCmd(t, "loadgen", "regions", "--a", urlA, "--a-data", dirA, "--b", urlB, "--b-data", dirB,
		"--subscribers", "20", "--instances", "10", "--withdrawals", "5", "--timeout", "1m")
	if err != nil {
		t.Fatalf("muster loadgen regions: %v\n%s%s", err, out, errOut)
	}
	t.Logf("muster loadgen regions:\n%s", out)
	if !strings.Contains(out, "5 withdrawals in b x 20 subscribers on a: propagation p50 ") {
		t.Fatalf("muster loadgen regions printed no figures:\n%s", out)
	}

	// b goes away: billing stays served at a from its copy, stale, with
	// its age and the alarm; the client keeps routing on it.
	stop(b)
	wait.For(t, 30*time.Second, "billing served stale at a, with peer_stale", func() bool {
		code, body := call(t, "GET", urlA+"/v1/resolve/billing", checkout, "")
		var v resolver.View
		_, alarms := call(t, "GET", urlA+"/v1/alarms", adminA, "")
		return code == 200 && json.Unmarshal(body, &v) == nil && v.AgeSeconds > 3 && len(v.Endpoints) == 2 &&
			strings.Contains(string(alarms), "peer_stale")
	})
	if e := pick("billing"); e.Region != "b" {
		t.Fatalf("billing picked with b away: %+v", e)
	}
}
