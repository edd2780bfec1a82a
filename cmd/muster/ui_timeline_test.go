package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/browsertest"
)

// The timeline's browser test: Debian's Chromium against a real `muster
// dev --demo`, as TestBrowserDemo runs it. The demo's stories give
// recommendations a flapping instance (many bands) and catalog a tripped
// guard in az2 (a trip mark); the test reads the transitions log and the
// guard log from the dev server's own database, and the instances from
// the public API, and checks the SVG draws exactly that. Screenshots of
// the plots go to $MUSTER_ARTIFACTS.

// devPool opens the dev server's database (its local cluster, adopted
// and left running for it).
func devPool(t *testing.T, dir string) *pgxpool.Pool {
	t.Helper()
	ctx := t.Context()
	c, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Adopted() {
		t.Fatal("expected to adopt the running dev cluster")
	}
	t.Cleanup(func() { _ = c.Stop() }) // leaves it running for the dev server
	pool, err := db.Open(ctx, c.URL("muster"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// expectedBands counts the bands each instance's row should have over
// [from, to): one for the state the window opens in, and one more for
// each transition in the window to a state other than the current one.
// Live instances without a transition in the window have one band.
func expectedBands(t *testing.T, pool *pgxpool.Pool, service string, live []string, from, to time.Time) map[string]int {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT instance_id::text, from_state, to_state, at FROM transitions
		WHERE service = $1 AND at >= $2 AND at < $3 ORDER BY at, id`, service, from, to)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want, state, since := map[string]int{}, map[string]string{}, map[string]time.Time{}
	for rows.Next() {
		var id, fromState, toState string
		var at time.Time
		if err := rows.Scan(&id, &fromState, &toState, &at); err != nil {
			t.Fatal(err)
		}
		if _, ok := state[id]; !ok {
			state[id], want[id], since[id] = fromState, 1, from
		}
		if toState == state[id] {
			continue
		}
		// A change at the very moment the current band began replaces
		// it (a band of no width is not drawn).
		if at.After(since[id]) {
			want[id]++
		}
		state[id], since[id] = toState, at
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range live {
		if want[id] == 0 {
			want[id] = 1
		}
	}
	return want
}

// guardTimes lists the guard trips (or clears) of service in [from, to),
// as RFC 3339 to the second, the way the page writes them.
func guardTimes(t *testing.T, pool *pgxpool.Pool, service, column string, from, to time.Time) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT `+column+` FROM guard_events
		WHERE service = $1 AND `+column+` >= $2 AND `+column+` < $3 ORDER BY 1`, service, from, to)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			t.Fatal(err)
		}
		out = append(out, at.UTC().Format(time.RFC3339))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// liveInstances returns service's instance ids from the public API.
func liveInstances(t *testing.T, base, tok, service string) []string {
	t.Helper()
	var ids []string
	for _, in := range serviceInstances(t, base, tok, service) {
		ids = append(ids, in.ID)
	}
	return ids
}

// drawnBands reads, per instance row of the SVG, how many bands it has,
// and fails on a band without its state, pattern or title.
const drawnBandsJS = `(() => {
	const out = {};
	for (const g of document.querySelectorAll('#timeline g.tl-row')) {
		const bands = g.querySelectorAll('rect.band');
		for (const b of bands) {
			if (!b.dataset.state || !(b.getAttribute('fill') || '').startsWith('url(#p-') || !b.querySelector('title')) {
				return {bad: b.outerHTML};
			}
		}
		out[g.dataset.instance] = bands.length;
	}
	return out;
})()`

// timeIntoReason matches a time run into the text after it, as the flap
// report's history lines once read: "(2026-12-02 05:28:59 UTC)failure rate".
var timeIntoReason = regexp.MustCompile(`UTC\)[\pL\d]`)

// drawnMarks lists the data-at of the SVG's marks matching sel.
func drawnMarks(b *tab, sel string) []string {
	b.t.Helper()
	out := get(b, "marks "+sel, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll(`+jsQuote(sel)+`), m => m.dataset.at)`))
	slices.Sort(out)
	return out
}

func jsQuote(s string) string {
	q, _ := json.Marshal(s)
	return string(q)
}

// shotTimeline writes a screenshot of the SVG alone.
func shotTimeline(b *tab, name string) {
	b.t.Helper()
	png := get(b, "screenshot of the timeline", chromedp.Screenshot(chromedp.CSS("#timeline")))
	if len(png) == 0 {
		b.t.Fatal("empty screenshot of the timeline")
	}
	if err := os.WriteFile(filepath.Join(b.dir, "timeline-"+name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// TestTimelineDrawsOneBandPerStateSpan opens the timelines of the demo's
// flapping recommendations and of catalog with its tripped guard, and
// checks each instance row has one band per state span of the
// transitions log, catalog's az2 row a trip mark at each recorded trip
// time, and the text equivalent one row per band and per mark. Then it
// does the same with JavaScript off, moving the window by its links.
func TestTimelineDrawsOneBandPerStateSpan(t *testing.T) {
	t.Parallel()
	chrome := browsertest.Chromium(t)
	shots := browsertest.Artifacts(t)
	dir := devDir(t)
	d := startDev(t, dir, "--demo")
	d.waitDemoReady(t)
	deadline := time.Now().Add(e2eDeadline)
	apiToken := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	waitQuarantined(t, d.url, apiToken, deadline)
	pool := devPool(t, dir)
	for {
		var trips int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM guard_events WHERE service = 'catalog' AND zone = 'az2'`).Scan(&trips); err != nil {
			t.Fatal(err)
		}
		if trips > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("catalog's az2 guard did not trip by the deadline")
		}
		time.Sleep(time.Second) // polling with a deadline
	}
	// A window ending 10 s ago: the evaluator and the guard log write
	// within a second or two, so the log up to it is complete and the
	// page and the database are read over the same, settled window.
	time.Sleep(10 * time.Second)
	end := time.Now().Add(-10 * time.Second).UTC().Truncate(time.Second)
	from := end.Add(-time.Hour)
	query := "?span=1h&end=" + end.Format(time.RFC3339)

	check := func(b *tab, service string) {
		t.Helper()
		b.open("/ui/services/"+service+"/timeline"+query, "#timeline")
		want := expectedBands(t, pool, service, liveInstances(t, d.url, apiToken, service), from, end)
		got := get(b, "bands per row", chromedp.Evaluate[map[string]any](drawnBandsJS))
		if bad, ok := got["bad"]; ok {
			t.Fatalf("%s: a band without its state, pattern or title: %v", service, bad)
		}
		total := 0
		for id, n := range want {
			if g, _ := got[id].(float64); int(g) != n {
				t.Errorf("%s: instance %s has %v bands, the transitions log says %d", service, id, got[id], n)
			}
			total += n
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d instance rows drawn, want %d", service, len(got), len(want))
		}
		if n := b.count("#timeline-bands tbody tr"); n != total {
			t.Errorf("%s: the text equivalent lists %d spans, the plot has %d", service, n, total)
		}
		if n, m := b.count("#timeline-events tbody tr"), b.count("#timeline path.mark"); n != m {
			t.Errorf("%s: the text equivalent lists %d events, the plot has %d marks", service, n, m)
		}
		for _, what := range []string{"trip", "clear"} {
			column := map[string]string{"trip": "tripped_at", "clear": "cleared_at"}[what]
			wantAt := guardTimes(t, pool, service, column, from, end)
			gotAt := drawnMarks(b, `#timeline path.mark-guard[data-what="`+what+`"]`)
			if !slices.Equal(wantAt, gotAt) {
				t.Errorf("%s: guard %s marks at %v, the guard log says %v", service, what, gotAt, wantAt)
			}
		}
	}

	alice := newTab(t, chrome, d.url, "alice", shots)
	alice.signIn("/ui/services/recommendations")
	alice.do("follow the service page's link", chromedp.Click(chromedp.ID("timeline-link")), chromedp.WaitVisible(chromedp.ID("timeline")))
	check(alice, "recommendations")
	shotTimeline(alice, "recommendations-1h")
	alice.shot("timeline-recommendations")
	if n := alice.count(`#timeline g.tl-row rect.band[data-state="ineligible"]`); n == 0 {
		t.Error("recommendations' timeline shows no ineligible span, though an instance is quarantined")
	}
	check(alice, "catalog")
	shotTimeline(alice, "catalog-1h")
	alice.shot("timeline-catalog")
	if n := alice.count(`#timeline g.tl-zone[data-zone="az2"] path.mark-guard[data-what="trip"]`); n == 0 {
		t.Error("catalog's timeline has no guard trip mark on zone az2")
	}
	if s := alice.text("#timeline-events"); !strings.Contains(s, "guard tripped") {
		t.Errorf("the events table does not say the guard tripped:\n%s", s)
	}
	// The flap report's history lines keep the time apart from the reason.
	alice.open("/ui/services/recommendations", "#flaps")
	if s := alice.text("#flaps ol.history"); s == "" || timeIntoReason.MatchString(s) {
		t.Errorf("a flap history line runs the time into the reason:\n%s", s)
	}

	// JavaScript off: the same page, drawn the same, and its links move
	// and zoom the window.
	vera := newTab(t, chrome, d.url, "vera", shots)
	vera.do("turn script off", chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
		return err
	}))
	vera.signIn("/ui/services/catalog/timeline" + query)
	check(vera, "catalog")
	vera.do("zoom out to 24 h", chromedp.Click(chromedp.CSS(`nav a[href*="span=24h"]`)), chromedp.WaitVisible(chromedp.ID("timeline")))
	loc := get(vera, "location", chromedp.Location())
	if !strings.Contains(loc, "span=24h") || !strings.Contains(loc, "end=") {
		t.Errorf("after zooming out with script off the page is %s", loc)
	}
	shotTimeline(vera, "catalog-24h-noscript")
	vera.do("go an hour earlier", chromedp.Navigate(d.url+"/ui/services/catalog/timeline"+query), chromedp.WaitVisible(chromedp.ID("earlier")),
		chromedp.Click(chromedp.ID("earlier")), chromedp.WaitVisible(chromedp.ID("timeline")))
	if s := vera.text("#timeline-window"); !strings.Contains(s, from.Add(-time.Hour).Format("2006-01-02 15:04:05 UTC")) {
		t.Errorf("an hour earlier, the window reads %q", s)
	}
	vera.do("ask for a window in the future", chromedp.Navigate(d.url+"/ui/services/catalog/timeline?span=1h&end=2999-01-01T00:00:00Z"),
		chromedp.WaitVisible(chromedp.ID("message")))
	if s := vera.text("main"); !strings.Contains(s, "in the future") {
		t.Errorf("a window in the future: %q", s)
	}
}
