package webui_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/webui"
)

// TestBrowserServicePageUpdatesLive (issue 30): with script on, pay's
// service page, open in Chromium, shows an instance withdrawn by a hard
// failure within 5 s, without the page being navigated (well inside its
// 15 s refresh interval): its events stream said pay changed, and the
// script fetched the content again.
func TestBrowserServicePageUpdatesLive(t *testing.T) {
	chrome := chromiumPath(t)
	dir := artifactDir(t)
	s := newUIStack(t)
	ids, _ := s.SelfReportedPay(t, s.Token(t, apptest.Admin))

	b := newChrome(t, chrome)
	do(t, b, "open pay's page", chromedp.Navigate(s.URL+"/ui/services/pay"), chromedp.WaitVisible(chromedp.ID("user-vera")))
	do(t, b, "sign in as vera", chromedp.Click(chromedp.ID("user-vera")), chromedp.WaitVisible(chromedp.ID("instances")))
	row := `tr[data-instance="` + ids[0] + `"]`
	if before := run(t, b, "the row", chromedp.Text(chromedp.CSS(row))); strings.Contains(before, "ineligible") {
		t.Fatalf("the instance is ineligible before its failure: %q", before)
	}
	run(t, b, "mark the page", chromedp.Evaluate[bool](`window.notReloaded = true`))
	// The events stream is open once the page has loaded: a change now
	// reaches it.
	wait.For(t, 5*time.Second, "the page's events stream open", func() bool { return webui.EventStreams() > 0 })

	r := s.JSON(t, "GET", "/v1/services/pay/instances", s.Token(t, apptest.Admin), "")
	var addr string
	for _, in := range apptest.Decode[struct{ Items []registry.Instance }](t, r).Items {
		if in.ID.String() == ids[0] {
			addr = in.Address
		}
	}
	pay := s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "pay", Addresses: []string{addr}})
	if r := s.JSON(t, "POST", "/v1/reports", pay, fmt.Sprintf(`{"reports":[{"instance_id":%q,"class":"self","outcome":"hard_failure"}]}`, ids[0])); r.Status != http.StatusOK {
		t.Fatalf("hard failure: %d %s", r.Status, r.Body)
	}
	s.Evaluator.EvaluateNow()
	s.Publisher.RunOnce()

	deadline := time.Now().Add(5 * time.Second)
	for {
		text := run(t, b, "the row", chromedp.Text(chromedp.CSS(row)))
		if strings.Contains(text, "ineligible") {
			break
		}
		if time.Now().After(deadline) {
			screenshot(t, b, dir, "live-timeout")
			t.Fatalf("the page still shows %q 5 s after the withdrawal", text)
		}
		time.Sleep(100 * time.Millisecond) // polling with a deadline
	}
	screenshot(t, b, dir, "service-live-update")
	if !run(t, b, "not reloaded", chromedp.Evaluate[bool](`window.notReloaded === true`)) {
		t.Fatal("the page was navigated: the update was not live")
	}
}
