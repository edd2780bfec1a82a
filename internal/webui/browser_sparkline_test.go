package webui_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserOverviewSparklinesFollowTheZones (issue 30): pay's three
// instances in az1 are eligible, then muster hears nothing about them for
// three minutes (silence is unknown, not dead), then hears them again. The
// zone history samples az1 at each step (on the stack's clock); the
// overview, in Chromium, draws az1's unknown-instances sparkline with
// one vertex per sample whose values are the samples' (0, 3, 0 with the
// line's top at 3), the eligible-fraction line at 100% throughout
// (unknown instances stay in rotation), and says the same in text; the
// overview also serves the sparklines with script off (plain SVG).
func TestBrowserOverviewSparklinesFollowTheZones(t *testing.T) {
	chrome := chromiumPath(t)
	dir := artifactDir(t)
	s := newUIStack(t)
	report := payWithEvidence(t, s)
	hist := s.App.ZoneHistory
	if err := hist.SampleNow(t.Context()); err != nil {
		t.Fatal(err)
	}

	// Three minutes of silence, evaluated each minute: pay's instances go
	// unknown.
	for range 3 {
		s.Clock.Advance(time.Minute)
		s.Evaluator.EvaluateNow()
		s.Publisher.RunOnce()
	}
	if err := hist.SampleNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Heard again, for half a minute.
	for range 3 {
		report()
		s.Clock.Advance(10 * time.Second)
		s.Evaluator.EvaluateNow()
		s.Publisher.RunOnce()
	}
	if err := hist.SampleNow(t.Context()); err != nil {
		t.Fatal(err)
	}

	series := hist.Since(t.Context(), time.Time{})
	var unknown, fraction []string
	for _, z := range series {
		if z.Zone != "az1" {
			continue
		}
		for _, x := range z.Samples {
			unknown = append(unknown, strconv.Itoa(x.Unknown))
			fraction = append(fraction, strconv.FormatFloat(x.Fraction(), 'g', 4, 64))
		}
	}
	if strings.Join(unknown, " ") != "0 3 0" {
		t.Fatalf("az1's unknown instances sampled %v, want 0 3 0 (the test's premise): %+v", unknown, series)
	}

	b := newChrome(t, chrome)
	do(t, b, "open the overview", chromedp.Navigate(s.URL+"/ui/"), chromedp.WaitVisible(chromedp.ID("user-vera")))
	do(t, b, "sign in as vera", chromedp.Click(chromedp.ID("user-vera")), chromedp.WaitVisible(chromedp.ID("zone-trends")))
	screenshot(t, b, dir, "overview-sparklines")
	row := `#zone-trend-table tr[data-zone="az1"] `
	got := run(t, b, "unknown values", chromedp.AttributeValue(chromedp.CSS(row+`.spark-unknown svg`), "data-values")).Value
	if got != strings.Join(unknown, " ") {
		t.Errorf("unknown sparkline carries %q, want %q", got, strings.Join(unknown, " "))
	}
	points := run(t, b, "unknown line", chromedp.AttributeValue(chromedp.CSS(row+`.spark-unknown polyline`), "points")).Value
	vertices := strings.Fields(points)
	if len(vertices) != len(unknown) {
		t.Fatalf("the unknown line has %d vertices, want one per sample (%d): %q", len(vertices), len(unknown), points)
	}
	// The middle vertex (3 unknown, the top) is drawn at the top; the
	// others on the baseline.
	ys := make([]string, len(vertices))
	for i, v := range vertices {
		ys[i] = v[strings.Index(v, ",")+1:]
	}
	if want := []string{"27.0", "1.0", "27.0"}; fmt.Sprint(ys) != fmt.Sprint(want) {
		t.Errorf("the unknown line's heights are %v, want %v", ys, want)
	}
	if got := run(t, b, "fraction values", chromedp.AttributeValue(chromedp.CSS(row+`.spark-fraction svg`), "data-values")).Value; got != strings.Join(fraction, " ") {
		t.Errorf("fraction sparkline carries %q, want %q", got, strings.Join(fraction, " "))
	}
	text := run(t, b, "text equivalent", chromedp.Text(chromedp.CSS(row+`.spark-unknown .spark-text`)))
	if text != "unknown instances: now 0, low 0, high 3" {
		t.Errorf("text equivalent %q", text)
	}
}
