package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
)

// TestEvidenceSideDoors (issue 13): one ordinary token cannot remove
// capacity through evidence. web runs 3 instances in az1, each in
// rotation. A viewer's and an unrelated workload's passive hard failures
// are refused and audited; a sibling's self-report is refused; a prober
// failing its targets while each instance reports itself healthy removes
// none of them while their own reports and their callers say they are
// healthy (they are degraded, reason naming the prober) and is named
// in a prober_suspect alarm.
func TestEvidenceSideDoors(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	admin, oscar := s.Token(t, adminReq), s.Token(t, oscarReq)
	if r := s.JSON(t, "PUT", "/v1/services/other", admin, `{"owner":"search","capabilities":["passive"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create other: %d %s", r.Status, r.Body)
	}
	var ids []string
	for i := range 3 {
		r := s.JSON(t, "POST", "/v1/services/web/instances", oscar, fmt.Sprintf(`{"address":"10.0.0.%d","port":8080,"zone":"az1"}`, i+1))
		if r.Status != http.StatusCreated {
			t.Fatalf("register: %d %s", r.Status, r.Body)
		}
		ids = append(ids, apptest.Decode[registry.Instance](t, r).ID.String())
	}
	if r := s.JSON(t, "PUT", "/v1/probers/prober-az1/assignments", admin, `{"services":["web"]}`); r.Status != http.StatusOK {
		t.Fatalf("assign: %d %s", r.Status, r.Body)
	}
	s.Admit(t, ids...)

	post := func(tok string, items ...string) evaluator.Result {
		t.Helper()
		r := s.JSON(t, "POST", "/v1/reports", tok, `{"reports":[`+strings.Join(items, ",")+`]}`)
		if r.Status != http.StatusOK {
			t.Fatalf("POST /v1/reports: %d %s", r.Status, r.Body)
		}
		return apptest.Decode[evaluator.Result](t, r)
	}
	item := func(id, class, outcome string) string {
		return fmt.Sprintf(`{"instance_id":%q,"class":%q,"outcome":%q}`, id, class, outcome)
	}
	verdicts := func() map[string]evaluator.InstanceVerdict {
		t.Helper()
		r := s.Do(t, "GET", "/v1/services/web/eligibility", admin, "", "")
		out := map[string]evaluator.InstanceVerdict{}
		for _, v := range apptest.Decode[evaluator.ServiceEligibility](t, r).Instances {
			out[v.InstanceID.String()] = v
		}
		return out
	}
	inRotation := func(id string) bool { st := verdicts()[id].State; return st != "ineligible" }

	// The side doors, each refused.
	vera := s.Token(t, veraReq)
	if res := post(vera, item(ids[0], "passive", "hard_failure")); res.Accepted != 0 || res.Refused[0].Code != "wrong_identity_kind" {
		t.Fatalf("a viewer's passive hard failure: %+v", res)
	}
	stranger := s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "other"})
	if res := post(stranger, item(ids[0], "passive", "hard_failure")); res.Accepted != 0 || res.Refused[0].Code != "not_granted" {
		t.Fatalf("an unrelated workload's passive hard failure: %+v", res)
	}
	sibling := s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: []string{"10.0.0.2"}})
	if res := post(sibling, item(ids[0], "self", "hard_failure")); res.Accepted != 0 || res.Refused[0].Code != "not_own_instance" {
		t.Fatalf("a sibling's self-report: %+v", res)
	}
	s.Evaluator.EvaluateNow()
	if !inRotation(ids[0]) {
		t.Fatalf("web[0] left rotation through a side door: %+v", verdicts()[ids[0]])
	}
	// Each attempt is on the audit record, by who tried, summarised off
	// the request path within a tick (1 s) of the refusal.
	missing := func() []string {
		r := s.Do(t, "GET", "/v1/audit?action=evidence.report&outcome=refused&limit=50", admin, "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("audit: %d %s", r.Status, r.Body)
		}
		var page struct{ Items []audit.Event }
		if err := json.Unmarshal(r.Body, &page); err != nil {
			t.Fatal(err)
		}
		var out []string
		for actor, code := range map[string]string{"operator:vera": "wrong_identity_kind", "workload:other": "not_granted", "workload:web": "not_own_instance"} {
			found := false
			for _, e := range page.Items {
				if strings.HasPrefix(e.Actor, actor) && e.Outcome == audit.Refused && strings.Contains(e.Reason, code) && e.Target == ids[0] {
					found = true
				}
			}
			if !found {
				out = append(out, fmt.Sprintf("%s (%s) in %s", actor, code, r.Body))
			}
		}
		return out
	}
	wait.For(t, 10*time.Second, "a refused evidence.report summary by every flooding actor", func() bool {
		if m := missing(); len(m) > 0 {
			t.Logf("no summary yet by %v", m)
			return false
		}
		return true
	})

	// A prober failing every target while each instance says it is
	// healthy and its callers see it succeed: degraded, never removed;
	// the prober is suspect.
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", admin, `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Fatalf("grant api: %d %s", r.Status, r.Body)
	}
	caller := s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "api"})
	selves := make([]string, len(ids))
	for i := range ids {
		selves[i] = s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: []string{fmt.Sprintf("10.0.0.%d", i+1)}})
	}
	prober := s.Token(t, devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-az1"})
	degraded := map[string]bool{}
	for range 8 {
		s.Clock.Advance(time.Second)
		for i, id := range ids {
			if res := post(selves[i], item(id, "self", "success")); res.Accepted != 1 {
				t.Fatalf("web[%d]'s own report: %+v", i, res)
			}
		}
		var fails, calls []string
		for _, id := range ids {
			fails = append(fails, item(id, "probe", "failure"))
			calls = append(calls, fmt.Sprintf(`{"instance_id":%q,"class":"passive","successes":50,"failures":0}`, id))
		}
		if res := post(caller, calls...); res.Accepted != len(ids) {
			t.Fatalf("the caller's outcomes: %+v", res)
		}
		if res := post(prober, fails...); res.Accepted != len(ids) {
			t.Fatalf("the prober's reports: %+v", res)
		}
		s.Evaluator.EvaluateNow()
		for i, id := range ids {
			// In rotation throughout: degraded while the prober's
			// failures are contradicted, eligible once the prober is
			// suspect and its probes no longer count.
			switch v := verdicts()[id]; {
			case v.State == "degraded":
				degraded[id] = true
			case v.State == "eligible" && strings.Contains(strings.Join(v.Reasons, "; "), "ignored: suspect"):
			default:
				t.Fatalf("web[%d] under one prober's failures against healthy self and passive evidence: %s %v, want degraded, or eligible with the prober ignored as suspect",
					i, v.State, v.Reasons)
			}
		}
	}
	if len(degraded) != len(ids) {
		t.Errorf("%d of %d instances were degraded by the contradicted prober before it was found suspect, want all", len(degraded), len(ids))
	}
	v := verdicts()[ids[0]]
	if joined := strings.Join(v.Reasons, "; "); !strings.Contains(joined, "prober-az1") {
		t.Errorf("web[0]'s reasons do not name the prober: %q", joined)
	}
	r := s.Do(t, "GET", "/v1/alarms", admin, "", "")
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"prober_suspect"`) || !strings.Contains(string(r.Body), "prober-az1") {
		t.Fatalf("alarms: %d %s", r.Status, r.Body)
	}
}

// TestRefusedEvidenceSummaryIsRateBounded (issue 15): a workload probing
// another service's instances is on the audit record within a tick of its
// first refused report, as one refused evidence.report row per minute
// however many items it sends, found by GET /v1/audit?outcome=refused;
// the next minute's row carries the rest, so no refusal goes uncounted.
func TestRefusedEvidenceSummaryIsRateBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t)
	s.Seed(t)
	admin, oscar := s.Token(t, adminReq), s.Token(t, oscarReq)
	if r := s.JSON(t, "PUT", "/v1/services/other", admin, `{"owner":"search","capabilities":["passive"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create other: %d %s", r.Status, r.Body)
	}
	r := s.JSON(t, "POST", "/v1/services/web/instances", oscar, `{"address":"10.0.0.1","port":8080,"zone":"az1"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	id := apptest.Decode[registry.Instance](t, r).ID.String()
	s.Admit(t, id)
	stranger := s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "other"})
	items := make([]string, 1000)
	for i := range items {
		items[i] = fmt.Sprintf(`{"instance_id":%q,"class":"passive","outcome":"hard_failure"}`, id)
	}
	body := `{"reports":[` + strings.Join(items, ",") + `]}`
	flood := func(batches int) {
		t.Helper()
		for range batches {
			r := s.JSON(t, "POST", "/v1/reports", stranger, body)
			if res := apptest.Decode[evaluator.Result](t, r); r.Status != http.StatusOK || len(res.Refused) != len(items) {
				t.Fatalf("POST /v1/reports: %d %s", r.Status, r.Body)
			}
		}
	}
	summaries := func() (rows, refused int) {
		t.Helper()
		r := s.Do(t, "GET", "/v1/audit?outcome=refused&action=evidence.report&limit=50", admin, "", "")
		var page struct{ Items []audit.Event }
		if err := json.Unmarshal(r.Body, &page); r.Status != http.StatusOK || err != nil {
			t.Fatalf("audit: %d %s", r.Status, r.Body)
		}
		for _, e := range page.Items {
			if !strings.HasPrefix(e.Actor, "workload:other") {
				continue
			}
			var after struct {
				Total  int            `json:"refused_total"`
				ByCode map[string]int `json:"by_code"`
			}
			if err := json.Unmarshal(e.After, &after); err != nil || after.ByCode["not_granted"] != after.Total || e.Target != id {
				t.Fatalf("summary %s (target %s): %v", e.After, e.Target, err)
			}
			rows, refused = rows+1, refused+after.Total
		}
		return rows, refused
	}

	flood(10)
	wait.For(t, 10*time.Second, "one refused-evidence summary after the refusals", func() bool {
		n, _ := summaries()
		return n == 1
	})
	// More within the minute: still one row.
	flood(10)
	s.Refusals.RunOnce(ctx, false)
	if n, _ := summaries(); n != 1 {
		t.Fatalf("%d summaries within a minute, want 1", n)
	}
	// A minute on, the rest is written, in one more row.
	s.Clock.Advance(time.Minute)
	s.Refusals.RunOnce(ctx, false)
	if n, total := summaries(); n != 2 || total != 20*len(items) {
		t.Fatalf("after a minute: %d summaries counting %d refused items, want 2 counting %d", n, total, 20*len(items))
	}
}
