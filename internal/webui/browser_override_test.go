package webui_test

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/browsertest"
	"github.com/musterhq/muster/internal/policy"
)

// TestBrowserOverrideRefusedCosignedLifted drives Chromium through the
// break-glass path: oscar opens the service page and asks to mark an
// instance ineligible, the disruption budget refuses with the numbers and
// the attempt waits for a co-signer; otto, a second operator of the team,
// co-signs it on the service page, and then lifts it after confirming.
// Screenshots of the service page, the refusal and the co-sign are written
// as artifacts.
func TestBrowserOverrideRefusedCosignedLifted(t *testing.T) {
	chrome := chromiumPath(t)
	dir := artifactDir(t)
	e := newEstate(t, apptest.Options{}, map[string]int{"az1": 4, "az2": 3})
	az1 := e.zones["az1"]
	// Two instances of az1 are already out for maintenance (by alice):
	// one more would leave 1 of 4, below the 2 the contract requires.
	for _, id := range az1[:2] {
		if _, err := e.Policy.Create(context.Background(), adminP, policy.Request{InstanceID: id, Action: policy.MarkIneligible,
			Justification: "kernel upgrade, one host at a time", ExpiresIn: 3600}); err != nil {
			t.Fatal(err)
		}
	}
	target := az1[2]
	row := `tr[data-instance="` + target + `"] `

	oscar := newChrome(t, chrome)
	do(t, oscar, "open the service page", chromedp.Navigate(e.URL+"/ui/services/web"), chromedp.WaitVisible(chromedp.ID("user-oscar")))
	do(t, oscar, "sign in as oscar", chromedp.Click(chromedp.ID("user-oscar")), chromedp.WaitVisible(chromedp.ID("instances")))
	screenshot(t, oscar, dir, "service-1-page")
	do(t, oscar, "ask for the override",
		browsertest.OpenDetails(row+"details.act:not(.deregister)"),
		chromedp.SendKeys(chromedp.CSS(row+`input[name="justification"]`), "connection resets from this host since 02:10"),
		chromedp.Click(chromedp.CSS(row+`button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("result")))
	refusal := run(t, oscar, "refusal", chromedp.Text(chromedp.ID("result")))
	screenshot(t, oscar, dir, "service-2-budget-refusal")
	for _, want := range []string{"Refused by the disruption budget", "would leave 1 of 4 eligible in zone az1; the contract requires 2", "waits for a co-signer"} {
		if !strings.Contains(refusal, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, refusal)
		}
	}
	pending, err := e.Policy.List(context.Background(), adminP, policy.Filter{Service: "web", State: policy.StatePending, Limit: 10})
	if err != nil || len(pending) != 1 {
		t.Fatalf("pending overrides after the refusal: %+v %v", pending, err)
	}
	id := pending[0].ID.String()

	otto := newChrome(t, chrome)
	do(t, otto, "open the service page", chromedp.Navigate(e.URL+"/ui/services/web"), chromedp.WaitVisible(chromedp.ID("user-otto")))
	do(t, otto, "sign in as otto", chromedp.Click(chromedp.ID("user-otto")), chromedp.WaitVisible(chromedp.ID("pending-cosigns")))
	waiting := run(t, otto, "pending", chromedp.Text(chromedp.ID("pending-cosigns")))
	if !strings.Contains(waiting, "operator:oscar") || !strings.Contains(waiting, "connection resets from this host") {
		t.Errorf("otto does not see oscar's attempt waiting:\n%s", waiting)
	}
	pend := `.pending[data-override="` + id + `"] `
	do(t, otto, "write the co-sign justification",
		chromedp.SendKeys(chromedp.CSS(pend+`input[name="justification"]`), "saw the same resets on the dashboard"))
	screenshot(t, otto, dir, "service-3-cosign")
	do(t, otto, "co-sign", chromedp.Click(chromedp.CSS(pend+`button[type="submit"]`)), chromedp.WaitVisible(chromedp.ID("result")))
	cosigned := run(t, otto, "co-signed", chromedp.Text(chromedp.ID("result")))
	screenshot(t, otto, dir, "service-4-cosigned")
	if !strings.Contains(cosigned, "co-signed and applied") || !strings.Contains(cosigned, "operator:oscar asked and you co-signed") {
		t.Errorf("after the co-sign:\n%s", cosigned)
	}

	do(t, otto, "back to the service page", chromedp.Click(chromedp.ID("back")), chromedp.WaitVisible(chromedp.ID("instances")))
	do(t, otto, "lift", chromedp.Click(chromedp.CSS(`.override[data-override="`+id+`"] a.lift`)), chromedp.WaitVisible(chromedp.ID("confirm-lift")))
	do(t, otto, "confirm", chromedp.Click(chromedp.ID("confirm-lift")), chromedp.WaitVisible(chromedp.ID("result")))
	lifted := run(t, otto, "lifted", chromedp.Text(chromedp.ID("result")))
	screenshot(t, otto, dir, "service-5-lifted")
	if !strings.Contains(lifted, "Override lifted") {
		t.Errorf("after the lift:\n%s", lifted)
	}
	if o, err := e.Policy.Get(context.Background(), adminP, pending[0].ID); err != nil || o.State != policy.StateLifted || o.Cosigner != "operator:otto" {
		t.Fatalf("the override after the lift: %+v %v", o, err)
	}
}
