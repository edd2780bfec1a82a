package webui_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
)

func (e *estate) instanceState(t *testing.T, id string) string {
	t.Helper()
	in, err := e.Registry.GetInstance(context.Background(), adminP, mustUUID(t, id))
	if err != nil {
		t.Fatal(err)
	}
	return in.State
}

func deregisterForm(justification string) url.Values {
	return url.Values{"justification": {justification}}
}

// TestDeregisterFormBudgetCosign: the service page offers operators (not
// viewers) a deregistration per instance; within budget it ends the
// instance, over budget it is refused with the numbers and waits for a
// co-signer, whose co-signature on the same page ends it; a refused
// justification comes back to fix. Everything goes through the audited
// policy path.
func TestDeregisterFormBudgetCosign(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string]int{"az1": 4, "az2": 1})
	az1 := e.zones["az1"]
	// az1[3] is failing: 3 of 4 in rotation.
	e.probe(t, "hard_failure", az1[3])

	vera := newBrowser(t, e.Stack)
	vera.signIn("vera")
	if p := vera.get("/ui/services/web"); strings.Contains(p.body, "Deregister…") || strings.Contains(p.body, "/deregister") {
		t.Error("the viewer is offered a deregistration")
	}
	r := vera.post("/ui/services/web/instances/"+az1[0]+"/deregister", deregisterForm("forged by a viewer, no less"))
	if r.status != http.StatusForbidden {
		t.Fatalf("viewer's forged deregistration: %d\n%s", r.status, r.body)
	}

	oscar := newBrowser(t, e.Stack)
	oscar.signIn("oscar")
	page := oscar.get("/ui/services/web")
	mustContain(t, "operator's service page", page.body, "Deregister…", "/ui/services/web/instances/"+az1[0]+"/deregister")

	// Cross-site: refused before the policy sees it.
	r = oscar.do("POST", "/ui/services/web/instances/"+az1[0]+"/deregister", deregisterForm("host is being decommissioned"),
		map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"})
	if r.status != http.StatusForbidden || e.instanceState(t, az1[0]) != registry.StateActive {
		t.Fatalf("cross-site deregistration: %d\n%s", r.status, r.body)
	}

	// A justification too short: said what is wrong, the form comes back.
	r = oscar.post("/ui/services/web/instances/"+az1[0]+"/deregister", deregisterForm("x"))
	if r.status != http.StatusUnprocessableEntity {
		t.Fatalf("short justification: %d\n%s", r.status, r.body)
	}
	mustContain(t, "justification refusal", r.body, "Refused: the justification", "too short")
	mustContain(t, "retry form", section(r.body, "retry"), "/ui/services/web/instances/"+az1[0]+"/deregister", `name="justification" value="x"`)

	// Within budget: 2 of 4 left, 2 required.
	r = oscar.post("/ui/services/web/instances/"+az1[0]+"/deregister", deregisterForm("host is being decommissioned, CHG-7"))
	if r.status != http.StatusOK {
		t.Fatalf("within budget: %d\n%s", r.status, r.body)
	}
	mustContain(t, "accepted", r.body, "Instance deregistered", `data-outcome="accepted"`, az1[0], "never routed to again")
	if st := e.instanceState(t, az1[0]); st != registry.StateDeregistered {
		t.Fatalf("after the form the instance is %s", st)
	}

	// Over budget: az1[1] would leave 1 of 3.
	r = oscar.post("/ui/services/web/instances/"+az1[1]+"/deregister", deregisterForm("same rack as the decommissioned host"))
	if r.status != http.StatusConflict {
		t.Fatalf("over budget: %d\n%s", r.status, r.body)
	}
	mustContain(t, "budget refusal", r.body, "Refused by the disruption budget",
		"Applied now, this deregistration would leave 1 of 3 eligible in zone az1; the contract requires 2", "waits for a co-signer",
		`id="cosign-by"`, `data-outcome="pending"`)
	if st := e.instanceState(t, az1[1]); st != registry.StateActive {
		t.Fatalf("refused, the instance is %s", st)
	}

	// otto sees it waiting and co-signs it.
	otto := newBrowser(t, e.Stack)
	otto.signIn("otto")
	page = otto.get("/ui/services/web")
	m := pendingRE.FindStringSubmatch(page.body)
	if m == nil {
		t.Fatalf("no pending co-sign on the service page:\n%s", page.body)
	}
	mustContain(t, "pending deregistration", section(page.body, "pending-cosigns"), "deregistration", az1[1], "operator:oscar",
		"same rack as the decommissioned host", "Co-sign and apply")
	row := section(page.body, "instances")
	row = row[strings.Index(row, `data-instance="`+az1[1]+`"`):]
	mustContain(t, "pending row", row[:strings.Index(row, "</tr>")], "deregistration: waiting for co-signer")
	r = otto.post("/ui/overrides/"+m[1]+"/cosign", url.Values{"justification": {"checked the rack plan with oscar"}, "service": {"web"}})
	if r.status != http.StatusOK {
		t.Fatalf("co-sign: %d\n%s", r.status, r.body)
	}
	mustContain(t, "co-sign result", r.body, "Deregistration co-signed and applied", "operator:oscar asked and you co-signed", "is deregistered")
	if st := e.instanceState(t, az1[1]); st != registry.StateDeregistered {
		t.Fatalf("co-signed, the instance is %s", st)
	}

	// Every attempt is in the audit log through the policy path.
	got := map[string]int{}
	for _, ev := range auditEvents(t, e.Stack, audit.Filter{Action: "instance.deregister"}) {
		got[ev.Actor+" "+string(ev.Outcome)]++
	}
	want := map[string]int{"operator:vera refused": 1, "operator:oscar refused": 2, "operator:oscar accepted": 1}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("audit %s: %d, want %d (all: %v)", k, got[k], n, got)
		}
	}
	list, err := e.Policy.List(context.Background(), adminP, policy.Filter{Service: "web", State: policy.StateApplied, Limit: 10})
	if err != nil || len(list) != 2 {
		t.Fatalf("applied deregistrations: %+v %v", list, err)
	}
}
