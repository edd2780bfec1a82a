package webui

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/guardlog"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/views"
)

func TestTimelineWindow(t *testing.T) {
	now := time.Date(2026, 12, 3, 17, 0, 30, 500, time.UTC)
	for _, tc := range []struct {
		name, span, end string
		from, to        time.Time
		bad             bool
	}{
		{name: "default: the last hour", from: now.Truncate(time.Second).Add(-time.Hour), to: now.Truncate(time.Second)},
		{name: "24h", span: "24h", from: now.Truncate(time.Second).Add(-24 * time.Hour), to: now.Truncate(time.Second)},
		{name: "an end in the past", span: "1h", end: "2026-12-02T05:30:00Z",
			from: time.Date(2026, 12, 2, 4, 30, 0, 0, time.UTC), to: time.Date(2026, 12, 2, 5, 30, 0, 0, time.UTC)},
		{name: "an end with an offset", end: "2026-12-02T06:30:00+01:00",
			from: time.Date(2026, 12, 2, 4, 30, 0, 0, time.UTC), to: time.Date(2026, 12, 2, 5, 30, 0, 0, time.UTC)},
		{name: "a span of one's own", span: "90s", from: now.Truncate(time.Second).Add(-90 * time.Second), to: now.Truncate(time.Second)},
		{name: "another span", span: "7d", bad: true},
		{name: "too long a span", span: "25h", bad: true},
		{name: "too short a span", span: "10s", bad: true},
		{name: "a span not in whole seconds", span: "90.5s", bad: true},
		{name: "not a time", end: "yesterday", bad: true},
		{name: "in the future", end: "2026-12-03T18:00:00Z", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from, to, chosen, err := timelineWindow(tc.span, tc.end, now)
			var we errTimelineWindow
			if tc.bad {
				if !errors.As(err, &we) {
					t.Fatalf("err %v, want a window error", err)
				}
				return
			}
			if err != nil || !from.Equal(tc.from) || !to.Equal(tc.to) {
				t.Fatalf("[%s, %s) err %v, want [%s, %s)", from, to, err, tc.from, tc.to)
			}
			if chosen != (tc.span != "") {
				t.Errorf("chosen %v with span %q", chosen, tc.span)
			}
		})
	}
}

// band is a band's state and times, to compare.
type band struct {
	State      string
	Start, End time.Time
}

func bandsOf(r views.TimelineRow) []band {
	var out []band
	for _, b := range r.Bands {
		out = append(out, band{b.State, b.Start, b.End})
	}
	return out
}

func rowOf(t *testing.T, tl views.Timeline, key string) views.TimelineRow {
	t.Helper()
	for _, r := range append(tl.Zones, tl.Rows...) {
		if r.Key == key {
			return r
		}
	}
	t.Fatalf("no row %s", key)
	return views.TimelineRow{}
}

