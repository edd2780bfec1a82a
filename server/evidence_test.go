package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/app/apptest"
	"github.com/musterhq/muster/audit"
	"github.com/musterhq/muster/evaluator"
	"github.com/musterhq/muster/identity"
	"github.com/musterhq/muster/registry"
)

// TestEvidenceSideDoors (issue 13): one ordinary token cannot remove
// capacity through evidence. web runs 3 instances in az1, each in
// rotation. A viewer's and an unrelated workload's passive hard failures
// are refused and audited; a sibling's self-report is refused; a prober
// failing its targets while each instance reports itself healthy removes
// none of them (they are degraded, reason naming the prober) and is named
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
	stranger := s.Token(t, identity.TokenRequest{Kind: identity.KindWorkload, Service: "other"})
	if res := post(stranger, item(ids[0], "passive", "hard_failure")); res.Accepted != 0 || res.Refused[0].Code != "not_granted" {
		t.Fatalf("an unrelated workload's passive hard failure: %+v", res)
	}
	sibling := s.Token(t, identity.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: []string{"10.0.0.2"}})
	if res := post(sibling, item(ids[0], "self", "hard_failure")); res.Accepted != 0 || res.Refused[0].Code != "not_own_instance" {
		t.Fatalf("a sibling's self-report: %+v", res)
	}
	s.Evaluator.EvaluateNow()
	if !inRotation(ids[0]) {
		t.Fatalf("web[0] left rotation through a side door: %+v", verdicts()[ids[0]])
	}
	// Each attempt is on the audit record, by who tried.
	for actor, code := range map[string]string{"operator:vera": "wrong_identity_kind", "workload:other": "not_granted", "workload:web": "not_own_instance"} {
		r := s.Do(t, "GET", "/v1/audit?action=evidence.report&limit=50", admin, "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("audit: %d %s", r.Status, r.Body)
		}
		var page struct{ Items []audit.Event }
		if err := json.Unmarshal(r.Body, &page); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range page.Items {
			if strings.HasPrefix(e.Actor, actor) && e.Outcome == audit.Refused && strings.Contains(e.Reason, code) && e.Target == ids[0] {
				found = true
			}
		}
		if !found {
			t.Errorf("no refused evidence.report row by %s (%s) in %s", actor, code, r.Body)
		}
	}

	// A prober failing every target while each instance says it is
	// healthy: degraded, never removed; the prober is suspect.
	selves := make([]string, len(ids))
	for i := range ids {
		selves[i] = s.Token(t, identity.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: []string{fmt.Sprintf("10.0.0.%d", i+1)}})
	}
	prober := s.Token(t, identity.TokenRequest{Kind: identity.KindProber, Subject: "prober-az1"})
	for range 8 {
		s.Clock.Advance(time.Second)
		for i, id := range ids {
			if res := post(selves[i], item(id, "self", "success")); res.Accepted != 1 {
				t.Fatalf("web[%d]'s own report: %+v", i, res)
			}
		}
		var fails []string
		for _, id := range ids {
			fails = append(fails, item(id, "probe", "failure"))
		}
		if res := post(prober, fails...); res.Accepted != len(ids) {
			t.Fatalf("the prober's reports: %+v", res)
		}
		s.Evaluator.EvaluateNow()
		for i, id := range ids {
			if !inRotation(id) {
				t.Fatalf("web[%d] removed by one prober against its own healthy reports: %+v", i, verdicts()[id])
			}
		}
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
