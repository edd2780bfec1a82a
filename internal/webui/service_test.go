package webui_test

import (
	"context"
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
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
)

var (
	adminP   = identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
	oscarP   = identity.Principal{Kind: identity.KindOperator, Subject: "oscar", Team: "payments", Role: identity.RoleOperator}
	proberTR = devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-1"}
)

// estate is a UI stack whose web service (payments) has instances per
// zone, all eligible after a probe success.
type estate struct {
	*apptest.Stack
	zones map[string][]string // web instance ids by zone
	all   []string
}

func newEstate(t *testing.T, opts apptest.Options, perZone map[string]int) *estate {
	t.Helper()
	opts.UI = true
	st := apptest.New(t, opts)
	st.Seed(t)
	e := &estate{Stack: st, zones: map[string][]string{}}
	ctx := context.Background()
	for zi, zone := range []string{"az1", "az2", "az3"} {
		for i := range perZone[zone] {
			in, err := st.Registry.Register(ctx, adminP, netip.Addr{}, "web",
				registry.Registration{Address: fmt.Sprintf("10.%d.0.%d", zi+1, i+1), Port: 8080, Zone: zone})
			if err != nil {
				t.Fatal(err)
			}
			e.zones[zone] = append(e.zones[zone], in.ID.String())
			e.all = append(e.all, in.ID.String())
		}
	}
	if _, err := st.Registry.PutProberAssignments(ctx, adminP, "prober-1", registry.ProberAssignments{Services: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	st.WaitReady(t)
	if err := st.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	e.probe(t, "success", e.all...)
	return e
}

// probe reports one probe outcome for each id, evaluates and publishes
// (past the 1 s addition window).
func (e *estate) probe(t *testing.T, outcome string, ids ...string) {
	t.Helper()
	var items []string
	for _, id := range ids {
		items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":%q}`, id, outcome))
	}
	r := e.JSON(t, "POST", "/v1/reports", e.Token(t, proberTR), `{"reports":[`+strings.Join(items, ",")+`]}`)
	if r.Status != http.StatusOK || strings.Contains(string(r.Body), `"code"`) {
		t.Fatalf("reports: %d %s", r.Status, r.Body)
	}
	e.Evaluator.EvaluateNow()
	e.Publisher.RunOnce()
	e.Clock.Advance(1100 * time.Millisecond)
	e.Publisher.RunOnce()
}

func (e *estate) others(except ...string) []string {
	var out []string
	for _, id := range e.all {
		if !strings.Contains(strings.Join(except, ","), id) {
			out = append(out, id)
		}
	}
	return out
}

// flapUntilQuarantined fails and restores id until the evaluator
// quarantines it, keeping every other instance fresh.
func (e *estate) flapUntilQuarantined(t *testing.T, id string) {
	t.Helper()
	for range 12 {
		e.probe(t, "hard_failure", id)
		if e.quarantined(t, id) {
			return
		}
		e.Clock.Advance(35 * time.Second)
		e.probe(t, "success", e.others()...)
		if e.quarantined(t, id) {
			return
		}
		e.Clock.Advance(time.Second)
	}
	t.Fatalf("instance %s was not quarantined after 12 flaps", id)
}

func (e *estate) quarantined(t *testing.T, id string) bool {
	t.Helper()
	el, err := e.Evaluator.ServiceEligibility("web")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range el.Instances {
		if in.InstanceID.String() == id {
			return in.QuarantineUntil != nil
		}
	}
	t.Fatalf("no instance %s", id)
	return false
}

// waitQuarantineWritten polls (with a deadline) until the transition that
// quarantined id is in the database: the evaluator writes transitions in
// the background.
func (e *estate) waitQuarantineWritten(t *testing.T, id string) {
	t.Helper()
	wait.For(t, 20*time.Second, "the quarantine transition written", func() bool {
		rows, _, err := evaluator.QuarantineHistory(context.Background(), e.Pool, "web", e.Clock.Now().Add(-time.Hour), 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.InstanceID.String() == id {
				return true
			}
		}
		return false
	})
}

// post submits a form from the UI's own page.
func (b *browser) post(path string, form url.Values) page {
	b.t.Helper()
	return b.do("POST", path, form, sameOrigin)
}

func overrideForm(action, justification, expires string) url.Values {
	return url.Values{"action": {action}, "justification": {justification}, "expires_in": {expires}}
}

func mustContain(t *testing.T, what, body string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(body, w) {
			t.Errorf("%s lacks %q", what, w)
		}
	}
	if t.Failed() {
		t.Logf("%s:\n%s", what, body)
		t.FailNow()
	}
}

// section returns the part of a page from the element with id on.
func section(body, id string) string {
	i := strings.Index(body, `id="`+id+`"`)
	if i < 0 {
		return ""
	}
	return body[i:]
}

func TestServicePageShowsQuarantineTripAndOverride(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string]int{"az1": 4, "az2": 4})
	flapper := e.zones["az1"][0]
	e.flapUntilQuarantined(t, flapper)
	e.waitQuarantineWritten(t, flapper)

	// A bad rollout in az2: three of four fail, the guard trips.
	e.probe(t, "hard_failure", e.zones["az2"][:3]...)
	if err := e.Guards.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// An override in force, by oscar.
	target := uuid.MustParse(e.zones["az1"][1])
	if _, err := e.Policy.Create(context.Background(), oscarP, policy.Request{InstanceID: target.String(),
		Action: policy.MarkIneligible, Justification: "draining for a kernel upgrade", ExpiresIn: 3600}); err != nil {
		t.Fatal(err)
	}

	b := newBrowser(t, e.Stack)
	b.signIn("vera")
	ov := b.get("/ui/")
	mustContain(t, "overview", ov.body, `href="/ui/services/web"`)
	p := b.get("/ui/services/web")
	if p.status != http.StatusOK {
		t.Fatalf("service page: %d\n%s", p.status, p.body)
	}
	mustContain(t, "service page", p.body,
		`data-instance="`+flapper+`"`, "quarantined", "until",
		// Every instance row says how old its evidence is.
		"failure rate", "ago",
		// Contract and capability profile.
		"Minimum healthy fraction", "Capability profile", "Platform defaults")
	flaps := section(p.body, "flaps")
	mustContain(t, "flap report", flaps, `data-instance="`+flapper+`"`, "eligible → ineligible", "ineligible → eligible")
	guards := section(p.body, "guards")
	mustContain(t, "guard section", guards, `data-zone="az2"`, "tripped", "1 of 4", "Guard-trip history", "still tripped", "below the minimum healthy fraction")
	row := section(p.body, `instances`)
	row = row[strings.Index(row, `data-instance="`+target.String()+`"`):]
	mustContain(t, "overridden row", row[:strings.Index(row, "</tr>")], "marked ineligible", "operator:oscar", "draining for a kernel upgrade", "expires")
	// A viewer sees no buttons.
	for _, forbidden := range []string{"Submit override", "Lift…", "Co-sign and apply"} {
		if strings.Contains(p.body, forbidden) {
			t.Errorf("the viewer's service page offers %q", forbidden)
		}
	}

	// The guard clears when az2 recovers (after the minimum dwell); the
	// history records it.
	e.Clock.Advance(31 * time.Second)
	e.probe(t, "success", e.others(flapper)...)
	if err := e.Guards.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	p = b.get("/ui/services/web")
	mustContain(t, "guard history after recovery", section(p.body, "guard-history"), "cleared")
	if strings.Contains(section(p.body, "guard-history"), "still tripped") {
		t.Error("a cleared trip is still shown as tripped")
	}

	if r := b.get("/ui/services/nope"); r.status != http.StatusNotFound {
		t.Errorf("unknown service: %d", r.status)
	}
}

