package app_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/routingcontrol"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/internal/wait"
)

// fencedDrops reads muster_fenced_writes_dropped_total{writer} from reg.
func fencedDrops(t *testing.T, reg *prometheus.Registry, writer string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "muster_fenced_writes_dropped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "writer" && l.GetValue() == writer {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// count runs a counting query on st's database.
func count(t *testing.T, st *apptest.Stack, query string, args ...any) int {
	t.Helper()
	var n int
	if err := st.Pool.QueryRow(t.Context(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestAFrozenOwnerWakesAndWritesNothing: replica a owns every shard; it
// freezes (its ownership rounds stop, and its clock for local deadlines
// stands still, so on waking it still counts every tenure as its own);
// meanwhile its leases run out and replica b takes every shard. Woken, a
// acts on what it decided as the owner: its reaper expires a lapsed
// lease, its evaluator flushes observed windows and records a
// transition, its reconciler applies a source's new endpoint, and the
// routing control, turned off, drains the region and audits the change.
// None of it reaches the database (no lease ended, no window, no
// transition, no instance, no shift, no audit row), each writer counts
// its drop in muster_fenced_writes_dropped_total, and none of them fails
// as if the database were down. Before the freeze the same writers did
// write (the positive controls).
func TestAFrozenOwnerWakesAndWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dir := t.TempDir()
	controls := filepath.Join(dir, "routing.json")
	writeFile(t, controls, `{"regions":{"local":"off","peer":"on"}}`)
	fleet := filepath.Join(dir, "fleet.json")
	writeFile(t, fleet, `{"instances":[{"id":"i-1","service":"pay","address":"10.0.8.1","port":8080,"zone":"az1"}]}`)
	src, err := reconcile.NewSnapshotSource(reconcile.SnapshotConfig{Name: "fleet", File: fleet})
	if err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	a := apptest.New(t, apptest.Options{
		Replica: "a",
		// a's rounds are held and its local deadlines never pass: what a
		// process frozen by SIGSTOP believes when it wakes.
		Hold:           []string{app.WorkerOwnership, app.WorkerRoutingControl, app.WorkerRoutingControlReconcile},
		Ownership:      func(c *ownership.Config) { c.Now = func() time.Time { return frozen } },
		Reconcile:      reconcile.Config{Sources: []reconcile.Source{src}},
		RoutingControl: &routingcontrol.Config{Source: &routingcontrol.FileSource{Path: controls}},
		Shifts:         func(c *shift.Config) { c.Fallback = func() ([]string, string) { return []string{"peer"}, "" } },
	})
	admin := a.Token(t, apptest.Admin)
	if r := a.JSON(t, "PUT", "/v1/services/pay", admin, `{"owner":"payments","capabilities":["self"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create pay: %d %s", r.Status, r.Body)
	}
	var ids [2]string
	for i := range ids {
		r := a.JSON(t, "POST", "/v1/services/pay/instances", admin, fmt.Sprintf(`{"address":"10.0.7.%d","port":8080,"zone":"az1"}`, i+1))
		if r.Status != http.StatusCreated {
			t.Fatalf("register: %d %s", r.Status, r.Body)
		}
		ids[i] = apptest.Decode[registry.Instance](t, r).ID.String()
	}
	a.SyncNow(t)
	pay := a.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "pay", Addresses: []string{"10.0.7.1", "10.0.7.2"}})
	hardFailure := func(id string) {
		t.Helper()
		r := a.JSON(t, "POST", "/v1/reports", pay, fmt.Sprintf(`{"reports":[{"instance_id":%q,"class":"self","outcome":"hard_failure"}]}`, id))
		if r.Status != http.StatusOK {
			t.Fatalf("report: %d %s", r.Status, r.Body)
		}
		a.Evaluator.EvaluateNow()
	}
	transitions := func(id string) int {
		return count(t, a, `SELECT count(*) FROM transitions WHERE instance_id = $1`, id)
	}
	windows := func(id string) int {
		return count(t, a, `SELECT count(*) FROM observed_windows WHERE instance_id = $1`, id)
	}

	// Before the freeze, as the owner, a writes: its reaper starts
	// counting the leases' clock, the first instance's hard failure is a
	// transition and a window, the source's endpoint is applied.
	if n, err := a.Reaper.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("reaper before the freeze: %d, %v", n, err)
	}
	hardFailure(ids[0])
	wait.For(t, 10*time.Second, "a's transition of the first instance written", func() bool { return transitions(ids[0]) == 1 })
	if err := a.Evaluator.FlushNow(ctx); err != nil {
		t.Fatal(err)
	}
	if windows(ids[0]) == 0 {
		t.Fatal("the owner's flush wrote no window")
	}
	w, ok := a.Reconcile.Worker("snapshot/fleet")
	if !ok {
		t.Fatal("no worker for snapshot/fleet")
	}
	if err := w.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if ins, err := a.Registry.ReconciledInstances(ctx, "snapshot/fleet"); err != nil || len(ins) != 1 {
		t.Fatalf("the owner's reconciliation: %v, %v; want i-1", ins, err)
	}

	// The freeze: a neither heartbeats nor renews, its leases run out,
	// and b takes every shard.
	if _, err := a.Pool.Exec(ctx, `UPDATE shard_leases SET expires_at = clock_timestamp() - interval '1 second' WHERE owner = 'a'`); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pool.Exec(ctx, `UPDATE replicas SET last_seen = last_seen - interval '1 hour' WHERE id = 'a'`); err != nil {
		t.Fatal(err)
	}
	b := apptest.New(t, apptest.Options{Pool: a.Pool, Replica: "b"})
	audited := count(t, a, `SELECT count(*) FROM audit_events`) // b's start may audit its own
	if got := count(t, a, `SELECT count(*) FROM shard_leases WHERE owner = 'b' AND expires_at > clock_timestamp()`); got != 64 {
		t.Fatalf("b holds %d shards, want 64", got)
	}
	if _, ok := b.App.Ownership.Owns("pay"); !ok {
		t.Fatal("b does not own pay")
	}
	if _, ok := a.App.Ownership.Owns("pay"); !ok {
		t.Fatal("a woke not believing it owns pay: the test would show nothing")
	}

	// Woken, a acts as the owner it believes it is.
	a.Clock.Advance(45 * time.Second) // the lease (30 s) lapsed 15 s ago
	if n, err := a.Reaper.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("a deposed owner's sweep: expired %d, %v", n, err)
	}
	hardFailure(ids[1])
	if err := a.Evaluator.FlushNow(ctx); err != nil {
		t.Fatalf("a deposed owner's flush failed (it must drop, not retry): %v", err)
	}
	writeFile(t, fleet, `{"instances":[{"id":"i-1","service":"pay","address":"10.0.8.1","port":8080,"zone":"az1"},
		{"id":"i-2","service":"pay","address":"10.0.8.2","port":8080,"zone":"az1"}]}`)
	if err := w.RunOnce(ctx); err != nil {
		t.Fatalf("a deposed owner's reconciliation pass failed (it must drop, not retry): %v", err)
	}
	a.App.RoutingControls.RunOnce(ctx) // reads Off: the change drains the region
	a.App.RoutingControlReconciler.RunOnce(ctx)

	for _, writer := range []string{"lease-expiry", "observed-windows", "reconcile", "routing-control", "routing-control-audit"} {
		if fencedDrops(t, a.Metrics, writer) < 1 {
			t.Errorf("writer %s counted no fenced drop", writer)
		}
	}
	wait.For(t, 10*time.Second, "the transition to ineligible dropped by the fence", func() bool {
		return fencedDrops(t, a.Metrics, "transitions") >= 1
	})
	if n := count(t, a, `SELECT count(*) FROM instances WHERE service = 'pay' AND state = 'active' AND source = 'registered'`); n != 2 {
		t.Errorf("%d of 2 registered instances active: a deposed owner expired leases", n)
	}
	if n, m := transitions(ids[0]), transitions(ids[1]); n != 1 || m != 0 {
		t.Errorf("transitions %d and %d, want the 1 written before the freeze and none after", n, m)
	}
	if n := windows(ids[1]); n != 0 {
		t.Errorf("%d windows of the instance that failed after the freeze, want none", n)
	}
	if ins, err := a.Registry.ReconciledInstances(ctx, "snapshot/fleet"); err != nil || len(ins) != 1 {
		t.Errorf("after a deposed owner's pass: %d reconciled instances, %v; want i-1 alone", len(ins), err)
	}
	if n := count(t, a, `SELECT count(*) FROM shifts`); n != 0 {
		t.Errorf("a deposed owner wrote %d shifts", n)
	}
	if n := count(t, a, `SELECT count(*) FROM audit_events`); n != audited {
		rows, _ := a.Pool.Query(ctx, `SELECT action, actor, outcome FROM audit_events ORDER BY seq DESC LIMIT $1`, n-audited)
		for rows.Next() {
			var action, actor, outcome string
			_ = rows.Scan(&action, &actor, &outcome)
			t.Logf("audit row: %s by %s, %s", action, actor, outcome)
		}
		rows.Close()
		t.Errorf("a deposed owner wrote %d audit rows", n-audited)
	}
}
