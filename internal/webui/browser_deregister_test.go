package webui_test

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/browsertest"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
)

// TestBrowserDeregisterWithJustification drives Chromium through an
// operator's deregistration: oscar opens the service page, deregisters an
// instance from its row with a justification (within budget: it ends),
// then a second one, which the disruption budget refuses with the numbers
// and keeps for a co-signer; otto co-signs it on the service page and it
// ends too. Screenshots are written as artifacts.
func TestBrowserDeregisterWithJustification(t *testing.T) {
	chrome := chromiumPath(t)
	dir := artifactDir(t)
	e := newEstate(t, apptest.Options{}, map[string]int{"az1": 4, "az2": 2})
	az1 := e.zones["az1"]
	// az1[3] is failing: 3 of 4 in rotation, 2 required.
	e.probe(t, "hard_failure", az1[3])
	rowOf := func(id string) string { return `tr[data-instance="` + id + `"] details.deregister` }

	oscar := newChrome(t, chrome)
	do(t, oscar, "open the service page", chromedp.Navigate(e.URL+"/ui/services/web"), chromedp.WaitVisible(chromedp.ID("user-oscar")))
	do(t, oscar, "sign in as oscar", chromedp.Click(chromedp.ID("user-oscar")), chromedp.WaitVisible(chromedp.ID("instances")))
	do(t, oscar, "deregister az1[0]",
		browsertest.OpenDetails(rowOf(az1[0])),
		chromedp.SendKeys(chromedp.CSS(rowOf(az1[0])+` input[name="justification"]`), "host is being decommissioned, CHG-7"))
	screenshot(t, oscar, dir, "deregister-1-form")
	do(t, oscar, "submit", chromedp.Click(chromedp.CSS(rowOf(az1[0])+` button[type="submit"]`)), chromedp.WaitVisible(chromedp.ID("result")))
	done := run(t, oscar, "result", chromedp.Text(chromedp.ID("result")))
	screenshot(t, oscar, dir, "deregister-2-done")
	if !strings.Contains(done, "Instance deregistered") || !strings.Contains(done, az1[0]) {
		t.Errorf("after the deregistration:\n%s", done)
	}
	if in, err := e.Registry.GetInstance(context.Background(), adminP, mustUUID(t, az1[0])); err != nil || in.State != registry.StateDeregistered {
		t.Fatalf("the instance after the form: %+v %v", in, err)
	}
	// The evaluator learns of it on its next refresh; the page then no
	// longer lists it.
	if err := e.Evaluator.SyncNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	do(t, oscar, "back to the service page", chromedp.Click(chromedp.ID("back")), chromedp.WaitVisible(chromedp.ID("instances")))
	instances := run(t, oscar, "instances", chromedp.Text(chromedp.ID("instances")))
	if strings.Contains(instances, az1[0]) {
		t.Errorf("the deregistered instance is still listed:\n%s", instances)
	}

	// Over budget: 1 of 3 would be left.
	do(t, oscar, "deregister az1[1]",
		browsertest.OpenDetails(rowOf(az1[1])),
		chromedp.SendKeys(chromedp.CSS(rowOf(az1[1])+` input[name="justification"]`), "same rack as the decommissioned host"),
		chromedp.Click(chromedp.CSS(rowOf(az1[1])+` button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("result")))
	refusal := run(t, oscar, "refusal", chromedp.Text(chromedp.ID("result")))
	screenshot(t, oscar, dir, "deregister-3-budget-refusal")
	for _, want := range []string{"Refused by the disruption budget", "this deregistration would leave 1 of 3 eligible in zone az1; the contract requires 2", "waits for a co-signer"} {
		if !strings.Contains(refusal, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, refusal)
		}
	}
	pending, err := e.Policy.List(context.Background(), adminP, policy.Filter{Service: "web", State: policy.StatePending, Limit: 10})
	if err != nil || len(pending) != 1 || pending[0].Action != policy.Deregister {
		t.Fatalf("pending after the refusal: %+v %v", pending, err)
	}
	id := pending[0].ID.String()

	otto := newChrome(t, chrome)
	do(t, otto, "open the service page", chromedp.Navigate(e.URL+"/ui/services/web"), chromedp.WaitVisible(chromedp.ID("user-otto")))
	do(t, otto, "sign in as otto", chromedp.Click(chromedp.ID("user-otto")), chromedp.WaitVisible(chromedp.ID("pending-cosigns")))
	pend := `.pending[data-override="` + id + `"] `
	do(t, otto, "co-sign", chromedp.SendKeys(chromedp.CSS(pend+`input[name="justification"]`), "checked the rack plan with oscar"))
	screenshot(t, otto, dir, "deregister-4-cosign")
	do(t, otto, "submit", chromedp.Click(chromedp.CSS(pend+`button[type="submit"]`)), chromedp.WaitVisible(chromedp.ID("result")))
	cosigned := run(t, otto, "co-signed", chromedp.Text(chromedp.ID("result")))
	screenshot(t, otto, dir, "deregister-5-cosigned")
	if !strings.Contains(cosigned, "Deregistration co-signed and applied") {
		t.Errorf("after the co-sign:\n%s", cosigned)
	}
	if in, err := e.Registry.GetInstance(context.Background(), adminP, mustUUID(t, az1[1])); err != nil || in.State != registry.StateDeregistered {
		t.Fatalf("the instance after the co-sign: %+v %v", in, err)
	}
}