var pendingRE = regexp.MustCompile(`class="pending" data-override="([0-9a-f-]{36})"`)

func TestOverrideFormsBudgetCosignLift(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string]int{"az1": 4, "az2": 2})
	az1 := e.zones["az1"]
	oscar := newBrowser(t, e.Stack)
	oscar.signIn("oscar")
	page := oscar.get("/ui/services/web")
	mustContain(t, "operator's service page", page.body, "Submit override", `value="900"`, `value="86400"`)

	// Accepted.
	r := oscar.post("/ui/services/web/instances/"+az1[0]+"/override", overrideForm("mark_ineligible", "disk errors in dmesg on this host", "3600"))
	if r.status != http.StatusOK {
		t.Fatalf("accepted override: %d\n%s", r.status, r.body)
	}
	mustContain(t, "accepted result", r.body, "Override applied", "marked ineligible", `data-outcome="accepted"`)
	e.Evaluator.EvaluateNow()

	// az1: 3 of 4 eligible now; the contract requires 2. The second goes
	// through, the third is refused by the budget with the numbers.
	r = oscar.post("/ui/services/web/instances/"+az1[1]+"/override", overrideForm("mark_ineligible", "same disk errors on the twin host", "900"))
	if r.status != http.StatusOK {
		t.Fatalf("second override: %d\n%s", r.status, r.body)
	}
	r = oscar.post("/ui/services/web/instances/"+az1[2]+"/override", overrideForm("mark_ineligible", "third host shows the disk errors too", "900"))
	if r.status != http.StatusConflict {
		t.Fatalf("over budget: %d\n%s", r.status, r.body)
	}
	mustContain(t, "budget refusal", r.body, "Refused by the disruption budget",
		"would leave 1 of 4 eligible in zone az1; the contract requires 2", "waits for a co-signer", `id="cosign-by"`, `data-outcome="pending"`)

	// The overview's counts are the instances' own verdicts; it says how
	// many the views hold out by override.
	if err := e.Evaluator.SyncNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustContain(t, "overview with two overrides in force", section(oscar.get("/ui/").body, "services"), "2 held out by override")

	// The pending attempt shows on the service page; oscar may not co-sign it.
	page = oscar.get("/ui/services/web")
	m := pendingRE.FindStringSubmatch(page.body)
	if m == nil {
		t.Fatalf("no pending co-sign on the service page:\n%s", page.body)
	}
	id := m[1]
	mustContain(t, "oscar's pending co-sign", section(page.body, "pending-cosigns"), "operator:oscar", "third host shows the disk errors too", "a colleague must co-sign it")
	if strings.Contains(section(page.body, "pending-cosigns"), "Co-sign and apply") {
		t.Error("the asker is offered a co-sign button")
	}
	r = oscar.post("/ui/overrides/"+id+"/cosign", url.Values{"justification": {"I am sure, really sure"}, "service": {"web"}})
	if r.status != http.StatusForbidden {
		t.Fatalf("self co-sign: %d\n%s", r.status, r.body)
	}
	mustContain(t, "self co-sign", r.body, "You cannot co-sign your own override", "second operator")

	// otto, a second operator of payments, co-signs: it applies.
	otto := newBrowser(t, e.Stack)
	landing := otto.signIn("otto")
	mustContain(t, "otto's overview", section(landing.body, "pending-cosigns"), "1 override(s) waiting for a co-signer",
		`href="/ui/services/web"`, az1[2], "operator:oscar")
	page = otto.get("/ui/services/web")
	mustContain(t, "otto's pending co-sign", section(page.body, "pending-cosigns"), "Co-sign and apply", "/ui/overrides/"+id+"/cosign")
	r = otto.post("/ui/overrides/"+id+"/cosign", url.Values{"justification": {"confirmed the disk errors with oscar"}, "service": {"web"}})
	if r.status != http.StatusOK {
		t.Fatalf("co-sign: %d\n%s", r.status, r.body)
	}
	mustContain(t, "co-sign result", r.body, "co-signed and applied", "operator:oscar asked and you co-signed", "would leave 1 of 4")
	ov, err := e.Policy.Get(context.Background(), oscarP, uuid.MustParse(id))
	if err != nil || ov.State != policy.StateActive || ov.Cosigner != "operator:otto" {
		t.Fatalf("after the co-sign: %+v %v", ov, err)
	}

	// Lift, with a confirmation first.
	c := otto.get("/ui/overrides/" + id + "/lift")
	mustContain(t, "lift confirmation", c.body, "Lift this override?", `id="confirm-lift"`, "third host shows the disk errors too")
	r = otto.post("/ui/overrides/"+id+"/lift", url.Values{"service": {"web"}})
	if r.status != http.StatusOK {
		t.Fatalf("lift: %d\n%s", r.status, r.body)
	}
	mustContain(t, "lift result", r.body, "Override lifted")
	if ov, _ := e.Policy.Get(context.Background(), oscarP, uuid.MustParse(id)); ov.State != policy.StateLifted || ov.LiftedBy != "operator:otto" {
		t.Fatalf("after the lift: %+v", ov)
	}

	// Justification refused, saying what is wrong.
	r = oscar.post("/ui/services/web/instances/"+az1[3]+"/override", overrideForm("mark_eligible", "x", "900"))
	if r.status != http.StatusUnprocessableEntity {
		t.Fatalf("short justification: %d\n%s", r.status, r.body)
	}
	mustContain(t, "justification refusal", r.body, "Refused: the justification", "What is wrong", "too short")
	// The form comes back as sent, to fix and submit again.
	mustContain(t, "retry form", section(r.body, "retry"), `/ui/services/web/instances/`+az1[3]+`/override`,
		`value="mark_eligible" checked`, `name="justification" value="x"`, `value="900" selected`)

	// Every attempt is in the audit log through the policy path.
	want := map[string]int{"override.create/accepted": 2, "override.create/refused": 2, "override.cosign/refused": 1,
		"override.cosign/accepted": 1, "override.lift/accepted": 1}
	got := map[string]int{}
	for _, ev := range auditEvents(t, e.Stack, audit.Filter{}) {
		if strings.HasPrefix(ev.Action, "override.") {
			got[ev.Action+"/"+string(ev.Outcome)]++
		}
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("audit %s: %d events, want %d (all: %v)", k, got[k], n, got)
		}
	}
	cosigned := auditEvents(t, e.Stack, audit.Filter{Action: "override.cosign", Outcome: audit.Accepted})
	if len(cosigned) != 1 || cosigned[0].Actor != "operator:otto" || !strings.Contains(string(cosigned[0].After), "confirmed the disk errors with oscar") {
		t.Errorf("co-sign audit: %+v", cosigned)
	}
}

