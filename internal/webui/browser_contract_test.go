package webui_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestBrowserContractPreviewSideBySide drives Chromium through checking a
// contract change before making it: oscar follows the service page's
// link to pay's contract, lowers the removal threshold to 5% (and the
// re-entry threshold under it), presses Preview, and reads the two
// contracts' outcomes side by side: the proposed one removes both
// instances that failed one report in ten, the one in force none. The
// form posts without script; screenshots of the form and the preview are
// written as artifacts.
func TestBrowserContractPreviewSideBySide(t *testing.T) {
	chrome := chromiumPath(t)
	dir := artifactDir(t)
	s := newUIStack(t)
	payWithEvidence(t, s)

	oscar := newChrome(t, chrome)
	do(t, oscar, "open the service page", chromedp.Navigate(s.URL+"/ui/services/pay"), chromedp.WaitVisible(chromedp.ID("user-oscar")))
	do(t, oscar, "sign in as oscar", chromedp.Click(chromedp.ID("user-oscar")), chromedp.WaitVisible(chromedp.ID("edit-contract")))
	// The link is followed by address: a click can land on a page that the
	// live update is replacing (TestContractPageCheckBeforeSave checks the
	// link itself).
	href := run(t, oscar, "the contract link", chromedp.AttributeValue(chromedp.ID("edit-contract"), "href")).Value
	if href != "/ui/services/pay/contract" {
		t.Fatalf("the service page links the contract as %q", href)
	}
	do(t, oscar, "open the contract", chromedp.Navigate(s.URL+href), chromedp.WaitVisible(chromedp.ID("contract-form")))
	screenshot(t, oscar, dir, "contract-1-form")
	do(t, oscar, "propose a hair-trigger removal threshold",
		chromedp.SetValue(chromedp.ID("f-removal_threshold"), "0.05"),
		chromedp.SetValue(chromedp.ID("f-reentry_threshold"), "0.01"),
		chromedp.Click(chromedp.ID("preview")),
		chromedp.WaitVisible(chromedp.ID("preview-result")))
	screenshot(t, oscar, dir, "contract-2-preview")
	verdict := run(t, oscar, "verdict", chromedp.Text(chromedp.ID("preview-verdict")))
	if !strings.Contains(verdict, "would have removed more instances than the one in force") {
		t.Errorf("the preview says %q", verdict)
	}
	removals := run(t, oscar, "removals", chromedp.Text(chromedp.CSS(`#preview-outcomes tr[data-row="removals"]`)))
	if f := strings.Fields(removals); len(f) < 3 || f[len(f)-2] != "0" || f[len(f)-1] != "2" {
		t.Errorf("removals row %q, want 0 in force and 2 proposed", removals)
	}
	rows := run(t, oscar, "count the instances judged apart", chromedp.Evaluate[int](`document.querySelectorAll("#preview-differences tbody tr").length`))
	if rows != 2 {
		t.Errorf("%d instances judged apart, want 2", rows)
	}
	typed := run(t, oscar, "the threshold typed", chromedp.Value(chromedp.ID("f-removal_threshold")))
	if typed != "0.05" {
		t.Errorf("after the preview the form holds %q, want what was typed", typed)
	}
}