func TestLayoutTimeline(t *testing.T) {
	from := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	to := from.Add(time.Hour)
	at := func(min int) time.Time { return from.Add(time.Duration(min) * time.Minute) }
	flapper, steady, quiet, fresh, gone := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	cleared, endedAt := at(20), at(50)
	d := timelineData{
		From: from, To: to, Tick: 10 * time.Minute,
		Instances: []timelineInstance{
			{ID: flapper, Label: "10.0.0.1:80", Zone: "az1", State: "ineligible"},
			{ID: steady, Label: "10.0.0.2:80", Zone: "az1", State: "eligible"},
			{ID: quiet, Label: "10.0.0.3:80", Zone: "az2", State: "eligible"},
			{ID: fresh, Label: "10.0.0.4:80", Zone: "az2", State: "unknown"},
		},
		Changes: []evaluator.Change{
			{InstanceID: flapper, From: "eligible", To: "ineligible", At: from, Reason: "hard failure"}, // at the window's start
			{InstanceID: flapper, From: "ineligible", To: "eligible", At: at(10), Reason: "recovered"},
			{InstanceID: steady, From: "degraded", To: "degraded", Weight: 0.7, At: at(15), Reason: "weight"}, // no new state
			{InstanceID: flapper, From: "eligible", To: "ineligible", At: at(30), Reason: "failure rate"},
			{InstanceID: gone, From: "eligible", To: "ineligible", At: at(40), Reason: "lease expired"},
		},
		// quiet's last transition before the window left it ineligible;
		// its verdict now (eligible) is later than the window.
		StateAt: map[uuid.UUID]evaluator.StateAt{
			quiet:   {State: "ineligible", Before: true, At: at(-20), Reason: "failure rate"},
			steady:  {State: "degraded", Before: true, At: at(-30)},
			flapper: {State: "eligible", Before: true, At: at(-40)},
		},
		Guards: []guardlog.Episode{
			{Zone: "az2", TrippedAt: at(-30), ClearedAt: &cleared, Detail: "0 of 2"}, // began before the window
			{Zone: "az1", TrippedAt: at(45), Detail: "1 of 4"},                       // still open
			{Zone: "az1", TrippedAt: at(-90), ClearedAt: ptr(at(-80))},               // before the window
		},
		Overrides: []policy.Override{
			{InstanceID: steady, Action: "mark_ineligible", Actor: "operator:oscar", Justification: "CHG-1", State: "lifted", CreatedAt: at(5), EndedAt: &endedAt},
			{InstanceID: quiet, Action: "mark_eligible", Actor: "operator:oscar", CreatedAt: at(-5)}, // before the window
		},
		Shifts: []shift.Shift{
			{Target: "az2", State: "returning", StartedAt: at(2), LastStepAt: at(12), Step: 1, TrafficWeight: 0.25},
			{Target: "az9", State: "draining", StartedAt: at(3)}, // no instance of the service there
		},
	}
	var tl views.Timeline
	layoutTimeline(&tl, d)

	for _, tc := range []struct {
		name string
		key  string
		want []band
	}{
		{"a change at the window's start opens the first band; each change to another state one more", flapper.String(),
			[]band{{"ineligible", from, at(10)}, {"eligible", at(10), at(30)}, {"ineligible", at(30), to}}},
		{"a weight change keeps the band", steady.String(), []band{{"degraded", from, to}}},
		{"no transition in the window: the state from before it, as one band", quiet.String(), []band{{"ineligible", from, to}}},
		{"no transition at all: the verdict now", fresh.String(), []band{{"unknown", from, to}}},
		{"an instance no longer registered keeps its row", gone.String(), []band{{"eligible", from, at(40)}, {"ineligible", at(40), to}}},
		{"a trip from before the window is clipped at its start", "az2", []band{{"tripped", from, cleared}}},
		{"an open trip runs to the window's end", "az1", []band{{"tripped", at(45), to}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, bandsOf(rowOf(t, tl, tc.key))); diff != "" {
				t.Errorf("bands (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("bands fill the plot without gaps", func(t *testing.T) {
		for _, r := range tl.Rows {
			x := views.TimelineGutter
			for _, b := range r.Bands {
				if math.Abs(b.X-x) > 1e-9 || b.W <= 0 {
					t.Fatalf("row %s: band at %.3f width %.3f, want at %.3f", r.Label, b.X, b.W, x)
				}
				x += b.W
			}
			if math.Abs(x-(views.TimelineGutter+views.TimelinePlotWidth)) > 1e-9 {
				t.Errorf("row %s ends at %.3f", r.Label, x)
			}
		}
	})

	t.Run("marks", func(t *testing.T) {
		type mark struct {
			Kind, Where string
			At          time.Time
		}
		var got []mark
		for _, m := range tl.Events {
			got = append(got, mark{m.Kind, m.Where, m.At})
		}
		want := []mark{
			{"shift", "zone az2", at(2)},
			{"override", "10.0.0.2:80", at(5)},
			{"shift", "zone az2", at(12)},
			{"guard", "zone az2", at(20)},
			{"guard", "zone az1", at(45)},
			{"override", "10.0.0.2:80", at(50)},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
		m := rowOf(t, tl, "az1").Marks[0]
		if wantX := views.TimelineGutter + 0.75*views.TimelinePlotWidth; math.Abs(m.X-wantX) > 1e-9 || m.Y != rowOf(t, tl, "az1").Y {
			t.Errorf("az1's trip mark at (%.2f, %.2f), want x %.2f on its row", m.X, m.Y, wantX)
		}
	})

	t.Run("rows: zones first, then instances by zone and address", func(t *testing.T) {
		var got []string
		for _, r := range append(tl.Zones, tl.Rows...) {
			got = append(got, r.Label)
		}
		want := []string{"zone az1", "zone az2", "unlisted " + gone.String()[:8], "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("rows (-want +got):\n%s", diff)
		}
		if len(tl.Ticks) != 7 || tl.Ticks[0].Label != "05:00" || tl.Ticks[6].Label != "06:00" {
			t.Errorf("ticks %+v", tl.Ticks)
		}
	})

	t.Run("renders", func(t *testing.T) {
		var b strings.Builder
		if err := views.TimelinePage(tl).Render(t.Context(), &b); err != nil {
			t.Fatal(err)
		}
		html := b.String()
		for _, want := range []string{`class="band st-ineligible"`, `fill="url(#p-ineligible)"`, `data-what="trip"`, `<title>10.0.0.1:80: ineligible from `,
			`<td><time datetime="2026-12-02T05:45:00Z">2026-12-02 05:45:00 UTC</time></td>`} {
			if !strings.Contains(html, want) {
				t.Errorf("the page lacks %s", want)
			}
		}
		if n := strings.Count(html, `<rect class="band `); n != 10 {
			t.Errorf("%d bands drawn, want 10 (8 on instance rows, 2 guard trips)", n)
		}
	})
}

func ptr[T any](v T) *T { return &v }

// span is a band as lifeSpans computes it, to compare.
type span struct {
	State, Reason     string
	Start, End, Began time.Time
	Ended             string
}

func TestLifeSpans(t *testing.T) {
	from := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	to := from.Add(time.Hour)
	at := func(min int) time.Time { return from.Add(time.Duration(min) * time.Minute) }
	id := uuid.New()
	change := func(min int, fromState, toState, reason string) evaluator.Change {
		return evaluator.Change{InstanceID: id, From: fromState, To: toState, At: at(min), Reason: reason}
	}
	for _, tc := range []struct {
		name    string
		inst    timelineInstance
		changes []evaluator.Change
		at      evaluator.StateAt
		known   bool
		want    []span
	}{
		{
			name: "registered inside the window and admitted at once: one band from the registration",
			inst: timelineInstance{ID: id, State: "eligible", Registered: at(59)},
			changes: []evaluator.Change{
				change(59, "ineligible", "eligible", "first success: entering rotation"),
			},
			at: evaluator.StateAt{State: "ineligible", At: at(59)}, known: true,
			want: []span{
				{State: "eligible", Reason: "first success: entering rotation", Start: at(59), End: to, Began: at(59)},
			},
		},
		{
			name: "registered inside the window, admitted a little later",
			inst: timelineInstance{ID: id, State: "eligible", Registered: at(50)},
			changes: []evaluator.Change{
				change(51, "ineligible", "eligible", "first success: entering rotation"),
			},
			at: evaluator.StateAt{State: "ineligible", At: at(51)}, known: true,
			want: []span{
				{State: "ineligible", Reason: "registered", Start: at(50), End: at(51), Began: at(50)},
				{State: "eligible", Reason: "first success: entering rotation", Start: at(51), End: to, Began: at(51)},
			},
		},
		{
			name: "registered before the window, last transition before it: that transition's state, time and reason",
			inst: timelineInstance{ID: id, State: "ineligible", Registered: at(-120)},
			changes: []evaluator.Change{
				change(30, "eligible", "ineligible", "hard failure"),
			},
			at: evaluator.StateAt{State: "eligible", Before: true, At: at(-90), Reason: "failure rate below re-entry after dwell"}, known: true,
			want: []span{
				{State: "eligible", Reason: "failure rate below re-entry after dwell", Start: from, End: at(30), Began: at(-90)},
				{State: "ineligible", Reason: "hard failure", Start: at(30), End: to, Began: at(30)},
			},
		},
		{
			name: "last transition before the window, none in it: one band in the state it left, not the verdict now",
			inst: timelineInstance{ID: id, State: "ineligible", Registered: at(-120)},
			at:   evaluator.StateAt{State: "eligible", Before: true, At: at(-100), Reason: "evidence healthy"}, known: true,
			want: []span{{State: "eligible", Reason: "evidence healthy", Start: from, End: to, Began: at(-100)}},
		},
		{
			name: "ended inside the window: the row ends where the instance did, saying how",
			inst: timelineInstance{ID: id, Registered: at(-120), Ended: ptr(at(40)), EndState: "deregistered"},
			changes: []evaluator.Change{
				change(20, "eligible", "ineligible", "hard failure"),
			},
			at: evaluator.StateAt{State: "eligible", Before: true, At: at(-110), Reason: "first success: entering rotation"}, known: true,
			want: []span{
				{State: "eligible", Reason: "first success: entering rotation", Start: from, End: at(20), Began: at(-110)},
				{State: "ineligible", Reason: "hard failure", Start: at(20), End: at(40), Began: at(20), Ended: "deregistered"},
			},
		},
		{
			name: "registered and ended inside the window",
			inst: timelineInstance{ID: id, Registered: at(10), Ended: ptr(at(15)), EndState: "expired"},
			want: []span{{State: "", Reason: "registered", Start: at(10), End: at(15), Began: at(10), Ended: "expired"}},
		},
		{
			name: "no transitions at all, registered before the window: its verdict now across the window",
			inst: timelineInstance{ID: id, State: "unknown", Registered: at(-5)},
			want: []span{{State: "unknown", Start: from, End: to}},
		},
		{
			name: "no transitions at all, registered inside the window: its verdict now from the registration",
			inst: timelineInstance{ID: id, State: "eligible", Registered: at(45)},
			want: []span{{State: "eligible", Reason: "registered", Start: at(45), End: to, Began: at(45)}},
		},
		{
			name: "registered inside the window, its first transition after it: that transition's from-state",
			inst: timelineInstance{ID: id, State: "eligible", Registered: at(45)},
			at:   evaluator.StateAt{State: "ineligible", At: at(70)}, known: true,
			want: []span{{State: "ineligible", Reason: "registered", Start: at(45), End: to, Began: at(45)}},
		},
		{
			name: "a first transition stamped a moment before the registration still sets the state",
			inst: timelineInstance{ID: id, State: "eligible", Registered: at(30).Add(time.Millisecond)},
			changes: []evaluator.Change{
				change(30, "ineligible", "eligible", "first success: entering rotation"),
			},
			at: evaluator.StateAt{State: "ineligible", At: at(30)}, known: true,
			want: []span{{State: "eligible", Reason: "registered", Start: at(30).Add(time.Millisecond), End: to, Began: at(30).Add(time.Millisecond)}},
		},
		{
			name: "ended before the window: no band",
			inst: timelineInstance{ID: id, Registered: at(-120), Ended: ptr(at(-1)), EndState: "replaced"},
		},
		{
			name: "registered after the window: no band",
			inst: timelineInstance{ID: id, State: "eligible", Registered: at(61)},
		},
		{
			name: "unknown registration: from the first transition's from-state, before the window",
			inst: timelineInstance{ID: id},
			changes: []evaluator.Change{
				change(40, "eligible", "ineligible", "lease expired"),
			},
			want: []span{
				{State: "eligible", Start: from, End: at(40)},
				{State: "ineligible", Reason: "lease expired", Start: at(40), End: to, Began: at(40)},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []span
			for _, b := range lifeSpans(tc.inst, tc.changes, tc.at, tc.known, from, to) {
				got = append(got, span{b.State, b.Reason, b.Start, b.End, b.Began, b.Ended})
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("spans (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFitSpan(t *testing.T) {
	to := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		first time.Time
		want  time.Duration
	}{
		{"a demo a minute old: five minutes", to.Add(-time.Minute), 5 * time.Minute},
		{"exactly five minutes old: five minutes", to.Add(-5 * time.Minute), 5 * time.Minute},
		{"ten minutes old: fifteen", to.Add(-10 * time.Minute), 15 * time.Minute},
		{"forty minutes old: an hour", to.Add(-40 * time.Minute), time.Hour},
		{"older than an hour: an hour, not more", to.Add(-5 * time.Hour), time.Hour},
		{"no instance: an hour", time.Time{}, time.Hour},
	} {
		if got := fitSpan(to, tc.first); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	for d, want := range map[time.Duration]string{5 * time.Minute: "5m", time.Hour: "1h", 24 * time.Hour: "24h", 90 * time.Second: "1m30s", 30 * time.Second: "30s", 90 * time.Minute: "1h30m"} {
		if got := spanText(d); got != want {
			t.Errorf("spanText(%s) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(want); err != nil || back != d {
			t.Errorf("%q does not parse back to %s", want, d)
		}
	}
	for d, want := range map[time.Duration]time.Duration{30 * time.Second: 5 * time.Second, 5 * time.Minute: time.Minute, time.Hour: 10 * time.Minute, 24 * time.Hour: 3 * time.Hour} {
		if got := tickFor(d); got != want {
			t.Errorf("tickFor(%s) = %s, want %s", d, got, want)
		}
	}
}

// TestLayoutTimelineLifetimes lays out a young service: rows start at
// their registration with a "not registered" line before it, an ended
// instance's row stops at its end, an instance registered after the
// window has no row, and the page says where the activity begins.
func TestLayoutTimelineLifetimes(t *testing.T) {
	from := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	to := from.Add(time.Hour)
	at := func(min int) time.Time { return from.Add(time.Duration(min) * time.Minute) }
	young, ended, later := uuid.New(), uuid.New(), uuid.New()
	d := timelineData{
		From: from, To: to, Tick: 10 * time.Minute,
		Instances: []timelineInstance{
			{ID: young, Label: "10.0.0.1:80", Zone: "az1", State: "eligible", Registered: at(59)},
			{ID: ended, Label: "10.0.0.2:80", Zone: "az1", Registered: at(58), Ended: ptr(at(59)), EndState: "deregistered"},
			{ID: later, Label: "10.0.0.3:80", Zone: "az1", State: "eligible", Registered: to.Add(time.Second)},
		},
		Changes: []evaluator.Change{
			{InstanceID: young, From: "ineligible", To: "eligible", At: at(59).Add(3 * time.Second), Reason: "first success: entering rotation"},
		},
		StateAt: map[uuid.UUID]evaluator.StateAt{young: {State: "ineligible", At: at(59).Add(3 * time.Second)}},
	}
	var tl views.Timeline
	layoutTimeline(&tl, d)
	if len(tl.Rows) != 2 {
		t.Fatalf("%d rows, want 2 (the instance registered after the window has none)", len(tl.Rows))
	}
	y := rowOf(t, tl, young.String())
	if diff := cmp.Diff([]band{{"ineligible", at(59), at(59).Add(3 * time.Second)}, {"eligible", at(59).Add(3 * time.Second), to}}, bandsOf(y)); diff != "" {
		t.Errorf("young (-want +got):\n%s", diff)
	}
	wantX := views.TimelineGutter + 59.0/60*views.TimelinePlotWidth
	if len(y.Absent) != 1 || math.Abs(y.Absent[0].X-views.TimelineGutter) > 1e-9 || math.Abs(y.Absent[0].X+y.Absent[0].W-wantX) > 1e-9 {
		t.Errorf("young's not-registered line %+v, want from the plot's start to x %.2f", y.Absent, wantX)
	}
	if math.Abs(y.Bands[0].X-wantX) > 1e-9 {
		t.Errorf("young's first band at x %.2f, want %.2f", y.Bands[0].X, wantX)
	}
	e := rowOf(t, tl, ended.String())
	if diff := cmp.Diff([]band{{"", at(58), at(59)}}, bandsOf(e)); diff != "" {
		t.Errorf("ended (-want +got):\n%s", diff)
	}
	if len(e.Absent) != 2 || e.Bands[0].Ended != "deregistered" || !strings.HasPrefix(e.Absent[1].Title, "deregistered at ") {
		t.Errorf("ended: not-registered lines %+v, last band ended %q", e.Absent, e.Bands[0].Ended)
	}
	if !tl.FirstRegistered.Equal(at(58)) {
		t.Errorf("first registration %s, want %s", tl.FirstRegistered, at(58))
	}

	var b strings.Builder
	if err := views.TimelinePage(tl).Render(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, want := range []string{`id="timeline-activity"`, `The first instance drawn was registered at <time datetime="2026-12-02T05:58:00Z">`,
		`<line class="absent"`, `not registered (before registration, after the end)`, `<span class="ended">deregistered</span>`} {
		if !strings.Contains(html, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	if strings.Contains(html, "before the window") {
		t.Error("a span of an instance registered in the window says it began before the window")
	}

	// A window of seconds labels its ticks with seconds.
	d.From, d.To, d.Tick = at(59), at(59).Add(30*time.Second), tickFor(30*time.Second)
	layoutTimeline(&tl, d)
	if len(tl.Ticks) != 7 || tl.Ticks[1].Label != "05:59:05" {
		t.Errorf("ticks over 30 s: %+v", tl.Ticks)
	}
}
