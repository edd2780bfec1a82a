package webui

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/guardlog"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/views"
)

// timelineSpans are the windows the timeline offers (?span=), with the
// spacing of their axis ticks.
var timelineSpans = map[string]struct{ span, tick time.Duration }{
	"1h":  {time.Hour, 10 * time.Minute},
	"24h": {24 * time.Hour, 2 * time.Hour},
}

// errTimelineWindow is a span or end query parameter the timeline cannot
// show; its text is for the operator.
type errTimelineWindow string

func (e errTimelineWindow) Error() string { return string(e) }

// timelineWindow reads ?span=1h|24h (default 1h) and ?end=RFC3339
// (default now) into the window [from, to). An end in the future is
// refused rather than drawn empty; end is kept to the second.
func timelineWindow(span, end string, now time.Time) (from, to time.Time, _ error) {
	if span == "" {
		span = "1h"
	}
	s, ok := timelineSpans[span]
	if !ok {
		return from, to, errTimelineWindow(fmt.Sprintf("span must be 1h or 24h, not %q.", truncate(span)))
	}
	to = now.UTC().Truncate(time.Second)
	if end != "" {
		t, err := time.Parse(time.RFC3339, end)
		if err != nil {
			return from, to, errTimelineWindow(fmt.Sprintf("end must be a time in RFC 3339 form, like %s, not %q.", to.Format(time.RFC3339), truncate(end)))
		}
		if t.After(now) {
			return from, to, errTimelineWindow(fmt.Sprintf("end %s is in the future; the timeline shows what has happened.", t.UTC().Format(time.RFC3339)))
		}
		to = t.UTC().Truncate(time.Second)
	}
	return to.Add(-s.span), to, nil
}

// timelineInstance is a live instance as the timeline labels it. State
// is its verdict now, drawn across the window when the transitions log
// has nothing on it (its state has never changed).
type timelineInstance struct {
	ID          uuid.UUID
	Label, Zone string
	State       string
}

// timelineData is what a timeline is laid out from.
type timelineData struct {
	From, To  time.Time
	Tick      time.Duration
	Instances []timelineInstance
	// Changes are the service's transitions in [From, To), oldest first.
	Changes []evaluator.Change
	// StateAt is each instance's state at From as the log tells it.
	StateAt   map[uuid.UUID]string
	Overrides []policy.Override
	Guards    []guardlog.Episode
	Shifts    []shift.Shift
}

