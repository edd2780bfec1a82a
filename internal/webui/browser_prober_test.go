package webui_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/musterhq/muster/internal/app/apptest"
)

// TestBrowserProberReachSparkline (issue 30): prober-1 reports on every
// one of web's 4 instances, then (after a minute) on only 2 of them; the
// prober history samples its reach each time (on the stack's clock), and
// the overview, in Chromium, draws prober-1's reach line with one vertex
// per sample at the sampled shares (1, then 0.5), states it in text, and
// labels the prober's state now.
func TestBrowserProberReachSparkline(t *testing.T) {
	chrome := chromiumPath(t)
	dir := artifactDir(t)
	e := newEstate(t, apptest.Options{}, map[string]int{"az1": 2, "az2": 2})
	hist := e.App.ProberHistory
	if err := hist.SampleNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	for range 12 { // a minute of reports on half of the targets
		e.Clock.Advance(5 * time.Second)
		e.probe(t, "success", e.zones["az1"]...)
	}
	if err := hist.SampleNow(t.Context()); err != nil {
		t.Fatal(err)
	}

	var values []string
	for _, s := range hist.Since(t.Context(), time.Time{}) {
		if s.Zone == "prober-1" {
			for _, x := range s.Samples {
				values = append(values, formatShare(x.Fraction()))
			}
		}
	}
	if len(values) != 2 || values[0] != "1" || values[1] == "1" {
		t.Fatalf("prober-1's reach sampled %v, want 1 then less (the test's premise)", values)
	}

	b := newChrome(t, chrome)
	do(t, b, "open the overview", chromedp.Navigate(e.URL+"/ui/"), chromedp.WaitVisible(chromedp.ID("user-vera")))
	do(t, b, "sign in as vera", chromedp.Click(chromedp.ID("user-vera")), chromedp.WaitVisible(chromedp.ID("prober-trends")))
	screenshot(t, b, dir, "overview-prober-reach")
	row := `#prober-trend-table tr[data-prober="prober-1"] `
	if got := run(t, b, "reach values", chromedp.AttributeValue(chromedp.CSS(row+`svg`), "data-values")).Value; got != strings.Join(values, " ") {
		t.Errorf("reach sparkline carries %q, the history %q", got, strings.Join(values, " "))
	}
	points := strings.Fields(run(t, b, "reach line", chromedp.AttributeValue(chromedp.CSS(row+`polyline`), "points")).Value)
	if len(points) != len(values) {
		t.Fatalf("the reach line has %d vertices, want %d", len(points), len(values))
	}
	if y := points[0][strings.Index(points[0], ",")+1:]; y != "1.0" {
		t.Errorf("the first vertex (every target reported on) is drawn at height %s, want the top (1.0)", y)
	}
	if text := run(t, b, "text", chromedp.Text(chromedp.CSS(row+`.spark-text`))); !strings.HasPrefix(text, "targets reported on: now ") || !strings.Contains(text, "high 100%") {
		t.Errorf("text equivalent %q", text)
	}
}

// formatShare is a share as the sparkline carries it.
func formatShare(f float64) string { return strconv.FormatFloat(f, 'g', 4, 64) }
