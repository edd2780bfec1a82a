package webui_test

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/views"
)

var uiAdmin = identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}

// newShiftUIStack is a UI stack with two web instances in each of az1, az2
// and az3, each probed once successfully (eligible), evaluated, and a
// two-step ladder (50%, then 100%) so a manual shift is one step from its
// confirmation.
func newShiftUIStack(t *testing.T, dwell time.Duration) *apptest.Stack {
	t.Helper()
	st := apptest.New(t, apptest.Options{UI: true, Shifts: func(c *shift.Config) {
		c.Steps, c.Dwell = []float64{0.5, 1}, dwell
	}})
	st.Seed(t)
	n := 0
	var items []string
	for _, zone := range []string{"az1", "az2", "az3"} {
		for range 2 {
			n++
			in, err := st.Registry.Register(t.Context(), uiAdmin, netip.Addr{}, "web", registry.Registration{
				Address: fmt.Sprintf("10.9.0.%d", n), Port: 8080, Zone: zone})
			if err != nil {
				t.Fatal(err)
			}
			items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":"success"}`, in.ID))
		}
	}
	st.WaitReady(t)
	// web's instances enter rotation on their first probe.
	if _, err := st.Registry.PutProberAssignments(t.Context(), uiAdmin, "prober-1", registry.ProberAssignments{Services: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	if err := st.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	prober := st.Token(t, devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-1"})
	if r := st.JSON(t, "POST", "/v1/reports", prober, `{"reports":[`+strings.Join(items, ",")+`]}`); r.Status != http.StatusOK || strings.Contains(string(r.Body), `"code"`) {
		t.Fatalf("reports: %d %s", r.Status, r.Body)
	}
	st.Evaluator.EvaluateNow()
	return st
}

var shiftRowRE = regexp.MustCompile(`data-shift="([0-9a-f-]{36})" data-target="az1"`)

// activeShiftID finds az1's shift row on the page.
func activeShiftID(t *testing.T, body string) string {
	t.Helper()
	m := shiftRowRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no active shift of az1 on the page:\n%s", body)
	}
	return m[1]
}

func TestShiftsPageDrainStepAndDwell(t *testing.T) {
	t.Parallel()
	st := newShiftUIStack(t, shift.DefaultDwell)
	oscar := newBrowser(t, st)
	oscar.signIn("oscar")

	p := oscar.get("/ui/shifts")
	if p.status != http.StatusOK || !strings.Contains(p.body, `id="drain"`) || !strings.Contains(p.body, `id="no-active"`) {
		t.Fatalf("shifts page for an operator: %d, want the drain form and no shifts:\n%s", p.status, p.body)
	}
	if !strings.Contains(p.body, `href="/ui/shifts" aria-current="page"`) {
		t.Error("the nav does not mark Shift-backs as the current page")
	}

	// A reason too short: refused with the field explained, nothing drained.
	res := oscar.post("/ui/shifts", url.Values{"zone": {"az1"}, "reason": {"az1 bad"}, "manual": {"true"}})
	if res.status != http.StatusUnprocessableEntity || !strings.Contains(res.body, "reason must say why in 10 to 1000 characters, got 7") ||
		!strings.Contains(res.body, `value="az1 bad"`) {
		t.Fatalf("short reason: %d\n%s", res.status, res.body)
	}

	res = oscar.post("/ui/shifts", url.Values{"zone": {"az1"}, "reason": {"failover drill: az1 load balancer errors"}, "manual": {"true"}})
	if res.status != http.StatusSeeOther || res.location != "/ui/shifts" {
		t.Fatalf("drain: %d %q\n%s", res.status, res.location, res.body)
	}
	p = oscar.get("/ui/shifts")
	if !strings.Contains(p.body, "Zone az1 is drained: its traffic weight is now 0%") || !strings.Contains(p.body, "manual: the final step back will wait") {
		t.Fatalf("after the drain the page does not say what happened:\n%s", p.body)
	}
	id := activeShiftID(t, p.body)
	drainedAt := st.Clock.Now()
	nextAt := views.Absolute(drainedAt.Add(shift.DefaultDwell))
	if !strings.Contains(p.body, `id="step-`+id+`"`) || !strings.Contains(p.body, "allowed") || !strings.Contains(p.body, nextAt) {
		t.Fatalf("the active shift lacks its step button or the next allowed time %s:\n%s", nextAt, p.body)
	}
	if strings.Contains(oscar.get("/ui/shifts").body, "Zone az1 is drained") {
		t.Error("the outcome is shown again on the next load")
	}

	// Inside the dwell: refused, with when the step is allowed.
	st.Clock.Advance(30 * time.Second)
	res = oscar.post("/ui/shifts/"+id+"/step", url.Values{})
	if res.status != http.StatusConflict || !strings.Contains(res.body, "Not yet: the minimum dwell") ||
		!strings.Contains(res.body, `id="next-allowed"`) || !strings.Contains(res.body, nextAt) || !strings.Contains(res.body, "in 1 min") {
		t.Fatalf("step inside the dwell: %d\n%s", res.status, res.body)
	}
	if strings.Contains(res.body, "data-refresh") {
		t.Error("the refusal page refreshes itself, which would replace the explanation")
	}
	if ra := res.header.Get("Retry-After"); ra != "90" {
		t.Errorf("Retry-After %q, want 90", ra)
	}
	evs := auditEvents(t, st, audit.Filter{Action: "shift.step", Actor: "operator:oscar"})
	if len(evs) != 1 || evs[0].Outcome != audit.Refused || !strings.Contains(evs[0].Reason, "minimum dwell") {
		t.Fatalf("refused step audit: %+v", evs)
	}

	// After the dwell: the step is taken, and the manual shift now waits
	// for its confirmation; a further step is refused and says so.
	st.Clock.Advance(shift.DefaultDwell)
	if res = oscar.post("/ui/shifts/"+id+"/step", url.Values{}); res.status != http.StatusSeeOther {
		t.Fatalf("step after the dwell: %d\n%s", res.status, res.body)
	}
	p = oscar.get("/ui/shifts")
	if !strings.Contains(p.body, "traffic weight now 50%. The final step back needs an operator&#39;s confirmation") ||
		!strings.Contains(p.body, `id="pending-shifts"`) || !strings.Contains(p.body, `id="confirm-`+id+`"`) || !strings.Contains(p.body, "pending for 0 s") {
		t.Fatalf("after the step the shift is not shown waiting for confirmation:\n%s", p.body)
	}
	st.Clock.Advance(shift.DefaultDwell + time.Second)
	res = oscar.post("/ui/shifts/"+id+"/step", url.Values{})
	if res.status != http.StatusConflict || !strings.Contains(res.body, "This step needs a confirmation") {
		t.Fatalf("step instead of confirm: %d\n%s", res.status, res.body)
	}
	if p = oscar.get("/ui/shifts"); !strings.Contains(p.body, "pending for 2 min 1 s") {
		t.Errorf("the page does not show how long the confirmation has waited:\n%s", p.body)
	}
}

func TestShiftsPageBudgetRefusal(t *testing.T) {
	t.Parallel()
	st := newShiftUIStack(t, shift.DefaultDwell)
	alice := newBrowser(t, st)
	alice.signIn("alice")
	if res := alice.post("/ui/shifts", url.Values{"zone": {"az1"}, "reason": {"az1 drained for maintenance"}}); res.status != http.StatusSeeOther {
		t.Fatalf("first drain: %d\n%s", res.status, res.body)
	}
	p := alice.get("/ui/shifts")
	if !strings.Contains(p.body, "automatic failover") {
		t.Errorf("an unchecked manual box did not start an automatic shift:\n%s", p.body)
	}
	// With az1 gone, draining az2 leaves web 2 of 6 in rotation; it needs 3.
	res := alice.post("/ui/shifts", url.Values{"zone": {"az2"}, "reason": {"az2 drained for maintenance"}, "manual": {"true"}})
	if res.status != http.StatusConflict || !strings.Contains(res.body, "draining this zone would take services below their minimum") {
		t.Fatalf("over-budget drain: %d\n%s", res.status, res.body)
	}
	row := regexp.MustCompile(`(?s)<table id="budget">.*?<td>web</td>\s*<td class="num">2</td>\s*<td class="num">6</td>\s*<td class="num">3</td>\s*<td class="num">50%</td>`)
	if !row.MatchString(res.body) {
		t.Errorf("the refusal does not give web's figures (2 of 6 in rotation, 3 needed, 50%%):\n%s", res.body)
	}
	if !strings.Contains(res.body, `value="az2"`) || !strings.Contains(res.body, `value="az2 drained for maintenance"`) {
		t.Error("the refused form lost what was typed")
	}
	evs := auditEvents(t, st, audit.Filter{Action: "shift.start", Outcome: audit.Refused})
	if len(evs) != 1 || evs[0].Target != "az2" || !strings.Contains(evs[0].Reason, "web would keep 2 of 6") {
		t.Fatalf("refused drain audit: %+v", evs)
	}
}

// pendingShift drains az1 manually through the policy API (as the API
// would) and steps it to its confirmation, past the dwell.
func pendingShift(t *testing.T, st *apptest.Stack, dwell time.Duration) string {
	t.Helper()
	oscar := identity.Principal{Kind: identity.KindOperator, Subject: "oscar", Team: "payments", Role: identity.RoleOperator}
	manual := true
	sh, err := st.Shifts.Drain(t.Context(), oscar, shift.Request{Scope: "zone", Target: "az1", Reason: "failover drill in az1", Manual: &manual})
	if err != nil {
		t.Fatal(err)
	}
	st.Clock.Advance(dwell)
	if sh, err = st.Shifts.StepBack(t.Context(), oscar, sh.ID); err != nil || sh.State != shift.PendingConfirmation {
		t.Fatalf("step to pending: %+v %v", sh, err)
	}
	st.Clock.Advance(dwell)
	return sh.ID.String()
}

func TestShiftsPageConfirmByOperator(t *testing.T) {
	t.Parallel()
	st := newShiftUIStack(t, shift.DefaultDwell)
	oscar := newBrowser(t, st)
	oscar.signIn("oscar") // before the clock moves on: ID tokens carry the real time
	id := pendingShift(t, st, shift.DefaultDwell)
	st.Clock.Advance(shift.DefaultPendingAlarm) // the alarm opens
	over := oscar.get("/ui/")
	if !strings.Contains(over.body, "shiftback_pending") || !strings.Contains(over.body, `href="/ui/shifts#pending"`) {
		t.Fatalf("the overview's banner does not link the pending shift-back:\n%s", over.body)
	}
	p := oscar.get("/ui/shifts")
	if !strings.Contains(p.body, "alarm: shiftback_pending") || !strings.Contains(p.body, "pending for 12 min 0 s") {
		t.Errorf("the pending shift lacks its alarm or its age:\n%s", p.body)
	}
	res := oscar.post("/ui/shifts/"+id+"/confirm", url.Values{})
	if res.status != http.StatusSeeOther {
		t.Fatalf("confirm: %d\n%s", res.status, res.body)
	}
	p = oscar.get("/ui/shifts")
	if !strings.Contains(p.body, "Confirmed: zone az1 is back at traffic weight 100% and the shift is completed") ||
		!strings.Contains(p.body, `id="no-pending"`) {
		t.Fatalf("after the confirmation:\n%s", p.body)
	}
	done := regexp.MustCompile(`(?s)<table id="completed-shifts">.*data-shift="` + id + `".*by operator:oscar`)
	if !done.MatchString(p.body) {
		t.Errorf("the completed shift is not listed as confirmed by oscar:\n%s", p.body)
	}
	evs := auditEvents(t, st, audit.Filter{Action: "shift.confirm"})
	if len(evs) != 1 || evs[0].Outcome != audit.Accepted || evs[0].Actor != "operator:oscar" || evs[0].Target != "az1" {
		t.Fatalf("confirm audit: %+v", evs)
	}
	if a := st.Shifts.Alarms(); len(a) != 0 {
		t.Errorf("alarm still open after the confirmation: %+v", a)
	}
}

func TestShiftsPageViewerCannotConfirm(t *testing.T) {
	t.Parallel()
	st := newShiftUIStack(t, shift.DefaultDwell)
	vera := newBrowser(t, st)
	vera.signIn("vera")
	id := pendingShift(t, st, shift.DefaultDwell)
	p := vera.get("/ui/shifts")
	if p.status != http.StatusOK || !strings.Contains(p.body, `data-shift="`+id+`"`) {
		t.Fatalf("a viewer does not see the pending shift: %d\n%s", p.status, p.body)
	}
	for _, button := range []string{`id="confirm-`, `id="step-`, `id="drain"`} {
		if strings.Contains(p.body, button) {
			t.Errorf("a viewer is shown %s", button)
		}
	}
	// A forged confirmation: refused by the guard, audited, not taken.
	res := vera.post("/ui/shifts/"+id+"/confirm", url.Values{})
	if res.status != http.StatusForbidden || !strings.Contains(res.body, "may look but not act") {
		t.Fatalf("viewer's forged confirm: %d\n%s", res.status, res.body)
	}
	evs := auditEvents(t, st, audit.Filter{Action: "shift.confirm"})
	if len(evs) != 1 || evs[0].Outcome != audit.Refused || evs[0].Actor != "operator:vera" || !strings.Contains(evs[0].Reason, "viewer") {
		t.Fatalf("viewer's refused confirm audit: %+v", evs)
	}
	if res := vera.post("/ui/shifts", url.Values{"zone": {"az2"}, "reason": {"viewer tries to drain az2"}}); res.status != http.StatusForbidden {
		t.Errorf("viewer's forged drain: %d", res.status)
	}
	shifts, err := st.Shifts.List(t.Context(), uiAdmin, shift.Filter{})
	if err != nil || len(shifts) != 1 || shifts[0].State != shift.PendingConfirmation {
		t.Fatalf("after the viewer's attempts: %+v %v", shifts, err)
	}
}

func TestShiftsPageCrossSiteConfirmRefused(t *testing.T) {
	t.Parallel()
	st := newShiftUIStack(t, shift.DefaultDwell)
	oscar := newBrowser(t, st)
	oscar.signIn("oscar")
	id := pendingShift(t, st, shift.DefaultDwell)
	res := oscar.do("POST", "/ui/shifts/"+id+"/confirm", url.Values{}, map[string]string{"Sec-Fetch-Site": "cross-site"})
	if res.status != http.StatusForbidden {
		t.Fatalf("cross-site confirm: %d\n%s", res.status, res.body)
	}
	evs := auditEvents(t, st, audit.Filter{Action: "ui.cross_origin"})
	if len(evs) != 1 || evs[0].Actor != "operator:oscar" || evs[0].Target != "/ui/shifts/"+id+"/confirm" {
		t.Fatalf("cross-origin audit: %+v", evs)
	}
	if evs := auditEvents(t, st, audit.Filter{Action: "shift.confirm"}); len(evs) != 0 {
		t.Fatalf("a cross-site POST reached the confirmation: %+v", evs)
	}
	sh, err := st.Shifts.List(t.Context(), uiAdmin, shift.Filter{State: shift.PendingConfirmation})
	if err != nil || len(sh) != 1 {
		t.Fatalf("the shift is no longer pending: %+v %v", sh, err)
	}
}

func TestShiftsPageCompletedPagination(t *testing.T) {
	t.Parallel()
	st := newShiftUIStack(t, time.Second)
	b := newBrowser(t, st)
	b.signIn("vera")
	var ids []string
	for range 21 {
		ids = append(ids, pendingShift(t, st, time.Second))
		id := ids[len(ids)-1]
		oscar := identity.Principal{Kind: identity.KindOperator, Subject: "oscar", Team: "payments", Role: identity.RoleOperator}
		if _, err := st.Shifts.Confirm(t.Context(), oscar, mustUUID(t, id)); err != nil {
			t.Fatal(err)
		}
	}
	p := b.get("/ui/shifts")
	if !strings.Contains(p.body, `data-shift="`+ids[19]+`"`) || strings.Contains(p.body, `data-shift="`+ids[20]+`"`) {
		t.Fatalf("first page of completed shifts is not the oldest 20")
	}
	m := regexp.MustCompile(`id="later" href="([^"]+)"`).FindStringSubmatch(p.body)
	if m == nil {
		t.Fatal("no link to the next page")
	}
	p = b.get(strings.ReplaceAll(m[1], "&amp;", "&"))
	if !strings.Contains(p.body, `data-shift="`+ids[20]+`"`) || strings.Contains(p.body, `data-shift="`+ids[0]+`"`) || strings.Contains(p.body, `id="later"`) {
		t.Fatalf("second page:\n%s", p.body)
	}
	if res := b.get("/ui/shifts?after=not-a-uuid"); res.status != http.StatusBadRequest {
		t.Errorf("a bad cursor: %d", res.status)
	}
}

func mustUUID(t *testing.T, s string) uuid.UUID {
	t.Helper()
	id, err := uuid.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
