package app_test

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/routingcontrol"
	"github.com/musterhq/muster/internal/shift"
)

// routingControlStack is a replica reading the routing controls from
// path, with a peer region to fall back to and a dwell of a minute; its
// controls and their reconciler are stepped by the test.
func routingControlStack(t *testing.T, replica, path string, opts apptest.Options) *apptest.Stack {
	t.Helper()
	opts.Replica = replica
	opts.Hold = append(opts.Hold, app.WorkerRoutingControl, app.WorkerRoutingControlReconcile)
	opts.RoutingControl = &routingcontrol.Config{Source: &routingcontrol.FileSource{Path: path}}
	opts.Shifts = func(c *shift.Config) {
		c.Dwell = time.Minute
		c.Fallback = func() ([]string, string) { return []string{"peer"}, "" }
	}
	return apptest.New(t, opts)
}

// regionDrain is the routing control's drain of region local, as the
// database has it.
func regionDrain(t *testing.T, st *apptest.Stack) shift.Shift {
	t.Helper()
	all, err := st.Shifts.List(t.Context(), identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}, shift.Filter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].Scope != shift.ScopeRegion || all[0].Target != "local" {
		t.Fatalf("shifts %+v, want the one drain of region local", all)
	}
	return all[0]
}

// stalled lists the routing_control_return_stalled alarms GET /v1/alarms
// shows on st.
func stalled(t *testing.T, st *apptest.Stack) []assembler.Alarm {
	t.Helper()
	r := st.Do(t, "GET", "/v1/alarms", st.Token(t, apptest.Operator), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("alarms: %d %s", r.Status, r.Body)
	}
	var out []assembler.Alarm
	for _, a := range apptest.Decode[struct{ Alarms []assembler.Alarm }](t, r).Alarms {
		if a.Kind == app.AlarmRoutingControlReturnStalled {
			out = append(out, a)
		}
	}
	return out
}

// TestARoutingControlReturnResumesWhereverTheKeyGoes: the routing control
// turns region local off (replica a drains it) and on again (a takes the
// first step back). Then the key moves: replica b takes every shard, and
// its reconciler, which never saw a change (its first reading says On),
// takes the next step once its dwell has elapsed by the shift's last
// move in the database, and not before. Meanwhile a, which no longer owns
// the key, raises routing_control_return_stalled once a due step has
// waited longer than 30 s, and clears it when the step is taken. Then b
// restarts (a new process under the same id) and its successor takes the
// third step, which leaves the return waiting for an operator's
// confirmation. Every step is audited as system:routing-control, and no
// step was refused for want of dwell.
func TestARoutingControlReturnResumesWhereverTheKeyGoes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "routing.json")
	writeFile(t, path, `{"regions":{"local":"off","peer":"on"}}`)
	a := routingControlStack(t, "a", path, apptest.Options{})
	a.App.RoutingControls.RunOnce(ctx)
	if sh := regionDrain(t, a); sh.State != shift.Draining || sh.TrafficWeight != 0 || sh.StartedBy != "tool:system:routing-control" {
		t.Fatalf("after Off: %+v, want drained by the routing control", sh)
	}
	writeFile(t, path, `{"regions":{"local":"on","peer":"on"}}`)
	a.Clock.Advance(time.Minute)
	a.App.RoutingControls.RunOnce(ctx)
	if sh := regionDrain(t, a); sh.State != shift.Returning || sh.TrafficWeight != 0.10 {
		t.Fatalf("after On: %+v, want the first step back taken", sh)
	}

	// The key moves to b.
	b := routingControlStack(t, "b", path, apptest.Options{Pool: a.Pool})
	b.Clock.Set(a.Clock.Now())
	b.App.RoutingControls.RunOnce(ctx)
	b.App.RoutingControlReconciler.RunOnce(ctx)
	if sh := regionDrain(t, b); sh.TrafficWeight != 0.10 {
		t.Fatalf("b stepped before the dwell: %+v", sh)
	}
	b.Clock.Advance(time.Minute - time.Second)
	b.App.RoutingControlReconciler.RunOnce(ctx)
	if sh := regionDrain(t, b); sh.TrafficWeight != 0.10 {
		t.Fatalf("b stepped a second before the dwell elapsed: %+v", sh)
	}

	// a follows the return without owning the key: the step is due now;
	// 30 s later, not taken, it is alarmed.
	a.Clock.Set(b.Clock.Now().Add(time.Second))
	a.App.RoutingControlReconciler.RunOnce(ctx)
	if al := stalled(t, a); len(al) != 0 {
		t.Fatalf("alarmed as soon as the step was due: %+v", al)
	}
	a.Clock.Advance(31 * time.Second)
	if al := stalled(t, a); len(al) != 1 || !strings.Contains(al[0].Detail, "region local is on") {
		t.Fatalf("alarms after the step waited 31 s: %+v, want one routing_control_return_stalled of local", al)
	}

	b.Clock.Set(a.Clock.Now())
	b.App.RoutingControlReconciler.RunOnce(ctx)
	if sh := regionDrain(t, b); sh.State != shift.Returning || sh.TrafficWeight != 0.25 || sh.LastStepBy != "tool:system:routing-control" {
		t.Fatalf("b's step: %+v, want traffic weight 0.25 by the routing control", sh)
	}
	a.App.RoutingControlReconciler.RunOnce(ctx)
	if al := stalled(t, a); len(al) != 0 {
		t.Fatalf("alarm still raised after the step: %+v", al)
	}

	// b restarts: a new process under the same id takes the key back and
	// takes the next step once due.
	b2 := routingControlStack(t, "b", path, apptest.Options{Pool: a.Pool})
	b2.Clock.Set(b.Clock.Now().Add(time.Minute))
	b2.App.RoutingControls.RunOnce(ctx)
	b2.App.RoutingControlReconciler.RunOnce(ctx)
	if sh := regionDrain(t, b2); sh.State != shift.PendingConfirmation || sh.TrafficWeight != 0.50 {
		t.Fatalf("after b's restart: %+v, want traffic weight 0.50 pending confirmation", sh)
	}

	evs, err := audit.NewLog(b2.Pool).List(ctx, audit.Filter{Action: "shift.step", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	accepted := 0
	for _, e := range evs {
		if e.Outcome != audit.Accepted || e.Actor != "tool:system:routing-control" {
			t.Errorf("step audited %s by %s: %s", e.Outcome, e.Actor, e.Reason)
			continue
		}
		accepted++
	}
	if accepted != 3 {
		t.Errorf("%d steps audited, want 3", accepted)
	}
}
