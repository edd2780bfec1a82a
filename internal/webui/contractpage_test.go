package webui_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/evaluator"
)

// payWithEvidence is apptest's SelfReportedPay, registered by an admin.
func payWithEvidence(t *testing.T, s *apptest.Stack) (report func()) {
	t.Helper()
	_, report = s.SelfReportedPay(t, s.Token(t, apptest.Admin))
	return report
}

// contractForm is the contract page's form as the browser posts it, with
// overrides.
func contractForm(version string, set map[string]string) url.Values {
	f := url.Values{"version": {version}}
	for k, v := range map[string]string{
		"removal_threshold": "0.5", "reentry_threshold": "0.2", "min_dwell_seconds": "30", "min_healthy_fraction": "0.5",
		"half_life_seconds": "4", "interval_seconds": "5", "slow_start_seconds": "60", "passive_primary_rps": "5", "min_passive_reporters": "2",
	} {
		f.Set(k, v)
	}
	for k, v := range set {
		f.Set(k, v)
	}
	return f
}

// TestContractPageCheckBeforeSave (issue 30): oscar (payments operator)
// opens pay's contract from the service page, previews a hair-trigger
// removal threshold and sees it would have removed more instances than
// the contract in force, with the instances it judges apart; the preview
// changes nothing (the stored contract, the verdicts). A number that
// does not parse is refused with nothing asked of the registry; vera (a
// viewer) cannot preview (403, audited); a save with the version read
// stores the contract, and one with a stale version is refused.
func TestContractPageCheckBeforeSave(t *testing.T) {
	t.Parallel()
	s := newUIStack(t)
	payWithEvidence(t, s)
	admin := s.Token(t, apptest.Admin)
	eligibility := func() string {
		r := s.Do(t, "GET", "/v1/services/pay/eligibility", admin, "", "")
		el := apptest.Decode[evaluator.ServiceEligibility](t, r)
		return fmt.Sprint(el.Counts)
	}
	before := eligibility()

	b := newBrowser(t, s)
	b.signIn("oscar")
	sp := b.get("/ui/services/pay")
	if !strings.Contains(sp.body, `id="edit-contract" href="/ui/services/pay/contract"`) {
		t.Fatalf("the service page does not link the contract page:\n%s", sp.body)
	}
	p := b.get("/ui/services/pay/contract")
	if p.status != http.StatusOK || !strings.Contains(p.body, `name="removal_threshold"`) || !strings.Contains(p.body, `id="preview"`) {
		t.Fatalf("contract page: %d\n%s", p.status, p.body)
	}

	res := b.post("/ui/services/pay/contract/preview", contractForm("0", map[string]string{"removal_threshold": "0.05", "reentry_threshold": "0.01"}))
	if res.status != http.StatusOK {
		t.Fatalf("preview: %d\n%s", res.status, res.body)
	}
	for _, want := range []string{
		"would have removed more instances than the one in force",
		`<tr data-row="removals"><th scope="row">Removals</th><td class="num">0</td><td class="num">2</td></tr>`,
		`id="preview-differences"`,
		`value="0.05"`, // what was typed stays in the form
	} {
		if !strings.Contains(res.body, want) {
			t.Errorf("the preview page lacks %q", want)
		}
	}
	if strings.Count(res.body, `<tr data-instance=`) != 2 {
		t.Errorf("the preview lists %d instances judged apart, want 2", strings.Count(res.body, `<tr data-instance=`))
	}
	if r := s.JSON(t, "GET", "/v1/services/pay/contract", admin, ""); !strings.Contains(string(r.Body), `"version":0`) {
		t.Fatalf("the preview stored a contract: %s", r.Body)
	}
	if got := eligibility(); got != before {
		t.Fatalf("the preview changed the verdicts: %s, were %s", got, before)
	}

	bad := b.post("/ui/services/pay/contract/preview", contractForm("0", map[string]string{"removal_threshold": "half"}))
	if bad.status != http.StatusUnprocessableEntity || !strings.Contains(bad.body, "Not a number: Removal threshold") {
		t.Fatalf("a threshold that is not a number: %d\n%s", bad.status, bad.body)
	}

	v := newBrowser(t, s)
	v.signIn("vera")
	if r := v.post("/ui/services/pay/contract/preview", contractForm("0", nil)); r.status != http.StatusForbidden {
		t.Fatalf("vera's preview: %d, want 403", r.status)
	}
	if n := len(auditEvents(t, s, audit.Filter{Action: "contract.preview", Outcome: audit.Refused})); n != 1 {
		t.Fatalf("%d refused contract.preview rows, want vera's", n)
	}

	saved := b.post("/ui/services/pay/contract", contractForm("0", map[string]string{"min_dwell_seconds": "45"}))
	if saved.status != http.StatusSeeOther {
		t.Fatalf("save: %d\n%s", saved.status, saved.body)
	}
	if r := s.JSON(t, "GET", "/v1/services/pay/contract", admin, ""); !strings.Contains(string(r.Body), `"min_dwell_seconds":45`) {
		t.Fatalf("after the save: %s", r.Body)
	}
	if done := b.get("/ui/services/pay/contract"); !strings.Contains(done.body, "Saved: the contract of pay is now version 1.") {
		t.Fatalf("no saved banner:\n%s", done.body)
	}
	stale := b.post("/ui/services/pay/contract", contractForm("0", map[string]string{"min_dwell_seconds": "60"}))
	if stale.status == http.StatusSeeOther || !strings.Contains(stale.body, "Not saved:") {
		t.Fatalf("a save with a stale version: %d\n%s", stale.status, stale.body)
	}
}
