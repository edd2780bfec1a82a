package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/wait"
)

// TestReplayedRowsChangeNothingAcrossARestart (issue 25): a lifted
// override and a deregistered instance, written back by hand to what they
// were while in force (state 'active', the end cleared, the old seals
// kept), change nothing on the running muster, and nothing after it is
// restarted either: muster's own record of each end outranks the row.
func TestReplayedRowsChangeNothingAcrossARestart(t *testing.T) {
	realTime(t, "a muster process restarted over rows written back by hand")
	t.Parallel() // its own data folder, port and processes
	dir := devDir(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	addr := freeAddr(t)
	url := "http://" + addr
	first := startProcess(t, dir, addr, "MUSTER_LEASE_TTL=10m")
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	if code, body := call(t, "PUT", url+"/v1/services/web", admin, `{"owner":"payments","capabilities":[]}`); code != 201 {
		t.Fatalf("create web: %d %s", code, body)
	}
	var ids []string
	for i := range 4 {
		code, body := call(t, "POST", url+"/v1/services/web/instances", admin, fmt.Sprintf(`{"address":"10.3.0.%d","port":8080,"zone":"az1"}`, i+1))
		if code != 201 {
			t.Fatalf("register: %d %s", code, body)
		}
		var in struct{ ID string }
		_ = json.Unmarshal(body, &in)
		ids = append(ids, in.ID)
	}
	// The override's budget counts the instances the evaluator holds: one
	// asked for before it has picked up all four registrations is refused
	// as the last instance of web (it was, once, on a loaded machine).
	wait.For(t, 30*time.Second, "the evaluator listing the 4 instances", func() bool {
		_, b := call(t, "GET", url+"/v1/services/web/eligibility", admin, "")
		return strings.Count(string(b), `"instance_id"`) == len(ids)
	})
	var code int
	var body []byte
	wait.For(t, 30*time.Second, "the override admitted or refused", func() bool {
		code, body = call(t, "POST", url+"/v1/overrides", admin,
			fmt.Sprintf(`{"instance_id":%q,"action":"mark_ineligible","justification":"disk errors","expires_in":86400}`, ids[0]))
		return code != 503
	})
	if code != 201 {
		t.Fatalf("override: %d %s", code, body)
	}
	var o struct{ ID string }
	_ = json.Unmarshal(body, &o)
	if code, body := call(t, "DELETE", url+"/v1/overrides/"+o.ID, admin, ""); code != 200 {
		t.Fatalf("lift: %d %s", code, body)
	}
	if code, body := call(t, "DELETE", url+"/v1/instances/"+ids[1], admin, `{"justification":"host retired, CHG-3"}`); code/100 != 2 {
		t.Fatalf("deregister: %d %s", code, body)
	}
	var want string
	wait.For(t, 30*time.Second, "the view without the lifted override and the deregistered instance", func() bool {
		s, ok := viewShape(t, url, admin)
		want = s
		// The lift applied shows as 10.3.0.1 back in the view (an
		// instance marked ineligible is not listed at all, so the
		// absence of "mark_ineligible" alone says nothing).
		// The other two are in it too: a view taken before the last
		// registration reached it would make the restarted muster's
		// (which has all of them) look different for no fault of its own.
		return ok && strings.Contains(s, "10.3.0.1 ") && !strings.Contains(s, "mark_ineligible") && !strings.Contains(s, "10.3.0.2 ") &&
			strings.Contains(s, "10.3.0.3 ") && strings.Contains(s, "10.3.0.4 ")
	})
	t.Logf("the view: %s", want)

	// Written back by hand, as they were while in force.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cluster, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir}) // adopts the running cluster
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Stop()
	pool, err := pgxpool.New(ctx, cluster.URL("muster"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, q := range []struct {
		sql string
		id  string
	}{
		{`UPDATE overrides SET state = 'active', lifted_at = NULL, lifted_by = NULL, ended_at = NULL WHERE id = $1`, o.ID},
		{`UPDATE instances SET state = 'active', ended_at = NULL, end_seal = NULL, end_seal_key = NULL,
		  lease_expires_at = now() + interval '1 day', updated_at = now() WHERE id = $1`, ids[1]},
	} {
		if tag, err := pool.Exec(ctx, q.sql, q.id); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("write back %s: %v %v", q.id, tag, err)
		}
	}
	replayAlarms := func(base, tok string) bool {
		code, body := call(t, "GET", base+"/v1/alarms", tok, "")
		return code == 200 && strings.Contains(string(body), "override_replayed") && strings.Contains(string(body), "instance_replayed")
	}
	// The running muster reads them (its refreshes are a second apart),
	// alarms, and applies neither.
	wait.For(t, 30*time.Second, "the running muster alarming both replays", func() bool { return replayAlarms(url, admin) })
	if got, _ := viewShape(t, url, admin); got != want {
		t.Fatalf("the running muster's view after the replays:\n got %s\nwant %s", got, want)
	}

	// Restarted, it rebuilds from the tables, and applies neither.
	_ = first.Process.Signal(os.Interrupt)
	_ = first.Wait()
	addr = freeAddr(t)
	url = "http://" + addr
	second := startProcess(t, dir, addr, "MUSTER_LEASE_TTL=10m")
	t.Cleanup(func() {
		_ = second.Process.Signal(os.Interrupt)
		_ = second.Wait()
	})
	admin = token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	// Its first view, and every one after, is the same.
	var got string
	wait.For(t, 60*time.Second, "the restarted muster serving a view of web", func() bool {
		var ok bool
		got, ok = viewShape(t, url, admin)
		return ok
	})
	if got != want {
		t.Fatalf("the restarted muster's first view:\n got %s\nwant %s", got, want)
	}
	wait.For(t, 30*time.Second, "the restarted muster alarming both replays", func() bool { return replayAlarms(url, admin) })
	if got, _ := viewShape(t, url, admin); got != want {
		t.Fatalf("the restarted muster's view:\n got %s\nwant %s", got, want)
	}
}
