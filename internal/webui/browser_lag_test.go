package webui_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/lagstats"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
)

// watchEvents opens a watch of service and returns a function reading
// the next view or delta event's kind (skipping synced markers and
// heartbeats).
func watchEvents(t *testing.T, s *apptest.Stack, token, service string) func() string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/v1/watch?service="+service, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := s.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	if res.StatusCode != http.StatusOK {
		t.Fatalf("watch %s: %d", service, res.StatusCode)
	}
	sc := bufio.NewScanner(res.Body)
	return func() string {
		t.Helper()
		kind := ""
		for sc.Scan() {
			line := sc.Text()
			if line == "" && (kind == "view" || kind == "delta") {
				return kind
			}
			if line == "" {
				kind = ""
			}
			if k, ok := strings.CutPrefix(line, "event: "); ok {
				kind = k
			}
		}
		t.Fatalf("the watch of %s ended: %v", service, sc.Err())
		return ""
	}
}

// TestBrowserWithdrawalLagHistogramCountsEachChange (issue 30): two
// subscribers watch pay; one of pay's instances reports a hard failure
// and is withdrawn. The lag page, in Chromium, draws the publisher's
// withdrawal lag (one withdrawal) and the deliveries (the first view and
// the withdrawal, to each of the two subscribers: four) as bars whose
// counts are the recorder's, bucket by bucket, with the totals in text.
func TestBrowserWithdrawalLagHistogramCountsEachChange(t *testing.T) {
	chrome := chromiumPath(t)
	dir := artifactDir(t)
	s := newUIStack(t)
	payWithEvidence(t, s)
	admin := s.Token(t, apptest.Admin)
	next := []func() string{watchEvents(t, s, admin, "pay"), watchEvents(t, s, admin, "pay")}
	for i, n := range next {
		if k := n(); k != "view" {
			t.Fatalf("subscriber %d: first event %q, want the view", i, k)
		}
	}

	r := s.JSON(t, "GET", "/v1/services/pay/instances", admin, "")
	ins := apptest.Decode[struct{ Items []registry.Instance }](t, r).Items
	if len(ins) != 3 {
		t.Fatalf("pay has %d instances", len(ins))
	}
	pay := s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "pay", Addresses: []string{ins[0].Address}})
	if r := s.JSON(t, "POST", "/v1/reports", pay, fmt.Sprintf(`{"reports":[{"instance_id":%q,"class":"self","outcome":"hard_failure"}]}`, ins[0].ID)); r.Status != http.StatusOK {
		t.Fatalf("hard failure: %d %s", r.Status, r.Body)
	}
	s.Evaluator.EvaluateNow()
	s.Publisher.RunOnce()
	for i, n := range next {
		if k := n(); k != "delta" {
			t.Fatalf("subscriber %d: after the hard failure %q, want a delta", i, k)
		}
	}

	want := s.App.Lags.Of("pay")
	if want[lagstats.Published].Total != 1 {
		t.Fatalf("the publisher measured %d withdrawals, want 1 (the test's premise)", want[lagstats.Published].Total)
	}
	// A frame is counted once written and flushed: wait for the fourth.
	wait.For(t, 10*time.Second, "4 deliveries measured (2 frames to 2 subscribers)", func() bool {
		want = s.App.Lags.Of("pay")
		return want[lagstats.Delivered].Total >= 4
	})
	if n := want[lagstats.Delivered].Total; n != 4 {
		t.Fatalf("%d deliveries measured, want 4 (2 frames to 2 subscribers)", n)
	}

	b := newChrome(t, chrome)
	do(t, b, "open the service page", chromedp.Navigate(s.URL+"/ui/services/pay"), chromedp.WaitVisible(chromedp.ID("user-vera")))
	do(t, b, "sign in as vera", chromedp.Click(chromedp.ID("user-vera")), chromedp.WaitVisible(chromedp.ID("lag-link")))
	// Followed by address (a click can land on a page the live update is
	// replacing).
	href := run(t, b, "the lag link", chromedp.AttributeValue(chromedp.ID("lag-link"), "href")).Value
	if href != "/ui/services/pay/lag" {
		t.Fatalf("the service page links the lag page as %q", href)
	}
	do(t, b, "open the lag page", chromedp.Navigate(s.URL+href), chromedp.WaitVisible(chromedp.ID("lag-delivered")))
	screenshot(t, b, dir, "lag-histograms")
	for _, h := range want {
		sec := "#lag-" + h.Stage.String()
		total := run(t, b, "total", chromedp.AttributeValue(chromedp.CSS(sec), "data-total")).Value
		if total != strconv.FormatUint(h.Total, 10) {
			t.Errorf("%s: the page's total %s, the recorder's %d", h.Stage, total, h.Total)
		}
		if h.Total == 0 {
			continue // no xDS client here: drawn as nothing measured yet
		}
		counts := run(t, b, "bars", chromedp.Evaluate[[]string](fmt.Sprintf(`Array.from(document.querySelectorAll(%q)).map(r => r.getAttribute("data-count"))`, sec+" rect.hist-bar")))
		var wantCounts []string
		for _, c := range h.Counts {
			wantCounts = append(wantCounts, strconv.FormatUint(c, 10))
		}
		if strings.Join(counts, " ") != strings.Join(wantCounts, " ") {
			t.Errorf("%s: bars %v, the recorder's buckets %v", h.Stage, counts, wantCounts)
		}
		heights := run(t, b, "bar heights", chromedp.Evaluate[[]string](fmt.Sprintf(`Array.from(document.querySelectorAll(%q)).map(r => r.getAttribute("height"))`, sec+" rect.hist-bar")))
		for i, c := range h.Counts {
			if (c == 0) != (heights[i] == "0.0") {
				t.Errorf("%s bucket %d: count %d drawn %s high", h.Stage, i, c, heights[i])
			}
		}
	}
}