func TestOverrideFormRateLimited(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{Policy: func(c *policy.Config) {
		c.OverrideLimit = policy.Limit{Max: 2, Window: 10 * time.Minute}
	}}, map[string]int{"az1": 6})
	oscar := newBrowser(t, e.Stack)
	oscar.signIn("oscar")
	for i := range 2 {
		r := oscar.post("/ui/services/web/instances/"+e.zones["az1"][i]+"/override", overrideForm("mark_ineligible", "noisy neighbour on this host", "900"))
		if r.status != http.StatusOK {
			t.Fatalf("attempt %d: %d\n%s", i+1, r.status, r.body)
		}
	}
	e.Clock.Advance(time.Minute)
	r := oscar.post("/ui/services/web/instances/"+e.zones["az1"][2]+"/override", overrideForm("mark_ineligible", "noisy neighbour on this host", "900"))
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("third attempt: %d\n%s", r.status, r.body)
	}
	// The first attempt leaves the 10-minute window 9 minutes from now.
	if ra := r.header.Get("Retry-After"); ra != "540" {
		t.Errorf("Retry-After %q, want 540", ra)
	}
	retryAt := e.Clock.Now().Add(540 * time.Second).UTC().Format("2006-01-02 15:04:05 UTC")
	mustContain(t, "rate-limit refusal", r.body, "too many override attempts", "2 override attempts", "Retry in 540 s", retryAt)
}

