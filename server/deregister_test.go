package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
)

// deregister sends DELETE /v1/instances/{id}, with {"justification": j}
// when j is not empty and no body otherwise.
func (f *ofix) deregister(t *testing.T, tok, id, j string) apptest.Response {
	t.Helper()
	return f.deregisterWith(t, tok, id, j, nil)
}

// deregisterWith is deregister with header h (an instance credential).
func (f *ofix) deregisterWith(t *testing.T, tok, id, j string, h http.Header) apptest.Response {
	t.Helper()
	if j == "" {
		return f.DoWith(t, "DELETE", "/v1/instances/"+id, tok, "", "", h)
	}
	return f.DoWith(t, "DELETE", "/v1/instances/"+id, tok, "application/json", fmt.Sprintf(`{"justification":%q}`, j), h)
}

// deregisterEvents returns the instance.deregister audit events about id,
// oldest first.
func deregisterEvents(t *testing.T, s *apptest.Stack, id string) []audit.Event {
	t.Helper()
	evs, err := audit.List(context.Background(), db.New(s.Pool), audit.Filter{Action: "instance.deregister", Target: id, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for i, j := 0, len(evs)-1; i < j; i, j = i+1, j-1 {
		evs[i], evs[j] = evs[j], evs[i]
	}
	return evs
}

func (f *ofix) instanceState(t *testing.T, id string) string {
	t.Helper()
	r := f.Do(t, "GET", "/v1/instances/"+id, f.Token(t, adminReq), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("get instance %s: %d %s", id, r.Status, r.Body)
	}
	return apptest.Decode[registry.Instance](t, r).State
}

// setMinFraction sets web's minimum healthy fraction and lets the
// evaluator see it.
func (f *ofix) setMinFraction(t *testing.T, frac float64) {
	t.Helper()
	r := f.JSON(t, "PUT", "/v1/services/web/contract", f.Token(t, adminReq), fmt.Sprintf(`{"min_healthy_fraction":%g}`, frac))
	if r.Status != http.StatusOK && r.Status != http.StatusCreated {
		t.Fatalf("contract: %d %s", r.Status, r.Body)
	}
	if err := f.Evaluator.SyncNow(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestDeregisterBySiblingIsRefused: the side door of issue 13. A workload
// of web deregistering another instance of web is not that instance: it
// is refused (403, with or without a justification) and audited, a
// workload of another service is answered 404 (and audited), and the
// instance stays in the view.
func TestDeregisterBySiblingIsRefused(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 3})
	target := f.zones["az1"][0]
	web, api := f.Token(t, webReq), f.Token(t, apiReq)
	// The sibling is itself a registered instance of web (from 127.0.0.1):
	// being an instance of the service does not make it this one.
	if r := f.JSON(t, "POST", "/v1/services/web/instances", web, `{"address":"127.0.0.1","port":9000,"zone":"az1"}`); r.Status != http.StatusCreated {
		t.Fatalf("sibling registers: %d %s", r.Status, r.Body)
	}

	m := wantProblem(t, f.deregister(t, web, target, ""), http.StatusForbidden, "forbidden")
	if m["check"] != "authorization" || !strings.Contains(m["detail"].(string), "may deregister only its own instance") ||
		!strings.Contains(m["detail"].(string), "10.1.0.1:8080") {
		t.Errorf("sibling's refusal: %v", m)
	}
	// A justification does not make a workload an operator.
	wantProblem(t, f.deregister(t, web, target, "I think my sibling is broken"), http.StatusForbidden, "forbidden")
	// Another service's workload may not learn the instance exists.
	wantProblem(t, f.deregister(t, api, target, ""), http.StatusNotFound, "not-found")

	evs := deregisterEvents(t, f.Stack, target)
	if len(evs) != 3 {
		t.Fatalf("audit events: %+v", evs)
	}
	for i, ev := range evs {
		if ev.Outcome != audit.Refused {
			t.Errorf("event %d: outcome %s", i, ev.Outcome)
		}
		if d := decisionOf(t, ev); d.Check != "authorization" {
			t.Errorf("event %d: check %q", i, d.Check)
		}
	}
	if evs[0].Actor != "workload:web/web" || !strings.Contains(evs[0].Reason, "request came from 127.0.0.1") {
		t.Errorf("sibling's audit event: %s %s", evs[0].Actor, evs[0].Reason)
	}
	if evs[2].Actor != "workload:api/api" || !strings.Contains(evs[2].Reason, "answered as not found") {
		t.Errorf("other service's audit event: %s %s", evs[2].Actor, evs[2].Reason)
	}

	if st := f.instanceState(t, target); st != registry.StateActive {
		t.Fatalf("the instance is %s after refused deregistrations", st)
	}
	f.publish(t)
	if e, ok := endpointOf(t, f.view(t), target); !ok || e.Weight == 0 {
		t.Fatalf("the instance left the view: %+v %v", e, ok)
	}
	verifyAudit(t, f.Stack)
}

// TestDeregisterByOperatorIsAnOverride: the owning team's operator
// deregisters through the override checks in their order: no
// justification is 422, over budget (2 of 3 in rotation in az1, minimum
// 0.6) is 409 with the numbers and kept for a co-signer, whose co-sign
// deregisters it; within budget it is 200 at once; an instance out of
// rotation or awaiting its first success spends nothing; the attempts
// count toward the operator's override quota. Every attempt is audited.
func TestDeregisterByOperatorIsAnOverride(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 3, "az2": 3})
	f.setMinFraction(t, 0.6)
	az1, az2 := f.zones["az1"], f.zones["az2"]
	f.probe(t, "hard_failure", az1[2])
	oscar, paula := f.Token(t, oscarReq), f.Token(t, paulaReq)
	just := "host fails ECC checks, replacing it: CHG-7"

	// No justification: refused before the budget is looked at.
	r := f.deregister(t, oscar, az1[0], "")
	m := wantProblem(t, r, http.StatusUnprocessableEntity, "justification-required")
	if m["check"] != "justification" || r.Header.Get("RateLimit-Remaining") != "4" {
		t.Errorf("no justification: %v, RateLimit-Remaining %q", m, r.Header.Get("RateLimit-Remaining"))
	}
	wantProblem(t, f.deregister(t, oscar, az1[0], "x"), http.StatusUnprocessableEntity, "justification-required")

	// Over budget: 1 of 3 would be left in az1, 2 required.
	m = wantProblem(t, f.deregister(t, oscar, az1[0], just), http.StatusConflict, "budget-exceeded")
	if !strings.Contains(m["detail"].(string), "would leave 1 of 3 eligible in zone az1; the contract requires 2 (min_healthy_fraction 0.6)") {
		t.Errorf("budget detail: %v", m["detail"])
	}
	if m["zone"] != "az1" || m["zone_total"] != 3.0 || m["zone_eligible_before"] != 2.0 || m["zone_eligible_after"] != 1.0 ||
		m["zone_required"] != 2.0 || m["min_healthy_fraction"] != 0.6 || m["check"] != "budget" {
		t.Errorf("budget figures: %v", m)
	}
	pending, _ := m["override_id"].(string)
	if pending == "" || m["cosign_url"] != "/v1/overrides/"+pending+"/cosign" {
		t.Fatalf("no co-sign offered: %v", m)
	}
	r = f.Do(t, "GET", "/v1/overrides/"+pending, oscar, "", "")
	o := apptest.Decode[policy.Override](t, r)
	if o.Action != policy.Deregister || o.State != policy.StatePending || o.Actor != "operator:oscar" || o.Justification != just ||
		o.CosignBy == nil || strings.Contains(string(r.Body), "expires_at") {
		t.Fatalf("pending deregistration: %s", r.Body)
	}
	if st := f.instanceState(t, az1[0]); st != registry.StateActive {
		t.Fatalf("refused by the budget, the instance is %s", st)
	}
	f.publish(t)
	if _, ok := endpointOf(t, f.view(t), az1[0]); !ok {
		t.Fatal("refused by the budget, the instance left the view")
	}

	// The asker cannot co-sign; a second operator of the team can, and
	// that deregisters the instance.
	cosign := func(tok, j string) apptest.Response {
		return f.JSON(t, "POST", "/v1/overrides/"+pending+"/cosign", tok, fmt.Sprintf(`{"justification":%q}`, j))
	}
	wantProblem(t, cosign(oscar, "yes, I really mean it"), http.StatusForbidden, "self-cosign")
	r = cosign(paula, "checked the ECC counters with oscar")
	if r.Status != http.StatusOK {
		t.Fatalf("co-sign: %d %s", r.Status, r.Body)
	}
	o = apptest.Decode[policy.Override](t, r)
	if o.State != policy.StateApplied || o.Cosigner != "operator:paula" || o.EndedAt == nil {
		t.Fatalf("co-signed deregistration: %s", r.Body)
	}
	if st := f.instanceState(t, az1[0]); st != registry.StateDeregistered {
		t.Fatalf("co-signed, the instance is %s", st)
	}
	f.publish(t)
	if _, ok := endpointOf(t, f.view(t), az1[0]); ok {
		t.Fatal("co-signed, the instance is still in the view")
	}
	// An applied deregistration is final.
	wantProblem(t, f.Do(t, "DELETE", "/v1/overrides/"+pending, paula, "", ""), http.StatusConflict, "conflict")

	// Out of rotation: az1[2] failed, so ending it spends no budget (even
	// with az1 below its minimum now).
	r = f.deregister(t, oscar, az1[2], just)
	if r.Status != http.StatusOK {
		t.Fatalf("ineligible instance: %d %s", r.Status, r.Body)
	}
	if o := apptest.Decode[policy.Override](t, r); o.Action != policy.Deregister || o.State != policy.StateApplied ||
		r.Header.Get("Content-Location") != "/v1/overrides/"+o.ID.String() {
		t.Errorf("ineligible instance's deregistration: %s %v", r.Body, r.Header)
	}

	// Within budget: 2 of 3 left in az2, 2 required.
	r = f.deregister(t, oscar, az2[0], just)
	if r.Status != http.StatusOK || f.instanceState(t, az2[0]) != registry.StateDeregistered {
		t.Fatalf("within budget: %d %s", r.Status, r.Body)
	}
	// The next one in az2 would leave 1 of 2: refused, although the
	// evaluator (not synced here) still holds az2[0]; the budget reads the
	// registry's states.
	wantProblem(t, f.deregister(t, paula, az2[1], just), http.StatusConflict, "budget-exceeded")

	// A new instance awaiting its first success is not capacity (alice
	// asks: oscar has one attempt left).
	fresh, err := f.Registry.Register(context.Background(), adminP, netip.Addr{}, "web", registry.Registration{Address: "10.2.0.9", Port: 8080, Zone: "az2"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Evaluator.SyncNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	r = f.deregister(t, f.Token(t, adminReq), fresh.ID.String(), just)
	if r.Status != http.StatusOK {
		t.Fatalf("awaiting instance: %d %s", r.Status, r.Body)
	}

	// Every attempt counted toward oscar's override quota (five in ten
	// minutes, per service, shared with overrides): his sixth attempt, an
	// override, is refused.
	r = f.override(t, oscar, az2[2], "mark_ineligible", just, 0)
	wantProblem(t, r, http.StatusTooManyRequests, "rate-limited")
	if r.Header.Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}

	// The audit log: each attempt with its deciding check; the budget
	// refusal with its figures; the co-sign with both identities.
	type want struct {
		outcome audit.Outcome
		check   string
	}
	checks := func(id string) []want {
		var out []want
		for _, ev := range deregisterEvents(t, f.Stack, id) {
			out = append(out, want{ev.Outcome, decisionOf(t, ev).Check})
		}
		return out
	}
	if got := checks(az1[0]); fmt.Sprint(got) != fmt.Sprint([]want{
		{audit.Refused, "justification"}, {audit.Refused, "justification"}, {audit.Refused, "budget"}}) {
		t.Errorf("az1[0] audit: %v", got)
	}
	for _, ev := range deregisterEvents(t, f.Stack, az1[0]) {
		if d := decisionOf(t, ev); d.Check == "budget" && (d.Figures["zone_eligible_after"] != 1.0 || d.Figures["zone_required"] != 2.0) {
			t.Errorf("budget refusal's audit figures: %v", d.Figures)
		}
	}
	if got := checks(az1[2]); fmt.Sprint(got) != fmt.Sprint([]want{{audit.Accepted, "budget"}}) {
		t.Errorf("az1[2] audit: %v", got)
	}
	for _, ev := range deregisterEvents(t, f.Stack, az1[2]) {
		var after struct {
			Figures  map[string]any    `json:"figures"`
			Instance registry.Instance `json:"instance"`
		}
		if err := json.Unmarshal(ev.After, &after); err != nil {
			t.Fatal(err)
		}
		if after.Figures["target_counted_eligible"] != false || after.Instance.State != registry.StateDeregistered {
			t.Errorf("accepted deregistration's audit: %s", ev.After)
		}
	}
	cosigned, err := audit.List(context.Background(), db.New(f.Pool), audit.Filter{Action: "override.cosign", Outcome: audit.Accepted, Target: az1[0], Limit: 10})
	if err != nil || len(cosigned) != 1 || cosigned[0].Actor != "operator:paula" ||
		!strings.Contains(cosigned[0].Reason, "deregistered") || !strings.Contains(string(cosigned[0].After), just) {
		t.Errorf("co-sign audit: %+v %v", cosigned, err)
	}
	verifyAudit(t, f.Stack)
}

// TestDeregisterSelfIsImmediate: an instance deregistering itself (from
// its registered address) is a graceful shutdown: 204 at once, even where
// an operator's deregistration of it is over budget, audited as it always
// was; the same workload identity is refused on a sibling.
func TestDeregisterSelfIsImmediate(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 2})
	web := f.Token(t, webReq)
	r := f.JSON(t, "POST", "/v1/services/web/instances", web, `{"address":"127.0.0.1","port":9000,"zone":"az3"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	self := apptest.Decode[registry.Instance](t, r).ID.String()
	f.Admit(t, self)

	// The only instance in rotation in az3: an operator may not remove it
	// alone.
	wantProblem(t, f.deregister(t, f.Token(t, oscarReq), self, "draining az3 for maintenance"), http.StatusConflict, "budget-exceeded")
	// The workload is not every instance of web.
	wantProblem(t, f.deregister(t, web, f.zones["az1"][0], ""), http.StatusForbidden, "forbidden")

	before := len(deregisterEvents(t, f.Stack, self))
	r = f.deregisterWith(t, web, self, "", f.AsInstance(self))
	if r.Status != http.StatusNoContent || len(r.Body) != 0 {
		t.Fatalf("self-deregistration: %d %s", r.Status, r.Body)
	}
	if st := f.instanceState(t, self); st != registry.StateDeregistered {
		t.Fatalf("after its own deregistration the instance is %s", st)
	}
	evs := deregisterEvents(t, f.Stack, self)
	if len(evs) != before+1 {
		t.Fatalf("audit events: %+v", evs)
	}
	ev := evs[len(evs)-1]
	var was, is registry.Instance
	if err := json.Unmarshal(ev.Before, &was); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(ev.After, &is); err != nil {
		t.Fatal(err)
	}
	if ev.Outcome != audit.Accepted || ev.Actor != "workload:web/web" || was.State != registry.StateActive || is.State != registry.StateDeregistered {
		t.Errorf("self-deregistration audit: %+v", ev)
	}
	// Idempotent, and the repeat is not audited.
	if r := f.deregisterWith(t, web, self, "", f.AsInstance(self)); r.Status != http.StatusNoContent {
		t.Fatalf("repeat: %d %s", r.Status, r.Body)
	}
	if n := len(deregisterEvents(t, f.Stack, self)); n != before+1 {
		t.Errorf("the repeat was audited: %d events", n)
	}
	f.publish(t)
	if _, ok := endpointOf(t, f.view(t), self); ok {
		t.Error("the deregistered instance is still in the view")
	}
	verifyAudit(t, f.Stack)
}

// TestDeregisterNeverTheLastInstance: the last instance in rotation in
// the region is not removed by an operator, not even for a co-signer.
func TestDeregisterNeverTheLastInstance(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 1})
	id := f.zones["az1"][0]
	m := wantProblem(t, f.deregister(t, f.Token(t, oscarReq), id, "decommissioning the last host"), http.StatusConflict, "last-instance")
	if m["override_id"] != nil || m["region_eligible_after"] != 0.0 {
		t.Errorf("last-instance refusal: %v", m)
	}
	r := f.Do(t, "GET", "/v1/overrides?instance_id="+id, f.Token(t, adminReq), "", "")
	if l := apptest.Decode[struct{ Items []policy.Override }](t, r); len(l.Items) != 0 {
		t.Errorf("a last-instance refusal was kept: %s", r.Body)
	}
	if st := f.instanceState(t, id); st != registry.StateActive {
		t.Fatalf("the last instance is %s", st)
	}
	if evs := deregisterEvents(t, f.Stack, id); len(evs) != 1 || decisionOf(t, evs[0]).Check != "last_instance" {
		t.Errorf("audit: %+v", evs)
	}
}

// TestConcurrentDeregistrationsCannotSpendTheSameHeadroom: two operators
// deregister two instances of az1 at once (3 in rotation, minimum 0.6).
// Either alone leaves 2 of 3; together they would leave 1. The decisions
// are serialised per service and the second reads the registry's state of
// the first's instance (the evaluator, not refreshed, still holds it), so
// exactly one goes through and the other waits for a co-signer.
func TestConcurrentDeregistrationsCannotSpendTheSameHeadroom(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 3, "az2": 1})
	f.setMinFraction(t, 0.6)
	az1 := f.zones["az1"]
	toks := []string{f.Token(t, oscarReq), f.Token(t, paulaReq)}
	statuses := make([]int, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			statuses[i] = f.deregister(t, toks[i], az1[i], "rack 7 is being emptied for repairs").Status
		})
	}
	wg.Wait()
	slices.Sort(statuses)
	if statuses[0] != http.StatusOK || statuses[1] != http.StatusConflict {
		t.Fatalf("statuses %v, want one 200 and one 409", statuses)
	}
	ended := 0
	for _, id := range az1[:2] {
		if f.instanceState(t, id) == registry.StateDeregistered {
			ended++
		}
	}
	if ended != 1 {
		t.Fatalf("%d of the two instances ended", ended)
	}
}
