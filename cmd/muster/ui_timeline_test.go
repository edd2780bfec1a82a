package main

import (
	"cmp"
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
	"github.com/musterhq/muster/internal/wait"
)

// The timeline's browser test: Debian's Chromium against a real `muster
// dev --demo`, the one TestDemo runs. The demo's stories give
// recommendations a flapping instance (many bands) and catalog a tripped
// guard in az2 (a trip mark); the test reads the transitions log and the
// guard log and the instances table from the dev server's own database,
// and checks the state-spans table and the SVG say exactly that.
// Screenshots of the plots go to $MUSTER_ARTIFACTS.

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

// spanRow is one state span: a row of the page's state-spans table, or
// one derived from the database.
type spanRow struct {
	Instance, State, Start, End string
}

// lifetime is an instance's registration and end (zero while live).
type lifetime struct{ registered, ended time.Time }

// lifetimes reads, from the instances table, the instances of service
// registered at some time in [from, to).
func lifetimes(t *testing.T, pool *pgxpool.Pool, service string, from, to time.Time) map[string]lifetime {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT id::text, created_at,
			CASE WHEN state = 'active' THEN NULL ELSE COALESCE(ended_at, updated_at) END
		FROM instances WHERE service = $1 AND created_at < $3
			AND (state = 'active' OR COALESCE(ended_at, updated_at) > $2)`, service, from, to)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]lifetime{}
	for rows.Next() {
		var id string
		var reg time.Time
		var end *time.Time
		if err := rows.Scan(&id, &reg, &end); err != nil {
			t.Fatal(err)
		}
		l := lifetime{registered: reg}
		if end != nil {
			l.ended = *end
		}
		out[id] = l
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// expectedSpans derives, from the instances and transitions tables alone,
// the state spans the page should list over [from, to): for each instance
// registered in the window, from its registration (or the window's
// start) to its end (or the window's end), opening in the to-state of its
// last transition before that (else the from-state of its first one), a
// new span at each transition to another state. An instance without any
// transition has one span whose state the log cannot tell ("?").
func expectedSpans(t *testing.T, pool *pgxpool.Pool, service string, from, to time.Time) []spanRow {
	t.Helper()
	lives := lifetimes(t, pool, service, from, to)
	rows, err := pool.Query(t.Context(), `SELECT instance_id::text, from_state, to_state, at FROM transitions
		WHERE service = $1 AND at < $2 ORDER BY instance_id, at, id`, service, to)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type tr struct {
		from, to string
		at       time.Time
	}
	log := map[string][]tr{}
	for rows.Next() {
		var id string
		var c tr
		if err := rows.Scan(&id, &c.from, &c.to, &c.at); err != nil {
			t.Fatal(err)
		}
		log[id] = append(log[id], c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// A second is the page's precision, the transitions table's finer.
	sec := func(at time.Time) string { return at.UTC().Format(time.RFC3339) }
	var out []spanRow
	for id, l := range lives {
		start, end := from, to
		if l.registered.After(start) {
			start = l.registered
		}
		if !l.ended.IsZero() && l.ended.Before(end) {
			end = l.ended
		}
		if !end.After(start) {
			continue
		}
		cs := log[id]
		state := "?"
		if len(cs) > 0 {
			state = cs[0].from
		}
		for _, c := range cs {
			if c.at.Before(start) {
				state = c.to
			}
		}
		since := start
		for _, c := range cs {
			if c.at.Before(start) || !c.at.Before(end) || c.to == state {
				continue
			}
			if c.at.After(since) {
				out = append(out, spanRow{id, state, sec(since), sec(c.at)})
			}
			state, since = c.to, c.at
		}
		out = append(out, spanRow{id, state, sec(since), sec(end)})
	}
	sortSpans(out)
	return out
}

// sortSpans orders spans by instance and start, keeping the order they
// came in for spans that start in one second (the page's precision): two
// transitions a moment apart give a span of no visible length before
// another span starting in the same second, and both lists give them in
// the order they happened.
func sortSpans(s []spanRow) {
	slices.SortStableFunc(s, func(a, b spanRow) int {
		return cmp.Or(cmp.Compare(a.Instance, b.Instance), cmp.Compare(a.Start, b.Start))
	})
}

// listedSpansJS reads the state-spans table, row by row.
const listedSpansJS = `Array.from(document.querySelectorAll('#timeline-bands tbody tr'), tr => {
	const times = tr.querySelectorAll('time');
	return {Instance: tr.dataset.instance, State: tr.dataset.state, Start: times[0].dateTime, End: times[1].dateTime,
		Why: tr.cells[5].innerText};
})`

// listedSpan is a row of the state-spans table as the page shows it.
type listedSpan struct {
	Instance, State, Start, End, Why string
}

// checkSpans checks the state-spans table lists exactly the spans the
// tables derive (a state the log cannot tell is not compared), and the
// plot has as many bands on each instance's row; it returns the rows.
func checkSpans(b *tab, pool *pgxpool.Pool, service string, from, to time.Time) []listedSpan {
	b.t.Helper()
	t := b.t
	want := expectedSpans(t, pool, service, from, to)
	listed := get(b, "the state-spans table", chromedp.Evaluate[[]listedSpan](listedSpansJS))
	got := make([]spanRow, len(listed))
	for i, l := range listed {
		got[i] = spanRow{l.Instance, l.State, l.Start, l.End}
	}
	sortSpans(got)
	for i := range want {
		if i < len(got) && want[i].State == "?" {
			want[i].State = got[i].State
		}
	}
	if !slices.Equal(want, got) {
		t.Errorf("%s over [%s, %s): the state-spans table does not match the transitions and instances tables\nwant %v\n got %v",
			service, from.Format(time.RFC3339), to.Format(time.RFC3339), want, got)
	}
	perRow := map[string]int{}
	for _, w := range want {
		perRow[w.Instance]++
	}
	drawn := get(b, "bands per row", chromedp.Evaluate[map[string]any](drawnBandsJS))
	if bad, ok := drawn["bad"]; ok {
		t.Fatalf("%s: a band without its state, pattern or title: %v", service, bad)
	}
	for id, n := range perRow {
		if g, _ := drawn[id].(float64); int(g) != n {
			t.Errorf("%s: instance %s has %v bands, the tables say %d", service, id, drawn[id], n)
		}
	}
	if len(drawn) != len(perRow) {
		t.Errorf("%s: %d instance rows drawn, want %d", service, len(drawn), len(perRow))
	}
	return listed
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

// timelineDemo (TestDemo) opens the one-hour timelines of
// the demo's flapping recommendations and of catalog with its tripped
// guard about a minute after the demo began, and checks the state-spans
// table agrees row by row with the instances and transitions tables,
// each instance row has one band per span and none before its
// registration, catalog's az2 row a trip mark at each recorded trip
// time, and the text equivalent one row per mark. Then it does the same
// with JavaScript off, moving the window by its links; checks the
// default span fits the young estate; and opens a 30 s window that
// begins after the flapping instance's first recovery, which must open
// in the state that recovery left.
func timelineDemo(t *testing.T, d *devServer, dir, apiToken string) {
	chrome := browsertest.Chromium(t)
	shots := browsertest.Artifacts(t)
	deadline := time.Now().Add(e2eDeadline)
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
		listed := checkSpans(b, pool, service, from, end)
		// The demo began within the hour: no instance existed at the
		// window's start, so no span may begin there or before its
		// instance's registration, and none says "before the window".
		lives := lifetimes(t, pool, service, from, end)
		for _, l := range listed {
			reg := lives[l.Instance].registered.UTC().Format(time.RFC3339)
			if l.Start < reg || l.Start == from.Format(time.RFC3339) || strings.Contains(l.Why, "before the window") {
				t.Errorf("%s: instance %s registered at %s has a span %s from %s (%q)", service, l.Instance, reg, l.State, l.Start, l.Why)
			}
		}
		if n := b.count("#timeline g.tl-row line.absent"); n < len(lives) {
			t.Errorf("%s: %d not-registered lines for %d instances registered inside the window", service, n, len(lives))
		}
		if s := b.text("#timeline-activity"); !strings.Contains(s, "first instance drawn was registered at") {
			t.Errorf("%s: the page does not say where the activity begins: %q", service, s)
		}
		if n := b.count("#timeline-activity a#fit"); n != 1 {
			t.Errorf("%s: the page offers no shorter span that holds the activity", service)
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
	if n, s := vera.count("#timeline g.tl-row"), vera.text("#timeline-activity"); n != 0 || !strings.Contains(s, "No instance of catalog was registered in this window") {
		t.Errorf("an hour before the demo began: %d instance rows, and the page says %q", n, s)
	}
	vera.do("ask for a window in the future", chromedp.Navigate(d.url+"/ui/services/catalog/timeline?span=1h&end=2999-01-01T00:00:00Z"),
		chromedp.WaitVisible(chromedp.ID("message")))
	if s := vera.text("main"); !strings.Contains(s, "in the future") {
		t.Errorf("a window in the future: %q", s)
	}
	vera.close()

	// Without ?span= the span fits the service's activity: the demo is
	// minutes old, so the page picks a span shorter than an hour whose
	// window still reaches back to the first registration.
	alice.open("/ui/services/recommendations/timeline", "#timeline")
	var first time.Time
	if err := pool.QueryRow(t.Context(), `SELECT min(created_at) FROM instances WHERE service = 'recommendations'`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	chosen := alice.text(`nav[aria-label="timeline window"] a[aria-current="true"]`)
	opens, err := time.Parse(time.RFC3339, get(alice, "the window's start", chromedp.Evaluate[string](`document.querySelector('#timeline-window time').dateTime`)))
	if err != nil {
		t.Fatal(err)
	}
	if chosen == "" || chosen == "last 1h" || opens.After(first) {
		t.Errorf("the default window (%q) opens at %s; the first registration was at %s", chosen, opens, first)
	}
	shotTimeline(alice, "recommendations-default")

	// A later window, chosen by its query parameters: the flapping
	// instance was registered, made ineligible and recovered before it
	// starts, so its row opens in the state the recovery left it in, with
	// the recovery's time, not in the state of the log's next transition
	// nor of the verdict now (it is quarantined by then).
	id, recovered, next := flapRecovery(t, pool)
	start := recovered.UTC().Truncate(time.Second).Add(time.Second)
	if next != nil && !next.After(start) {
		t.Fatalf("the flapping instance's next transition at %s leaves no whole second after its recovery at %s", next, recovered)
	}
	laterEnd := start.Add(30 * time.Second)
	wait.For(t, time.Minute, "the later window to have passed and settled", func() bool { return time.Since(laterEnd) > 10*time.Second })
	alice.open("/ui/services/recommendations/timeline?span=30s&end="+laterEnd.Format(time.RFC3339), "#timeline")
	listed := checkSpans(alice, pool, "recommendations", start, laterEnd)
	shotTimeline(alice, "recommendations-after-recovery")
	var opened *listedSpan
	for i, l := range listed {
		if l.Instance == id && l.Start == start.Format(time.RFC3339) {
			opened = &listed[i]
		}
	}
	switch {
	case opened == nil:
		t.Errorf("the flapping instance %s has no span from the window's start %s: %v", id, start, listed)
	case opened.State != "eligible" || !strings.Contains(opened.Why, "before the window, at "+recovered.UTC().Format("2006-01-02 15:04:05 UTC")):
		t.Errorf("the flapping instance opens the window after its recovery at %s as %s (%q)", recovered, opened.State, opened.Why)
	}
	if n := alice.count(`#timeline g.tl-row[data-instance="` + id + `"] rect.band[data-state="eligible"][data-start="` + start.Format(time.RFC3339) + `"]`); n != 1 {
		t.Errorf("the plot draws %d eligible bands from the window's start on the flapping instance's row", n)
	}
}

// flapRecovery finds in the transitions table the demo's flapping
// recommendations instance's first recovery after it was made
// ineligible: the instance, the recovery's time and the time of its next
// transition (nil if none yet).
func flapRecovery(t *testing.T, pool *pgxpool.Pool) (id string, at time.Time, next *time.Time) {
	t.Helper()
	err := pool.QueryRow(t.Context(), `SELECT r.instance_id::text, r.at,
			(SELECT min(n.at) FROM transitions n WHERE n.instance_id = r.instance_id AND n.at > r.at)
		FROM transitions r
		WHERE r.service = 'recommendations' AND r.from_state = 'ineligible' AND r.to_state = 'eligible'
		  AND EXISTS (SELECT 1 FROM transitions p WHERE p.instance_id = r.instance_id AND p.at < r.at
		              AND p.from_state = 'eligible' AND p.to_state = 'ineligible')
		ORDER BY r.at LIMIT 1`).Scan(&id, &at, &next)
	if err != nil {
		t.Fatalf("the flapping instance's recovery: %v", err)
	}
	return id, at, next
}
