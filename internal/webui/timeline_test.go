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
		{name: "another span", span: "7d", bad: true},
		{name: "not a time", end: "yesterday", bad: true},
		{name: "in the future", end: "2026-12-03T18:00:00Z", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from, to, err := timelineWindow(tc.span, tc.end, now)
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
		StateAt: map[uuid.UUID]string{quiet: "ineligible", steady: "degraded", flapper: "eligible"},
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
		want := []string{"zone az1", "zone az2", "deregistered " + gone.String()[:8], "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"}
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