func TestOverrideFormRefusesViewerAndCrossSite(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string]int{"az1": 4})
	target := e.zones["az1"][0]
	form := overrideForm("mark_ineligible", "forged request from a viewer", "900")

	vera := newBrowser(t, e.Stack)
	vera.signIn("vera")
	r := vera.post("/ui/services/web/instances/"+target+"/override", form)
	if r.status != http.StatusForbidden {
		t.Fatalf("viewer's forged POST: %d\n%s", r.status, r.body)
	}
	evs := auditEvents(t, e.Stack, audit.Filter{Actor: "operator:vera", Action: "override.create", Outcome: audit.Refused})
	if len(evs) != 1 || !strings.Contains(evs[0].Reason, "viewer role may not") {
		t.Errorf("viewer's refusal audit: %+v", evs)
	}
	if r := vera.post("/ui/overrides/"+uuid.NewString()+"/lift", url.Values{}); r.status != http.StatusForbidden {
		t.Errorf("viewer's forged lift: %d", r.status)
	}

	oscar := newBrowser(t, e.Stack)
	oscar.signIn("oscar")
	r = oscar.do("POST", "/ui/services/web/instances/"+target+"/override", form,
		map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"})
	if r.status != http.StatusForbidden || !strings.Contains(r.body, "another site") {
		t.Fatalf("cross-site POST: %d\n%s", r.status, r.body)
	}
	if evs := auditEvents(t, e.Stack, audit.Filter{Actor: "operator:oscar", Action: "ui.cross_origin"}); len(evs) != 1 {
		t.Errorf("cross-site refusal audit: %+v", evs)
	}
	list, err := e.Policy.List(context.Background(), oscarP, policy.Filter{Service: "web", Limit: 10})
	if err != nil || len(list) != 0 {
		t.Fatalf("refused forms created overrides: %+v %v", list, err)
	}
	if evs := auditEvents(t, e.Stack, audit.Filter{Action: "override.create", Outcome: audit.Accepted}); len(evs) != 0 {
		t.Errorf("accepted override events after refusals: %+v", evs)
	}
}
