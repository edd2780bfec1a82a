package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/shift"
)

var shiftAdmin = identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}

// shiftStack is a stack with web and api registered across zones; nothing
// is probed, so every instance is unknown and in rotation (ADR-05).
type shiftStack struct {
	*stack
	t *testing.T
}

// newShiftStack registers, per zone, the given number of web and api
// instances, and publishes the first views.
func newShiftStack(t *testing.T, opts apptest.Options, layout map[string][2]int) *shiftStack {
	t.Helper()
	s := &shiftStack{stack: apptest.New(t, opts), t: t}
	s.Seed(t)
	ctx := context.Background()
	n := 0
	var ids []string
	for zone, counts := range layout {
		for i, svc := range []string{"web", "api"} {
			for range counts[i] {
				n++
				in, err := s.Registry.Register(ctx, shiftAdmin, netip.Addr{}, svc, registry.Registration{
					Address: fmt.Sprintf("10.1.%d.%d", n/200, n%200+1), Port: 8080, Zone: zone,
				})
				if err != nil {
					t.Fatal(err)
				}
				if svc == "web" {
					ids = append(ids, in.ID.String())
				}
			}
		}
	}
	s.WaitReady(t)
	// web's instances enter rotation on their first probe.
	if _, err := s.Registry.PutProberAssignments(ctx, shiftAdmin, "prober-1", registry.ProberAssignments{Services: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	var items []string
	for _, id := range ids {
		items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":"success"}`, id))
	}
	prober := s.Token(t, devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-1"})
	if r := s.JSON(t, "POST", "/v1/reports", prober, `{"reports":[`+strings.Join(items, ",")+`]}`); r.Status != http.StatusOK || strings.Contains(string(r.Body), `"code"`) {
		t.Fatalf("reports: %d %s", r.Status, r.Body)
	}
	s.publish()
	for _, svc := range []string{"web", "api"} {
		for z, st := range s.view(svc).Zones {
			if st.Guard != assembler.GuardOK {
				t.Fatalf("%s zone %s not healthy at start: %+v", svc, z, st)
			}
		}
	}
	return s
}

// publish evaluates and lets the publisher publish everything queued
// (the addition window is 1 s).
func (s *shiftStack) publish() {
	s.Evaluator.EvaluateNow()
	s.Publisher.RunOnce()
	s.Clock.Advance(1100 * time.Millisecond)
	s.Publisher.RunOnce()
}

func (s *shiftStack) view(service string) assembler.View {
	s.t.Helper()
	r := s.Do(s.t, "GET", "/v1/resolve/"+service, s.Token(s.t, apptest.Admin), "", "")
	if r.Status != http.StatusOK {
		s.t.Fatalf("resolve %s: %d %s", service, r.Status, r.Body)
	}
	return apptest.Decode[assembler.View](s.t, r)
}

// weights returns the traffic weight of each zone of a service's view.
func (s *shiftStack) weights(service string) map[string]float64 {
	s.t.Helper()
	out := map[string]float64{}
	for z, st := range s.view(service).Zones {
		out[z] = st.TrafficWeight
	}
	return out
}

func (s *shiftStack) wantWeights(service string, want map[string]float64) {
	s.t.Helper()
	got := s.weights(service)
	for z, w := range want {
		if got[z] != w {
			s.t.Fatalf("%s: traffic weights %v, want %v", service, got, want)
		}
	}
}

func (s *shiftStack) shift(method, path string, who devissuer.TokenRequest, body string, want int) (shift.Shift, apptest.Response) {
	s.t.Helper()
	var r apptest.Response
	if body != "" || method == "POST" {
		r = s.JSON(s.t, method, path, s.Token(s.t, who), body)
	} else {
		r = s.Do(s.t, method, path, s.Token(s.t, who), "", "")
	}
	if r.Status != want {
		s.t.Fatalf("%s %s as %s: %d %s, want %d", method, path, who.Subject, r.Status, r.Body, want)
	}
	if want >= 400 {
		return shift.Shift{}, r
	}
	return apptest.Decode[shift.Shift](s.t, r), r
}

// problemType asserts a refusal's problem type.
func problemType(t *testing.T, r apptest.Response, slug string) {
	t.Helper()
	if p := r.Problem(t); p.Type != "https://muster.dev/problems/"+slug {
		t.Fatalf("problem %s, want %s: %s", p.Type, slug, p.Detail)
	}
}

func (s *shiftStack) alarms() []assembler.Alarm {
	s.t.Helper()
	r := s.Do(s.t, "GET", "/v1/alarms", s.Token(s.t, apptest.Viewer), "", "")
	if r.Status != http.StatusOK {
		s.t.Fatalf("alarms: %d %s", r.Status, r.Body)
	}
	return apptest.Decode[struct{ Alarms []assembler.Alarm }](s.t, r).Alarms
}

func (s *shiftStack) pendingAlarms() []assembler.Alarm {
	var out []assembler.Alarm
	for _, a := range s.alarms() {
		if a.Kind == shift.AlarmShiftbackPending {
			out = append(out, a)
		}
	}
	return out
}

// shiftEvents returns the audit events of shift operations, oldest first.
func (s *shiftStack) shiftEvents() []audit.Event {
	s.t.Helper()
	evs, err := audit.List(context.Background(), db.New(s.Pool), audit.Filter{Limit: 1000})
	if err != nil {
		s.t.Fatal(err)
	}
	var out []audit.Event
	for i := len(evs) - 1; i >= 0; i-- {
		if strings.HasPrefix(evs[i].Action, "shift.") {
			out = append(out, evs[i])
		}
	}
	return out
}

func (s *shiftStack) verifyAudit() {
	s.t.Helper()
	if _, err := audit.Verify(context.Background(), db.New(s.Pool)); err != nil {
		s.t.Fatalf("audit verify: %v", err)
	}
}

// eventSummary renders events as "action outcome actor check" lines.
func eventSummary(evs []audit.Event) string {
	var b strings.Builder
	for _, e := range evs {
		var after struct{ Check string }
		_ = json.Unmarshal(e.After, &after)
		check := after.Check
		fmt.Fprintf(&b, "%s %s %s %s %s\n", e.Action, e.Outcome, e.Actor, e.Target, check)
	}
	return b.String()
}

var threeZones = map[string][2]int{"az1": {2, 1}, "az2": {2, 1}, "az3": {2, 1}}

const drainAZ1 = `{"scope":"zone","target":"az1","reason":"az1 packet loss, failing over","manual":true}`

func TestShiftManualDrainWalkBackAndConfirm(t *testing.T) {
	t.Parallel()
	s := newShiftStack(t, apptest.Options{}, threeZones)
	s.wantWeights("web", map[string]float64{"az1": 1, "az2": 1, "az3": 1})
	before := s.view("web")

	// Viewers and workloads may not shift traffic.
	_, r := s.shift("POST", "/v1/shifts", apptest.Viewer, drainAZ1, http.StatusForbidden)
	problemType(t, r, "forbidden")
	_, r = s.shift("POST", "/v1/shifts", apptest.Web, drainAZ1, http.StatusForbidden)
	problemType(t, r, "forbidden")

	// The drain takes effect in the next published view: az1 at traffic
	// weight 0, its endpoints still published, the guard untouched.
	sh, r := s.shift("POST", "/v1/shifts", apptest.Operator, drainAZ1, http.StatusCreated)
	if sh.State != shift.Draining || sh.TrafficWeight != 0 || !sh.Manual || r.Header.Get("Location") != "/v1/shifts/"+sh.ID.String() {
		t.Fatalf("drain: %+v", sh)
	}
	s.publish()
	drained := s.view("web")
	if drained.Version <= before.Version || len(drained.Endpoints) != 6 {
		t.Fatalf("drained view: version %d (before %d), %d endpoints", drained.Version, before.Version, len(drained.Endpoints))
	}
	for z, st := range drained.Zones {
		want := map[string]float64{"az1": 0, "az2": 1, "az3": 1}[z]
		if st.TrafficWeight != want || st.Guard != assembler.GuardOK {
			t.Fatalf("zone %s: %+v, want traffic weight %g and guard ok", z, st, want)
		}
	}
	s.wantWeights("api", map[string]float64{"az1": 0, "az2": 1})
	if a := s.alarms(); len(a) != 0 {
		t.Fatalf("a drain raised alarms: %+v", a)
	}

	// One active shift per target.
	_, r = s.shift("POST", "/v1/shifts", apptest.Admin, drainAZ1, http.StatusConflict)
	problemType(t, r, "conflict")

	// Stepping back inside the dwell is refused, saying when it may.
	step := "/v1/shifts/" + sh.ID.String() + "/step"
	_, r = s.shift("POST", step, apptest.Operator, "", http.StatusConflict)
	problemType(t, r, "dwell-not-elapsed")
	if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || ra < 110 || ra > 120 {
		t.Fatalf("Retry-After %q, want about 119 s", r.Header.Get("Retry-After"))
	}
	if p := r.Problem(t); !strings.Contains(p.Detail, "next step is allowed at") {
		t.Fatalf("detail %q does not say when", p.Detail)
	}

	// Capped steps, each after the dwell, each seen in the views.
	for i, w := range []float64{0.10, 0.25, 0.50} {
		s.Clock.Advance(2 * time.Minute)
		got, _ := s.shift("POST", step, apptest.Operator, "", http.StatusOK)
		if got.TrafficWeight != w || got.Step != i+1 {
			t.Fatalf("step %d: %+v, want weight %g", i+1, got, w)
		}
		s.publish()
		s.wantWeights("web", map[string]float64{"az1": w, "az2": 1, "az3": 1})
		if i == 0 {
			_, r = s.shift("POST", step, apptest.Operator, "", http.StatusConflict)
			problemType(t, r, "dwell-not-elapsed")
		}
	}

	// At 0.50 a manual shift waits for confirmation: the step is refused
	// even after the dwell, and the timer never completes it.
	got, _ := s.shift("GET", "/v1/shifts/"+sh.ID.String(), apptest.Viewer, "", http.StatusOK)
	if got.State != shift.PendingConfirmation || got.PendingSince == nil || got.NextWeight == nil || *got.NextWeight != 1 || got.NextStepAt == nil {
		t.Fatalf("after 0.50: %+v", got)
	}
	s.Clock.Advance(2 * time.Minute)
	_, r = s.shift("POST", step, apptest.Operator, "", http.StatusConflict)
	problemType(t, r, "confirmation-required")
	if err := s.Shifts.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a := s.pendingAlarms(); len(a) != 0 {
		t.Fatalf("shiftback_pending after 2 min: %+v", a)
	}

	// Pending longer than 10 min raises shiftback_pending.
	s.Clock.Advance(9 * time.Minute)
	if err := s.Shifts.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.publish()
	s.wantWeights("web", map[string]float64{"az1": 0.5})
	got, _ = s.shift("GET", "/v1/shifts/"+sh.ID.String(), apptest.Operator, "", http.StatusOK)
	if got.State != shift.PendingConfirmation || got.PendingSeconds == nil || *got.PendingSeconds < 660 {
		t.Fatalf("the timer moved a manual shift, or the age is wrong: %+v", got)
	}
	al := s.pendingAlarms()
	if len(al) != 1 || al[0].Zone != "az1" || !strings.Contains(al[0].Detail, sh.ID.String()) {
		t.Fatalf("alarms %+v", s.alarms())
	}
	if m := s.Scrape(t); !strings.Contains(string(m), "\nmuster_shiftbacks_pending 1\n") ||
		!strings.Contains(string(m), "\nmuster_shifts_active 1\n") {
		t.Errorf("metrics do not count the pending shift-back:\n%s", grepMetric(m, "muster_shift"))
	}
	list := apptest.Decode[struct{ Items []shift.Shift }](t, s.Do(t, "GET", "/v1/shifts?state=pending_confirmation", s.Token(t, apptest.Viewer), "", ""))
	if len(list.Items) != 1 || list.Items[0].ID != sh.ID {
		t.Fatalf("pending list %+v", list.Items)
	}

	// A viewer cannot confirm; an operator can, and the alarm clears.
	confirm := "/v1/shifts/" + sh.ID.String() + "/confirm"
	_, r = s.shift("POST", confirm, apptest.Viewer, "", http.StatusForbidden)
	problemType(t, r, "forbidden")
	done, _ := s.shift("POST", confirm, apptest.Operator, "", http.StatusOK)
	if done.State != shift.Completed || done.TrafficWeight != 1 || done.ConfirmedBy == nil || *done.ConfirmedBy != "operator:oscar" || done.NextStepAt != nil {
		t.Fatalf("confirmed: %+v", done)
	}
	if a := s.pendingAlarms(); len(a) != 0 {
		t.Fatalf("alarm still open after confirm: %+v", a)
	}
	s.publish()
	s.wantWeights("web", map[string]float64{"az1": 1, "az2": 1, "az3": 1})
	_, r = s.shift("POST", confirm, apptest.Operator, "", http.StatusConflict)
	problemType(t, r, "conflict")

	// Every attempt left an audit event with its deciding check.
	want := strings.Join([]string{
		"shift.start refused operator:vera az1 authorisation",
		"shift.start refused workload:web/web az1 authorisation",
		"shift.start accepted operator:oscar az1 budget",
		"shift.start refused operator:alice az1 conflict",
		"shift.step refused operator:oscar az1 dwell",
		"shift.step accepted operator:oscar az1 dwell",
		"shift.step refused operator:oscar az1 dwell",
		"shift.step accepted operator:oscar az1 dwell",
		"shift.step accepted operator:oscar az1 dwell",
		"shift.step refused operator:oscar az1 confirmation",
		"shift.confirm refused operator:vera az1 authorisation",
		"shift.confirm accepted operator:oscar az1 confirmation",
		"shift.confirm refused operator:oscar az1 state",
	}, "\n") + "\n"
	if got := eventSummary(s.shiftEvents()); got != want {
		t.Fatalf("audit events:\n%s\nwant:\n%s", got, want)
	}
	s.verifyAudit()
}

func TestShiftAutomaticCompletesOnItsTimer(t *testing.T) {
	t.Parallel()
	s := newShiftStack(t, apptest.Options{}, threeZones)
	sh, _ := s.shift("POST", "/v1/shifts", apptest.Operator,
		`{"scope":"zone","target":"az2","reason":"automatic failover: az2 health checks","manual":false}`, http.StatusCreated)
	ctx := context.Background()

	// The timer does not declare a recovery: a drained zone stays drained.
	s.Clock.Advance(10 * time.Minute)
	if err := s.Shifts.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	s.publish()
	s.wantWeights("web", map[string]float64{"az2": 0})

	// The first step back is asked for; the rest follow each dwell.
	got, _ := s.shift("POST", "/v1/shifts/"+sh.ID.String()+"/step", apptest.Operator, "", http.StatusOK)
	if got.TrafficWeight != 0.10 {
		t.Fatalf("first step: %+v", got)
	}
	s.publish()
	s.wantWeights("web", map[string]float64{"az2": 0.10})
	// Inside the dwell the timer does nothing.
	if err := s.Shifts.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	s.wantWeights("web", map[string]float64{"az2": 0.10})
	for _, w := range []float64{0.25, 0.50, 1} {
		s.Clock.Advance(2 * time.Minute)
		if err := s.Shifts.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		s.publish()
		s.wantWeights("web", map[string]float64{"az1": 1, "az2": w, "az3": 1})
	}
	got, _ = s.shift("GET", "/v1/shifts/"+sh.ID.String(), apptest.Viewer, "", http.StatusOK)
	if got.State != shift.Completed || got.ConfirmedBy != nil || got.LastStepBy != "system:shifts" || got.Step != 4 {
		t.Fatalf("automatic shift after its timer: %+v", got)
	}
	if a := s.pendingAlarms(); len(a) != 0 {
		t.Fatalf("an automatic shift raised %+v", a)
	}
	want := "shift.start accepted operator:oscar az2 budget\n" +
		"shift.step accepted operator:oscar az2 dwell\n" +
		"shift.step accepted system:shifts az2 dwell\n" +
		"shift.step accepted system:shifts az2 dwell\n" +
		"shift.step accepted system:shifts az2 dwell\n"
	if got := eventSummary(s.shiftEvents()); got != want {
		t.Fatalf("audit events:\n%s\nwant:\n%s", got, want)
	}
	s.verifyAudit()
}

func TestShiftDrainOverBudgetIsRefusedWithNumbers(t *testing.T) {
	t.Parallel()
	// api: 3 of its 4 instances in az3. Draining az3 would leave 1 in
	// rotation; the default fraction 0.5 needs ceil(0.5 × 4) = 2.
	// The peer regions that can take a region drain (issue 29): none at
	// first, then region b (the app reads them from the federation and
	// the routing control; a stand-in here).
	var peers atomic.Value
	peers.Store([]string(nil))
	fallback := func(c *shift.Config) {
		c.Fallback = func() ([]string, string) { return peers.Load().([]string), "this muster follows no peer region" }
	}
	s := newShiftStack(t, apptest.Options{Shifts: fallback}, map[string][2]int{"az1": {2, 1}, "az2": {2, 0}, "az3": {2, 3}})
	_, r := s.shift("POST", "/v1/shifts", apptest.Operator,
		`{"scope":"zone","target":"az3","reason":"az3 brownout, moving traffic","manual":true}`, http.StatusConflict)
	problemType(t, r, "budget-exceeded")
	p := r.Problem(t)
	if !strings.Contains(p.Detail, "api would keep 1 of 4 instances in rotation") || !strings.Contains(p.Detail, "needs 2") || strings.Contains(p.Detail, "web") {
		t.Fatalf("detail %q does not give api's numbers (and only api's)", p.Detail)
	}
	s.publish()
	s.wantWeights("api", map[string]float64{"az3": 1})

	// A zone whose drain the budget allows: web keeps 4 of 6, needs 3.
	s.shift("POST", "/v1/shifts", apptest.Operator, `{"scope":"zone","target":"az2","reason":"az2 maintenance window","manual":true}`, http.StatusCreated)
	// With az2 drained, draining az1 too would leave web 2 of 6.
	_, r = s.shift("POST", "/v1/shifts", apptest.Operator, drainAZ1, http.StatusConflict)
	if p := r.Problem(t); !strings.Contains(p.Detail, "web would keep 2 of 6") || !strings.Contains(p.Detail, "needs 3") {
		t.Fatalf("second drain: %q", p.Detail)
	}

	// Invalid requests are refused, audited, and change nothing.
	for _, body := range []string{
		`{"scope":"zone","target":"AZ 1","reason":"a good long reason","manual":true}`,
		`{"scope":"planet","target":"az1","reason":"a good long reason","manual":true}`,
		`{"scope":"zone","target":"az1","reason":"x","manual":true}`,
		`{"scope":"zone","target":"az1","reason":"a good long reason"}`,
		`{"scope":"region","target":"elsewhere","reason":"a good long reason","manual":true}`,
	} {
		_, r = s.shift("POST", "/v1/shifts", apptest.Admin, body, http.StatusUnprocessableEntity)
		if p := r.Problem(t); len(p.Errors) == 0 {
			t.Fatalf("%s: no field errors: %+v", body, p)
		}
	}

	// A region drain is admin only and skips the in-region budget.
	region := `{"scope":"region","target":"local","reason":"regional evacuation drill","manual":true}`
	_, r = s.shift("POST", "/v1/shifts", apptest.Operator, region, http.StatusForbidden)
	problemType(t, r, "forbidden")
	// With no region to take the traffic it would move nothing: refused,
	// with the reason.
	_, r = s.shift("POST", "/v1/shifts", apptest.Admin, region, http.StatusConflict)
	if p := r.Problem(t); !strings.Contains(string(r.Body), `"check":"no_fallback_region"`) || !strings.Contains(p.Detail, "no region can take region local's traffic") {
		t.Fatalf("a region drain with nowhere to go: %+v", p)
	}
	peers.Store([]string{"b"})
	s.shift("POST", "/v1/shifts", apptest.Admin, region, http.StatusCreated)
	s.publish()
	s.wantWeights("api", map[string]float64{"az1": 0, "az3": 0})
	s.wantWeights("web", map[string]float64{"az1": 0, "az2": 0, "az3": 0})

	// Two active shifts, one page each.
	type page struct {
		Items      []shift.Shift
		NextCursor string `json:"next_cursor"`
	}
	p1 := apptest.Decode[page](t, s.Do(t, "GET", "/v1/shifts?limit=1", s.Token(t, apptest.Viewer), "", ""))
	p2 := apptest.Decode[page](t, s.Do(t, "GET", "/v1/shifts?limit=1&cursor="+p1.NextCursor, s.Token(t, apptest.Viewer), "", ""))
	if len(p1.Items) != 1 || len(p2.Items) != 1 || p1.Items[0].Target != "az2" || p2.Items[0].Scope != "region" {
		t.Fatalf("pages %+v then %+v", p1, p2)
	}

	evs := s.shiftEvents()
	refused := 0
	for _, e := range evs {
		if e.Outcome == audit.Refused {
			refused++
		}
	}
	if len(evs) != 11 || refused != 9 {
		t.Fatalf("%d shift events, %d refused; want 11 and 9:\n%s", len(evs), refused, eventSummary(evs))
	}
	if e := evs[0]; e.Target != "az3" || !strings.Contains(string(e.After), `"in_rotation_outside": 1`) || !strings.Contains(string(e.After), `"required": 2`) {
		t.Fatalf("budget refusal audit lacks its figures: %+v %s", e, e.After)
	}
	if e := evs[len(evs)-2]; e.TargetKind != "region" || e.Outcome != audit.Refused || !strings.Contains(e.Reason, "no region can take") {
		t.Fatalf("refused region drain audit: %+v", e)
	}
	if e := evs[len(evs)-1]; e.TargetKind != "region" || e.Outcome != audit.Accepted || !strings.Contains(e.Reason, "skipped") || !strings.Contains(e.Reason, "move to regions b") {
		t.Fatalf("region drain audit: %+v", e)
	}
	s.verifyAudit()
}

// TestShiftSeenByAnotherReplica: a second muster on the same database
// learns a shift from its poll and publishes it.
func TestShiftSeenByAnotherReplica(t *testing.T) {
	t.Parallel()
	a := newShiftStack(t, apptest.Options{}, threeZones)
	b := &shiftStack{stack: apptest.New(t, apptest.Options{Pool: a.Pool}), t: t}
	b.WaitReady(t)
	ctx := context.Background()
	if err := b.Shifts.Start(ctx); err != nil { // loads what is there
		t.Fatal(err)
	}
	b.Shifts.Stop() // the test steps it
	b.publish()
	b.wantWeights("web", map[string]float64{"az1": 1})

	a.shift("POST", "/v1/shifts", apptest.Operator, drainAZ1, http.StatusCreated)
	if err := b.Shifts.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	b.publish()
	b.wantWeights("web", map[string]float64{"az1": 0, "az2": 1})
	// And b's dwell refusal is computed from the shared row.
	list := apptest.Decode[struct{ Items []shift.Shift }](t, b.Do(t, "GET", "/v1/shifts", b.Token(t, apptest.Admin), "", ""))
	if len(list.Items) != 1 || list.Items[0].State != shift.Draining {
		t.Fatalf("replica b lists %+v", list.Items)
	}
}

func TestShiftReadsAndBadInput(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	admin := s.Token(t, adminReq)
	for _, tc := range []struct {
		method, path, token, body string
		status                    int
		slug                      string
	}{
		{"GET", "/v1/shifts", s.Token(t, webReq), "", http.StatusForbidden, "forbidden"},
		{"GET", "/v1/shifts?state=sideways", admin, "", http.StatusBadRequest, "bad-parameter"},
		{"GET", "/v1/shifts?cursor=bm90LWEtdXVpZA", admin, "", http.StatusBadRequest, "bad-parameter"},
		{"GET", "/v1/shifts/not-a-uuid", admin, "", http.StatusNotFound, "not-found"},
		{"GET", "/v1/shifts/0190f5f6-0000-7000-8000-000000000000", admin, "", http.StatusNotFound, "not-found"},
		{"POST", "/v1/shifts/0190f5f6-0000-7000-8000-000000000000/step", admin, "", http.StatusNotFound, "not-found"},
		{"POST", "/v1/shifts", admin, `{"scope":"zone","target":"az1","reason":"a good long reason","manual":true,"force":true}`, http.StatusBadRequest, "unknown-field"},
		{"POST", "/v1/shifts", admin, `{"scope":"zone","target":"az1","reason":"a good long reason","manual":"yes"}`, http.StatusBadRequest, "malformed-json"},
	} {
		var r apptest.Response
		if tc.body != "" {
			r = s.JSON(t, tc.method, tc.path, tc.token, tc.body)
		} else {
			r = s.Do(t, tc.method, tc.path, tc.token, "", "")
		}
		if r.Status != tc.status {
			t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, r.Status, r.Body, tc.status)
		}
		problemType(t, r, tc.slug)
	}
	if r := s.Do(t, "GET", "/v1/shifts", admin, "", ""); r.Status != http.StatusOK || string(r.Body) != "{\"items\":[]}\n" {
		t.Fatalf("empty list: %d %s", r.Status, r.Body)
	}
	// None of these reached a shift: nothing was audited, nothing drained.
	evs, err := audit.List(context.Background(), db.New(s.Pool), audit.Filter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if strings.HasPrefix(e.Action, "shift.") {
			t.Fatalf("audited %+v", e)
		}
	}
}