// layoutTimeline lays d out into tl's rows, marks and ticks: a pure
// function of its input, so tested without a database or a browser.
//
// Each instance row starts in the state it was in at From (the first
// change's from-state, else the last one before the window, else its
// verdict now), and a change to another state closes the band and opens
// the next; a change that keeps the state (a weight change) does not.
// Bands are clipped to the window. Instances with changes but no longer
// registered get rows of their own. Zone rows carry guard trips (a band
// while tripped, a mark where it tripped) and shift steps.
func layoutTimeline(tl *views.Timeline, d timelineData) {
	tl.From, tl.To = d.From, d.To
	window := float64(d.To.Sub(d.From))
	x := func(t time.Time) float64 {
		if t.Before(d.From) {
			t = d.From
		} else if t.After(d.To) {
			t = d.To
		}
		return views.TimelineGutter + float64(t.Sub(d.From))/window*views.TimelinePlotWidth
	}
	in := func(t time.Time) bool { return !t.Before(d.From) && t.Before(d.To) }
	band := func(state, reason string, weight float64, start, end time.Time) views.TimelineBand {
		return views.TimelineBand{State: state, Reason: reason, Weight: weight, Start: start, End: end, X: x(start), W: x(end) - x(start)}
	}

	// Instance rows: the registered instances, then any the log names.
	index := make(map[uuid.UUID]int, len(d.Instances))
	rows := make([]views.TimelineRow, 0, len(d.Instances))
	initial := make([]string, 0, len(d.Instances))
	for _, inst := range d.Instances {
		index[inst.ID] = len(rows)
		rows = append(rows, views.TimelineRow{Key: inst.ID.String(), Label: inst.Label, Zone: inst.Zone})
		st, ok := d.StateAt[inst.ID]
		if !ok {
			st = inst.State
		}
		initial = append(initial, st)
	}
	for _, c := range d.Changes {
		if _, ok := index[c.InstanceID]; !ok {
			index[c.InstanceID] = len(rows)
			rows = append(rows, views.TimelineRow{Key: c.InstanceID.String(), Label: "deregistered " + c.InstanceID.String()[:8]})
			initial = append(initial, c.From)
		}
	}
	// Open bands: a row's current state and when it began.
	type open struct {
		state, reason string
		weight        float64
		since         time.Time
		changed       bool
	}
	cur := make([]open, len(rows))
	for i := range rows {
		cur[i] = open{state: initial[i], since: d.From}
	}
	for _, c := range d.Changes {
		i := index[c.InstanceID]
		o := &cur[i]
		if !o.changed {
			// The log's own from-state beats the guesses above.
			o.state, o.changed = c.From, true
		}
		if c.To == o.state {
			continue
		}
		if c.At.After(o.since) {
			rows[i].Bands = append(rows[i].Bands, band(o.state, o.reason, o.weight, o.since, c.At))
		}
		*o = open{state: c.To, reason: c.Reason, weight: c.Weight, since: c.At, changed: true}
	}
	for i := range rows {
		o := cur[i]
		rows[i].Bands = append(rows[i].Bands, band(o.state, o.reason, o.weight, o.since, d.To))
	}

	// Overrides, on their instance's row.
	for _, o := range d.Overrides {
		i, ok := index[o.InstanceID]
		if !ok {
			continue
		}
		what := string(o.Action) + " by " + o.Actor
		if in(o.CreatedAt) {
			rows[i].Marks = append(rows[i].Marks, views.TimelineMark{Kind: "override", What: "asked", At: o.CreatedAt, Where: rows[i].Label,
				Detail: "override " + what + " asked: " + o.Justification})
		}
		if o.EndedAt != nil && in(*o.EndedAt) {
			rows[i].Marks = append(rows[i].Marks, views.TimelineMark{Kind: "override", What: "ended", At: *o.EndedAt, Where: rows[i].Label,
				Detail: "override " + what + " ended (" + string(o.State) + ")"})
		}
	}
	slices.SortStableFunc(rows, func(a, b views.TimelineRow) int {
		return cmp.Or(cmp.Compare(a.Zone, b.Zone), cmp.Compare(a.Label, b.Label), cmp.Compare(a.Key, b.Key))
	})

	// Zone rows: guard trips and shift steps.
	zones := map[string]*views.TimelineRow{}
	zone := func(name string) *views.TimelineRow {
		z, ok := zones[name]
		if !ok {
			z = &views.TimelineRow{Key: name, Label: "zone " + name, Zone: name}
			zones[name] = z
		}
		return z
	}
	guards := slices.Clone(d.Guards)
	slices.SortFunc(guards, func(a, b guardlog.Episode) int { return a.TrippedAt.Compare(b.TrippedAt) })
	for _, g := range guards {
		end := d.To
		if g.ClearedAt != nil {
			end = *g.ClearedAt
		}
		if !g.TrippedAt.Before(d.To) || !end.After(d.From) {
			continue
		}
		z := zone(g.Zone)
		z.Bands = append(z.Bands, band("tripped", g.Detail, 0, maxTime(g.TrippedAt, d.From), minTime(end, d.To)))
		if in(g.TrippedAt) {
			z.Marks = append(z.Marks, views.TimelineMark{Kind: "guard", What: "trip", At: g.TrippedAt, Where: z.Label, Detail: "guard tripped: " + g.Detail})
		}
		if g.ClearedAt != nil && in(*g.ClearedAt) {
			z.Marks = append(z.Marks, views.TimelineMark{Kind: "guard", What: "clear", At: *g.ClearedAt, Where: z.Label, Detail: "guard cleared"})
		}
	}
	served := map[string]bool{}
	for _, r := range rows {
		served[r.Zone] = true
	}
	for _, s := range d.Shifts {
		if !served[s.Target] {
			continue
		}
		steps := []struct {
			at         *time.Time
			word, what string
		}{
			{&s.StartedAt, "drained", "drained by " + s.StartedBy + ": " + s.Reason},
			{&s.LastStepAt, "step", "step " + strconv.Itoa(s.Step) + " back by " + s.LastStepBy + ", traffic weight " + strconv.FormatFloat(s.TrafficWeight*100, 'f', -1, 64) + "%"},
			{s.ConfirmedAt, "confirmed", "shift-back confirmed"},
			{s.EndedAt, "ended", s.State},
		}
		for i, st := range steps {
			if st.at == nil || !in(*st.at) || (i == 1 && (s.Step == 0 || st.at.Equal(s.StartedAt))) {
				continue
			}
			z := zone(s.Target)
			z.Marks = append(z.Marks, views.TimelineMark{Kind: "shift", What: st.word, At: *st.at, Where: z.Label, Detail: "shift " + st.what})
		}
	}

	tl.Zones = tl.Zones[:0]
	for _, name := range slices.Sorted(maps.Keys(zones)) {
		tl.Zones = append(tl.Zones, *zones[name])
	}
	tl.Rows = rows
	y := views.TimelineAxis
	place := func(rs []views.TimelineRow) {
		for i := range rs {
			rs[i].Y = y
			for j := range rs[i].Marks {
				m := &rs[i].Marks[j]
				m.X, m.Y = x(m.At), y
				tl.Events = append(tl.Events, *m)
			}
			y += views.TimelineRowHeight
		}
	}
	place(tl.Zones)
	place(tl.Rows)
	tl.Height = y + 4
	slices.SortStableFunc(tl.Events, func(a, b views.TimelineMark) int { return a.At.Compare(b.At) })

	tl.Ticks = tl.Ticks[:0]
	if d.Tick > 0 {
		for t := d.From.Truncate(d.Tick); !t.After(d.To); t = t.Add(d.Tick) {
			if !t.Before(d.From) {
				tl.Ticks = append(tl.Ticks, views.TimelineTick{X: x(t), Label: views.Clock(t)})
			}
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
