package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/server"
)

var (
	// samReq operates for another team; paulaReq is oscar's teammate.
	samReq    = devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "sam", Team: "search", Role: identity.RoleOperator}
	paulaReq  = devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "paula", Team: "payments", Role: identity.RoleOperator}
	proberReq = devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-1"}
	adminP    = identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
)

// ofix is a stack whose web service (payments) has instances per zone,
// all eligible by a probe success.
type ofix struct {
	*apptest.Stack
	zones map[string][]string // web instance ids by zone
}

func newOverrideFixture(t *testing.T, opts apptest.Options, perZone map[string]int) *ofix {
	t.Helper()
	s := apptest.New(t, opts)
	f := &ofix{Stack: s, zones: map[string][]string{}}
	if opts.Pool == nil {
		s.Seed(t)
	}
	ctx := context.Background()
	zi := 0
	for _, zone := range []string{"az1", "az2", "az3"} {
		zi++
		for i := range perZone[zone] {
			in, err := s.Registry.Register(ctx, adminP, netip.Addr{}, "web", registry.Registration{Address: fmt.Sprintf("10.%d.0.%d", zi, i+1), Port: 8080, Zone: zone})
			if err != nil {
				t.Fatal(err)
			}
			f.zones[zone] = append(f.zones[zone], in.ID.String())
		}
	}
	if _, err := s.Registry.PutProberAssignments(ctx, adminP, "prober-1", registry.ProberAssignments{Services: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	f.waitReady(t)
	f.probeAll(t, "success")
	return f
}

func (f *ofix) waitReady(t *testing.T) {
	t.Helper()
	f.WaitReady(t)
	if err := f.Evaluator.SyncNow(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// probe reports one outcome for each id and evaluates.
func (f *ofix) probe(t *testing.T, outcome string, ids ...string) {
	t.Helper()
	var items []string
	for _, id := range ids {
		items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":%q}`, id, outcome))
	}
	r := f.JSON(t, "POST", "/v1/reports", f.Token(t, proberReq), `{"reports":[`+strings.Join(items, ",")+`]}`)
	if r.Status != http.StatusOK || strings.Contains(string(r.Body), `"code"`) {
		t.Fatalf("reports: %d %s", r.Status, r.Body)
	}
	f.Evaluator.EvaluateNow()
}

func (f *ofix) probeAll(t *testing.T, outcome string) {
	t.Helper()
	var ids []string
	for _, z := range f.zones {
		ids = append(ids, z...)
	}
	f.probe(t, outcome, ids...)
}

func (f *ofix) override(t *testing.T, tok, id, action, justification string, expiresIn int) apptest.Response {
	t.Helper()
	body := fmt.Sprintf(`{"instance_id":%q,"action":%q,"justification":%q`, id, action, justification)
	if expiresIn != 0 {
		body += fmt.Sprintf(`,"expires_in":%d`, expiresIn)
	}
	return f.JSON(t, "POST", "/v1/overrides", tok, body+"}")
}

// problemMap decodes a problem with its extension members.
func problemMap(t *testing.T, r apptest.Response) map[string]any {
	t.Helper()
	r.Problem(t)
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func wantProblem(t *testing.T, r apptest.Response, status int, slug string) map[string]any {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d (%s): %s", r.Status, status, slug, r.Body)
	}
	m := problemMap(t, r)
	if m["type"] != server.ProblemBase+slug {
		t.Fatalf("type %v, want %s: %s", m["type"], slug, r.Body)
	}
	return m
}

// auditDecision is the part of an override audit row's after that names
// the deciding check.
type auditDecision struct {
	Check   string         `json:"check"`
	Passed  []string       `json:"passed"`
	Figures map[string]any `json:"figures"`
}

// overrideEvents returns the override audit events, oldest first.
func overrideEvents(t *testing.T, s *apptest.Stack) []audit.Event {
	t.Helper()
	evs, err := audit.List(context.Background(), db.New(s.Pool), audit.Filter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.Event
	for i := len(evs) - 1; i >= 0; i-- {
		if strings.HasPrefix(evs[i].Action, "override.") {
			out = append(out, evs[i])
		}
	}
	return out
}

func decisionOf(t *testing.T, ev audit.Event) auditDecision {
	t.Helper()
	var d auditDecision
	if err := json.Unmarshal(ev.After, &d); err != nil {
		t.Fatalf("audit after %s: %v", ev.After, err)
	}
	return d
}

func verifyAudit(t *testing.T, s *apptest.Stack) {
	t.Helper()
	rep, err := audit.Verify(context.Background(), db.New(s.Pool))
	if err != nil {
		t.Fatalf("audit chain: %v", err)
	}
	if rep.Rows == 0 {
		t.Fatal("audit chain is empty")
	}
}

// TestOverrideChecksInOrder walks every check of POST /v1/overrides: each
// refusal, the precedence between them, and acceptances, and that every
// attempt after authentication left an audit event naming its check.
func TestOverrideChecksInOrder(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 6, "az2": 1})
	az1 := f.zones["az1"]
	oscar, sam, vera, web, alice := f.Token(t, oscarReq), f.Token(t, samReq), f.Token(t, veraReq), f.Token(t, webReq), f.Token(t, adminReq)
	good := "instance serves stale prices after the cache incident INC-42"

	// Two of six in az1 fail hard: 4 of 6 eligible, the contract (0.5)
	// requires 3.
	f.probe(t, "hard_failure", az1[0], az1[1])

	// 1. Authentication.
	r := f.JSON(t, "POST", "/v1/overrides", "", `{}`)
	wantProblem(t, r, http.StatusUnauthorized, "unauthenticated")

	// 2. Authorisation: another team, a viewer, a workload. Forbidden wins
	// over a missing justification.
	for _, tok := range []string{sam, vera, web} {
		wantProblem(t, f.override(t, tok, az1[2], "mark_ineligible", "", 0), http.StatusForbidden, "forbidden")
	}

	// 4. Justification and expiry (each attempt counts toward oscar's 5).
	m := wantProblem(t, f.override(t, oscar, az1[2], "mark_ineligible", "", 0), http.StatusUnprocessableEntity, "justification-required")
	if m["check"] != "justification" {
		t.Errorf("justification refusal: %v", m)
	}
	wantProblem(t, f.override(t, oscar, az1[2], "mark_ineligible", "x", 0), http.StatusUnprocessableEntity, "justification-required")
	wantProblem(t, f.override(t, oscar, az1[2], "mark_ineligible", "xxxxxxxxxxxxxxxx", 0), http.StatusUnprocessableEntity, "justification-required")
	r = f.override(t, oscar, az1[2], "mark_ineligible", good, 25*3600)
	wantProblem(t, r, http.StatusUnprocessableEntity, "invalid-expiry")
	if r.Header.Get("RateLimit-Remaining") != "1" || r.Header.Get("RateLimit-Policy") != "5;w=600" {
		t.Errorf("after four attempts: RateLimit-Remaining %q, Policy %q", r.Header.Get("RateLimit-Remaining"), r.Header.Get("RateLimit-Policy"))
	}

	// An acceptance (oscar's fifth attempt): 3 of 6 left, exactly the
	// requirement.
	r = f.override(t, oscar, az1[2], "mark_ineligible", good, 600)
	if r.Status != http.StatusCreated {
		t.Fatalf("accept: %d %s", r.Status, r.Body)
	}
	o := apptest.Decode[policy.Override](t, r)
	if o.State != policy.StateActive || o.Actor != "operator:oscar" || o.Zone != "az1" || r.Header.Get("Location") != "/v1/overrides/"+o.ID.String() {
		t.Errorf("accepted override %+v, Location %q", o, r.Header.Get("Location"))
	}
	if r.Header.Get("RateLimit-Remaining") != "0" || r.Header.Get("RateLimit-Limit") != "5" {
		t.Errorf("quota after the fifth attempt: %v", r.Header)
	}
	if got := o.ExpiresAt.Sub(o.CreatedAt); got != 10*time.Minute {
		t.Errorf("expires after %s, want 10m", got)
	}

	// 3. The rate limit: oscar's sixth attempt is refused before its
	// justification is read, with Retry-After and the quota headers.
	r = f.override(t, oscar, az1[3], "mark_ineligible", "short", 0)
	wantProblem(t, r, http.StatusTooManyRequests, "rate-limited")
	ra, err := strconv.Atoi(r.Header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 600 {
		t.Errorf("Retry-After %q", r.Header.Get("Retry-After"))
	}
	if r.Header.Get("RateLimit-Limit") != "5" || r.Header.Get("RateLimit-Remaining") != "0" || r.Header.Get("RateLimit-Reset") == "" {
		t.Errorf("rate-limit headers: %v", r.Header)
	}

	// 5. The budget, with the numbers; the justification is checked
	// before it. Paula (oscar's teammate) has her own quota.
	paula := f.Token(t, paulaReq)
	wantProblem(t, f.override(t, paula, az1[3], "mark_ineligible", "short", 0), http.StatusUnprocessableEntity, "justification-required")
	r = f.override(t, paula, az1[3], "mark_ineligible", good, 0)
	m = wantProblem(t, r, http.StatusConflict, "budget-exceeded")
	if !strings.Contains(m["detail"].(string), "would leave 2 of 6 eligible in zone az1; the contract requires 3") {
		t.Errorf("budget detail: %v", m["detail"])
	}
	if m["zone_eligible_after"] != 2.0 || m["zone_total"] != 6.0 || m["zone_required"] != 3.0 || m["zone"] != "az1" || m["override_id"] == nil {
		t.Errorf("budget figures as extension members: %v", m)
	}

	// The window slides: once the first attempt is ten minutes old, oscar
	// may try again.
	f.Clock.Advance(time.Duration(ra) * time.Second)
	f.probeAll(t, "success") // fresh evidence after the clock moved
	f.probe(t, "hard_failure", az1[0], az1[1])

	// mark_eligible forces a failed instance back in; no budget applies.
	r = f.override(t, oscar, az1[0], "mark_eligible", "probe path is broken by the firewall change CHG-7", 0)
	if r.Status != http.StatusCreated {
		t.Fatalf("mark_eligible: %d %s", r.Status, r.Body)
	}
	// A second override on the same instance conflicts.
	wantProblem(t, f.override(t, alice, az1[0], "mark_ineligible", good, 0), http.StatusConflict, "conflict")

	// The last instance of the region: az2 is fine, so take a service with
	// one instance.
	if r := f.JSON(t, "PUT", "/v1/services/solo", alice, `{"owner":"payments","capabilities":["probe"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create solo: %d %s", r.Status, r.Body)
	}
	solo, err := f.Registry.Register(context.Background(), adminP, netip.Addr{}, "solo", registry.Registration{Address: "10.9.0.1", Port: 80, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Registry.PutProberAssignments(context.Background(), adminP, "prober-1", registry.ProberAssignments{Services: []string{"web", "solo"}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Evaluator.SyncNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.probe(t, "success", solo.ID.String())
	m = wantProblem(t, f.override(t, oscar, solo.ID.String(), "mark_ineligible", good, 0), http.StatusConflict, "last-instance")
	if m["check"] != "last_instance" || !strings.Contains(m["detail"].(string), "would leave 0 of 1 eligible in the region") || m["override_id"] != nil {
		t.Errorf("last instance: %v", m)
	}

	// Every attempt after authentication is audited, naming its check.
	var got []string
	for _, ev := range overrideEvents(t, f.Stack) {
		got = append(got, string(ev.Outcome)+":"+decisionOf(t, ev).Check)
		if ev.Action == "override.create" && ev.Outcome == audit.Refused && !strings.Contains(ev.Reason, decisionOf(t, ev).Check+": ") {
			t.Errorf("reason %q does not name the check", ev.Reason)
		}
	}
	want := []string{
		"refused:authorization", "refused:authorization", "refused:authorization",
		"refused:justification", "refused:justification", "refused:justification", "refused:expiry",
		"accepted:budget", "refused:rate_limit", "refused:justification", "refused:budget",
		"accepted:state", "refused:state", "refused:last_instance",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("audit checks:\n got %v\nwant %v", got, want)
	}
	for _, ev := range overrideEvents(t, f.Stack) {
		d := decisionOf(t, ev)
		switch d.Check {
		case "budget":
			if ev.Outcome == audit.Refused && (d.Figures["zone_eligible_after"] != 2.0 || d.Figures["zone_required"] != 3.0) {
				t.Errorf("budget refusal figures %v", d.Figures)
			}
		case "rate_limit":
			if d.Figures["limit"] != 5.0 || d.Figures["remaining"] != 0.0 {
				t.Errorf("rate-limit figures %v", d.Figures)
			}
		}
	}
	// The same decisions, counted for Prometheus: the four justification
	// refusals above, by their deciding check.
	metrics := f.Scrape(t)
	if !regexp.MustCompile(`(?m)^muster_policy_attempts_total\{action="override.create",check="justification",outcome="refused"\} 4$`).Match(metrics) ||
		!regexp.MustCompile(`(?m)^muster_policy_attempts_total\{action="override.create",check="",outcome="accepted"\} [1-9]`).Match(metrics) {
		t.Errorf("metrics lack the override decisions:\n%s", grepMetric(metrics, "muster_policy_attempts_total"))
	}
	verifyAudit(t, f.Stack)
}

// TestOverrideRateLimitIsSharedAcrossReplicas runs two muster stacks on
// one database: six attempts by one actor across both (concurrently) pass
// the limit exactly five times.
func TestOverrideRateLimitIsSharedAcrossReplicas(t *testing.T) {
	t.Parallel()
	a := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 2})
	b := apptest.New(t, apptest.Options{Pool: a.Pool})
	id := a.zones["az1"][0]
	stacks := []*apptest.Stack{a.Stack, b}
	const n = 12
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		s := stacks[i%2]
		tok := s.Token(t, oscarReq)
		wg.Go(func() {
			// An empty justification: every attempt passes authorisation
			// and counts, none changes anything else.
			statuses[i] = s.JSON(t, "POST", "/v1/overrides", tok, fmt.Sprintf(`{"instance_id":%q,"action":"mark_ineligible","justification":""}`, id)).Status
		})
	}
	wg.Wait()
	counted, limited := 0, 0
	for _, st := range statuses {
		switch st {
		case http.StatusUnprocessableEntity:
			counted++
		case http.StatusTooManyRequests:
			limited++
		default:
			t.Errorf("status %d", st)
		}
	}
	if counted != 5 || limited != n-5 {
		t.Fatalf("across two replicas: %d attempts counted, %d limited; want 5 and %d (%v)", counted, limited, n-5, statuses)
	}
	// The sixth attempt on either replica is refused with Retry-After.
	for _, s := range stacks {
		r := s.JSON(t, "POST", "/v1/overrides", s.Token(t, oscarReq), fmt.Sprintf(`{"instance_id":%q,"action":"mark_ineligible","justification":"a real reason, written down"}`, id))
		wantProblem(t, r, http.StatusTooManyRequests, "rate-limited")
		if r.Header.Get("Retry-After") == "" {
			t.Error("no Retry-After")
		}
	}
	verifyAudit(t, a.Stack)
}

// TestCosignExceedsBudgetOnlyWithTwoIdentities: a budget refusal is kept
// for a co-signer; the asker cannot co-sign it, another team cannot, a
// second identity with the authority can, and a late co-signature is
// refused.
func TestCosignExceedsBudgetOnlyWithTwoIdentities(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 4})
	az1 := f.zones["az1"]
	oscar, alice, sam := f.Token(t, oscarReq), f.Token(t, adminReq), f.Token(t, samReq)
	just := "these instances corrupt orders; see INC-77 timeline"
	for _, id := range az1[:2] {
		if r := f.override(t, oscar, id, "mark_ineligible", just, 0); r.Status != http.StatusCreated {
			t.Fatalf("within budget: %d %s", r.Status, r.Body)
		}
	}
	// 2 of 4 left; a third would leave 1 and the contract requires 2.
	m := wantProblem(t, f.override(t, oscar, az1[2], "mark_ineligible", just, 0), http.StatusConflict, "budget-exceeded")
	pending, _ := m["override_id"].(string)
	if pending == "" || m["cosign_url"] != "/v1/overrides/"+pending+"/cosign" {
		t.Fatalf("budget refusal: %v", m)
	}
	r := f.Do(t, "GET", "/v1/overrides/"+pending, alice, "", "")
	if o := apptest.Decode[policy.Override](t, r); o.State != policy.StatePending || o.CosignBy == nil {
		t.Fatalf("pending override: %s", r.Body)
	}
	// A second pending attempt by alice herself, left to expire.
	m = wantProblem(t, f.override(t, alice, az1[3], "mark_ineligible", just, 0), http.StatusConflict, "budget-exceeded")
	late, _ := m["override_id"].(string)

	cosign := func(tok, id, j string) apptest.Response {
		return f.JSON(t, "POST", "/v1/overrides/"+id+"/cosign", tok, fmt.Sprintf(`{"justification":%q}`, j))
	}
	wantProblem(t, cosign(oscar, pending, "I really mean it, see INC-77"), http.StatusForbidden, "self-cosign")
	wantProblem(t, cosign(sam, pending, "I agree with oscar on INC-77"), http.StatusForbidden, "forbidden")
	wantProblem(t, cosign(alice, pending, "ok"), http.StatusUnprocessableEntity, "justification-required")
	r = cosign(alice, pending, "confirmed with oscar: corrupting orders, INC-77")
	if r.Status != http.StatusOK {
		t.Fatalf("co-sign: %d %s", r.Status, r.Body)
	}
	o := apptest.Decode[policy.Override](t, r)
	if o.State != policy.StateActive || o.Cosigner != "operator:alice" || o.Actor != "operator:oscar" || o.CosignJustification == "" {
		t.Fatalf("co-signed override %+v", o)
	}
	// Co-signing twice is a conflict, not a second application.
	wantProblem(t, cosign(f.Token(t, paulaReq), pending, "me too, I was on the call"), http.StatusConflict, "conflict")

	// Past the co-sign window the other pending attempt is expired.
	f.Clock.Advance(policy.DefaultCosignWindow + time.Second)
	wantProblem(t, cosign(oscar, late, "confirmed with alice on the INC-77 bridge"), http.StatusGone, "cosign-expired")
	r = f.Do(t, "GET", "/v1/overrides?state=expired", alice, "", "")
	if l := apptest.Decode[struct{ Items []policy.Override }](t, r); len(l.Items) != 1 || l.Items[0].ID.String() != late {
		t.Errorf("expired overrides: %s", r.Body)
	}

	// Both identities and both justifications are in the audit log.
	var found bool
	for _, ev := range overrideEvents(t, f.Stack) {
		if ev.Action == "override.cosign" && ev.Outcome == audit.Accepted {
			found = true
			after := string(ev.After)
			if ev.Actor != "operator:alice" || !strings.Contains(after, `"actor": "operator:oscar"`) ||
				!strings.Contains(after, just) || !strings.Contains(after, "confirmed with oscar") {
				t.Errorf("co-sign audit: %s %s", ev.Actor, after)
			}
		}
	}
	if !found {
		t.Error("no accepted override.cosign event")
	}
	verifyAudit(t, f.Stack)
}

// publish steps the evaluator and publisher until what is queued is
// published.
func (f *ofix) publish(t *testing.T) {
	t.Helper()
	f.SyncNow(t)
	f.Evaluator.EvaluateNow()
	f.Publisher.RunOnce()
	f.Clock.Advance(2 * time.Second)
	f.Publisher.RunOnce()
}

func (f *ofix) view(t *testing.T) assembler.View {
	t.Helper()
	r := f.Do(t, "GET", "/v1/resolve/web", f.Token(t, adminReq), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("resolve web: %d %s", r.Status, r.Body)
	}
	return apptest.Decode[assembler.View](t, r)
}

func endpointOf(t *testing.T, v assembler.View, id string) (assembler.Endpoint, bool) {
	t.Helper()
	for _, e := range v.Endpoints {
		if e.InstanceID.String() == id {
			return e, true
		}
	}
	return assembler.Endpoint{}, false
}

func (f *ofix) verdict(t *testing.T, id string) evaluator.InstanceVerdict {
	t.Helper()
	r := f.Do(t, "GET", "/v1/services/web/eligibility", f.Token(t, adminReq), "", "")
	for _, v := range apptest.Decode[evaluator.ServiceEligibility](t, r).Instances {
		if v.InstanceID.String() == id {
			return v
		}
	}
	t.Fatalf("no verdict for %s", id)
	return evaluator.InstanceVerdict{}
}

// TestOverrideShowsInViewsAndEligibility: an accepted override is in the
// next published view and in the eligibility endpoint with its reason;
// lifting it, or its expiry, restores the instance.
func TestOverrideShowsInViewsAndEligibility(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 4})
	az1 := f.zones["az1"]
	oscar := f.Token(t, oscarReq)
	f.publish(t)
	if e, ok := endpointOf(t, f.view(t), az1[0]); !ok || e.Weight == 0 || e.Override != nil {
		t.Fatalf("before: %+v %v", e, ok)
	}

	just := "leaking connections since the 14:00 deploy"
	r := f.override(t, oscar, az1[0], "mark_ineligible", just, 0)
	if r.Status != http.StatusCreated {
		t.Fatalf("override: %d %s", r.Status, r.Body)
	}
	o := apptest.Decode[policy.Override](t, r)
	f.publish(t)
	e, ok := endpointOf(t, f.view(t), az1[0])
	if !ok || e.Weight != 0 || e.State != "ineligible" || e.Override == nil || e.Override.ID != o.ID ||
		e.Override.Action != "mark_ineligible" || !strings.Contains(e.Override.Reason, just) {
		t.Fatalf("in the view after the override: %+v", e)
	}
	v := f.verdict(t, az1[0])
	if v.Override == nil || v.Override.ID != o.ID || !strings.Contains(strings.Join(v.Reasons, ";"), just) || v.State != "eligible" {
		t.Fatalf("eligibility after the override: %+v", v)
	}

	// Lifting restores it in the next view.
	r = f.Do(t, "DELETE", "/v1/overrides/"+o.ID.String(), oscar, "", "")
	if r.Status != http.StatusOK || apptest.Decode[policy.Override](t, r).State != policy.StateLifted {
		t.Fatalf("lift: %d %s", r.Status, r.Body)
	}
	wantProblem(t, f.Do(t, "DELETE", "/v1/overrides/"+o.ID.String(), oscar, "", ""), http.StatusConflict, "conflict")
	f.probeAll(t, "success")
	f.publish(t)
	if e, ok := endpointOf(t, f.view(t), az1[0]); !ok || e.Weight == 0 || e.Override != nil || e.State == "ineligible" {
		t.Fatalf("after lifting: %+v", e)
	}
	if v := f.verdict(t, az1[0]); v.Override != nil {
		t.Fatalf("eligibility after lifting: %+v", v)
	}

	// mark_eligible forces a failed instance in, until it expires.
	f.probe(t, "hard_failure", az1[1])
	r = f.override(t, oscar, az1[1], "mark_eligible", "the probe is wrong: firewall change CHG-7", 60)
	if r.Status != http.StatusCreated {
		t.Fatalf("mark_eligible: %d %s", r.Status, r.Body)
	}
	f.publish(t)
	if e, ok := endpointOf(t, f.view(t), az1[1]); !ok || e.Weight == 0 || e.State != "eligible" || e.Override == nil {
		t.Fatalf("forced in: %+v %v", e, ok)
	}
	// Expiry needs no sweep and no refresh: the evaluator drops it at its
	// time and the next view withdraws the instance.
	f.Clock.Advance(61 * time.Second)
	f.Evaluator.EvaluateNow()
	f.Publisher.RunOnce()
	f.Clock.Advance(2 * time.Second)
	f.Publisher.RunOnce()
	if e, ok := endpointOf(t, f.view(t), az1[1]); ok && (e.Weight > 0 || e.Override != nil) {
		t.Fatalf("after expiry: %+v", e)
	}
	r = f.Do(t, "GET", "/v1/overrides?instance_id="+az1[1], oscar, "", "")
	if l := apptest.Decode[struct{ Items []policy.Override }](t, r); len(l.Items) != 1 || l.Items[0].State != policy.StateExpired {
		t.Fatalf("listed after expiry: %s", r.Body)
	}
	// The sweep writes the expiry down and audits it.
	if n, err := f.Policy.Sweep(context.Background()); err != nil || n != 1 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	evs := overrideEvents(t, f.Stack)
	if last := evs[len(evs)-1]; last.Action != "override.expire" || last.Actor != "system:policy" {
		t.Errorf("last override event %s by %s", last.Action, last.Actor)
	}
	verifyAudit(t, f.Stack)
}

// TestOverrideListFiltersAndPages lists overrides by state, actor and
// instance, a page at a time, and refuses workloads.
func TestOverrideListFiltersAndPages(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 6})
	az1 := f.zones["az1"]
	oscar, alice := f.Token(t, oscarReq), f.Token(t, adminReq)
	just := "draining for the kernel patch rollout"
	for i, tok := range []string{oscar, alice, oscar} {
		if r := f.override(t, tok, az1[i], "mark_ineligible", just, 0); r.Status != http.StatusCreated {
			t.Fatalf("override %d: %d %s", i, r.Status, r.Body)
		}
	}
	list := func(q string) []policy.Override {
		r := f.Do(t, "GET", "/v1/overrides"+q, f.Token(t, veraReq), "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("list %s: %d %s", q, r.Status, r.Body)
		}
		return apptest.Decode[struct{ Items []policy.Override }](t, r).Items
	}
	if l := list("?actor=operator:oscar"); len(l) != 2 || l[0].InstanceID.String() != az1[2] {
		t.Errorf("by actor, newest first: %+v", l)
	}
	if l := list("?state=active&service=web"); len(l) != 3 {
		t.Errorf("active: %d", len(l))
	}
	if l := list("?state=lifted"); len(l) != 0 {
		t.Errorf("lifted: %d", len(l))
	}
	r := f.Do(t, "GET", "/v1/overrides?limit=2", oscar, "", "")
	page := apptest.Decode[struct {
		Items      []policy.Override
		NextCursor string `json:"next_cursor"`
	}](t, r)
	if len(page.Items) != 2 || page.NextCursor == "" {
		t.Fatalf("first page: %s", r.Body)
	}
	if l := list("?limit=2&cursor=" + page.NextCursor); len(l) != 1 || l[0].InstanceID.String() != az1[0] {
		t.Errorf("second page: %+v", l)
	}
	wantProblem(t, f.Do(t, "GET", "/v1/overrides?state=sleeping", oscar, "", ""), http.StatusUnprocessableEntity, "validation")
	wantProblem(t, f.Do(t, "GET", "/v1/overrides", f.Token(t, webReq), "", ""), http.StatusForbidden, "forbidden")
	wantProblem(t, f.Do(t, "GET", "/v1/overrides/not-a-uuid", oscar, "", ""), http.StatusNotFound, "not-found")
}

// TestPolicyWritesAreRateLimitedPerActor: contracts, grants and prober
// assignments share one limiter, each family its own quota.
func TestPolicyWritesAreRateLimitedPerActor(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{Policy: func(c *policy.Config) {
		c.WriteLimit = policy.Limit{Max: 2, Window: time.Minute}
	}})
	s.Seed(t)
	oscar, alice := s.Token(t, oscarReq), s.Token(t, adminReq)
	for i := range 2 {
		r := s.JSON(t, "PUT", "/v1/services/web/contract", oscar, `{"min_healthy_fraction":0.6}`)
		if r.Status != http.StatusOK || r.Header.Get("RateLimit-Remaining") != strconv.Itoa(1-i) {
			t.Fatalf("contract put %d: %d %v %s", i, r.Status, r.Header, r.Body)
		}
	}
	r := s.JSON(t, "PUT", "/v1/services/web/contract", oscar, `{"min_healthy_fraction":0.7}`)
	wantProblem(t, r, http.StatusTooManyRequests, "rate-limited")
	if r.Header.Get("Retry-After") == "" || r.Header.Get("RateLimit-Policy") != "2;w=60" {
		t.Errorf("429 headers: %v", r.Header)
	}
	// Nothing changed, the refusal is audited, other families and other
	// actors are not affected.
	if c := s.Do(t, "GET", "/v1/services/web/contract", oscar, "", ""); !strings.Contains(string(c.Body), `"min_healthy_fraction":0.6`) {
		t.Errorf("contract changed by a refused write: %s", c.Body)
	}
	evs, err := audit.List(context.Background(), db.New(s.Pool), audit.Filter{Action: "contract.put", Outcome: audit.Refused, Limit: 10})
	if err != nil || len(evs) != 1 || !strings.HasPrefix(evs[0].Reason, "rate_limit: ") {
		t.Errorf("audited refusals: %+v %v", evs, err)
	}
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", oscar, `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Errorf("grants after contracts are spent: %d %s", r.Status, r.Body)
	}
	if r := s.JSON(t, "PUT", "/v1/services/web/contract", alice, `{"min_healthy_fraction":0.7}`); r.Status != http.StatusOK {
		t.Errorf("another actor: %d %s", r.Status, r.Body)
	}
	s.Clock.Advance(time.Minute)
	if r := s.JSON(t, "PUT", "/v1/services/web/contract", oscar, `{"min_healthy_fraction":0.7}`); r.Status != http.StatusOK {
		t.Errorf("after the window: %d %s", r.Status, r.Body)
	}
	verifyAudit(t, s)
}

// TestOverridesReachOtherReplicas: an override written through one muster
// is applied by another on the same database at its next refresh, and a
// lift on the second reaches the first.
func TestOverridesReachOtherReplicas(t *testing.T) {
	t.Parallel()
	a := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 4})
	b := &ofix{Stack: apptest.New(t, apptest.Options{Pool: a.Pool}), zones: a.zones}
	b.waitReady(t)
	id := a.zones["az1"][0]
	r := a.override(t, a.Token(t, oscarReq), id, "mark_ineligible", "draining for the disk replacement", 0)
	if r.Status != http.StatusCreated {
		t.Fatalf("override on a: %d %s", r.Status, r.Body)
	}
	o := apptest.Decode[policy.Override](t, r)
	if v := b.verdict(t, id); v.Override != nil {
		t.Fatalf("b knew before refreshing: %+v", v)
	}
	b.publish(t)
	if v := b.verdict(t, id); v.Override == nil || v.Override.ID != o.ID {
		t.Fatalf("b after its refresh: %+v", v)
	}
	if e, ok := endpointOf(t, b.view(t), id); !ok || e.Override == nil || e.Weight != 0 {
		t.Fatalf("b's view: %+v %v", e, ok)
	}
	if r := b.Do(t, "DELETE", "/v1/overrides/"+o.ID.String(), b.Token(t, adminReq), "", ""); r.Status != http.StatusOK {
		t.Fatalf("lift on b: %d %s", r.Status, r.Body)
	}
	a.publish(t)
	if v := a.verdict(t, id); v.Override != nil {
		t.Fatalf("a after the lift on b: %+v", v)
	}
	verifyAudit(t, a.Stack)
}

// grepMetric returns the exposition lines of one metric.
func grepMetric(b []byte, name string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, name) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestOverridesInForceFollowTheTable: policy's copy of the overrides in
// force (policy.InForce), which the views are assembled from. The
// replica that admitted an override has it before answering (read your
// writes), names the service as changed, drops it when its time is up
// without waiting for the sweeper or a refresh, keeps what it has when
// PostgreSQL cannot be read, and a replica started afterwards publishes
// its first view with the override already applied.
func TestOverridesInForceFollowTheTable(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 4})
	inForce := f.App.InForce
	id := uuid.MustParse(f.zones["az1"][0])
	_, rev := inForce.ServicesChangedSince(0)

	r := f.override(t, f.Token(t, oscarReq), id.String(), "mark_ineligible", "draining for the disk replacement", 60)
	if r.Status != http.StatusCreated {
		t.Fatalf("override: %d %s", r.Status, r.Body)
	}
	o := apptest.Decode[policy.Override](t, r)
	// No SyncNow, no refresh: the admitting replica already has it.
	if got, ok := inForce.For(id, f.Clock.Now()); !ok || got.ID != o.ID {
		t.Fatalf("the admitting replica's copy right after 201: %+v %v", got, ok)
	}
	changed, rev2 := inForce.ServicesChangedSince(rev)
	if !slices.Equal(changed, []string{"web"}) || rev2 <= rev {
		t.Fatalf("changed since %d: %v at %d, want [web]", rev, changed, rev2)
	}
	if c := inForce.Counts()["web"]; c.Out != 1 || c.In != 0 {
		t.Fatalf("counts %+v", c)
	}

	// A replica started now publishes its first view with the override.
	b := &ofix{Stack: apptest.New(t, apptest.Options{Pool: f.Pool}), zones: f.zones}
	b.WaitReady(t)
	if err := b.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	b.Evaluator.EvaluateNow()
	b.Publisher.RunOnce()
	b.Clock.Advance(2 * time.Second)
	b.Publisher.RunOnce()
	if e, ok := endpointOf(t, b.view(t), id.String()); !ok || e.Override == nil || e.Override.ID != o.ID || e.Weight != 0 {
		t.Fatalf("a new replica's first view: %+v %v", e, ok)
	}

	// PostgreSQL cannot be read (a closed pool stands for it): the copy
	// stands, the override with it.
	ctx := context.Background()
	dead, err := pgxpool.New(ctx, f.Pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	isolated := policy.NewInForce(policy.InForceConfig{Pool: dead, Now: f.Clock.Now})
	if err := isolated.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	dead.Close()
	if err := isolated.Refresh(ctx); err == nil {
		t.Fatal("a refresh on a closed pool succeeded")
	}
	if got, ok := isolated.For(id, f.Clock.Now()); !ok || got.ID != o.ID || !isolated.Loaded() {
		t.Fatalf("after a failed refresh: %+v %v (loaded %v)", got, ok, isolated.Loaded())
	}

	// Its time is up: gone from the copy, the service named as changed,
	// before any refresh or sweep.
	f.Clock.Advance(61 * time.Second)
	changed, _ = inForce.ServicesChangedSince(rev2)
	if _, ok := inForce.For(id, f.Clock.Now()); ok || !slices.Equal(changed, []string{"web"}) {
		t.Fatalf("after expiry: in force %v, changed %v", ok, changed)
	}
	if _, ok := isolated.For(id, f.Clock.Now()); ok {
		t.Fatal("an expired override outlived its time in the isolated copy")
	}
}
