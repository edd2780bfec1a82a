package webui

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/guardlog"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/views"
)

// The timeline's spans: the page offers timelineOffered as links, and
// ?span= takes any duration from timelineMinSpan to timelineMaxSpan (a
// short one zooms in on an incident's seconds).
var timelineOffered = []time.Duration{5 * time.Minute, 15 * time.Minute, time.Hour, 6 * time.Hour, 24 * time.Hour}

const (
	timelineMinSpan = 30 * time.Second
	timelineMaxSpan = 24 * time.Hour
	// timelineDefaultSpan is the longest span the page picks by itself: a
	// service younger than it is shown over the smallest offered span
	// that reaches back to its first registration still shown.
	timelineDefaultSpan = time.Hour
)

// errTimelineWindow is a span or end query parameter the timeline cannot
// show; its text is for the operator.
type errTimelineWindow string

func (e errTimelineWindow) Error() string { return string(e) }

// timelineWindow reads ?span= (a duration, default an hour) and
// ?end=RFC3339 (default now) into the window [from, to); chosen says the
// span was given (otherwise fitSpan may narrow the window). An end in the
// future is refused rather than drawn empty; end is kept to the second.
func timelineWindow(span, end string, now time.Time) (from, to time.Time, chosen bool, _ error) {
	d := timelineDefaultSpan
	if span != "" {
		var err error
		d, err = time.ParseDuration(span)
		if err != nil || d < timelineMinSpan || d > timelineMaxSpan || d%time.Second != 0 {
			return from, to, false, errTimelineWindow(fmt.Sprintf("span must be a whole number of seconds from %s to %s, like 5m, 1h or 24h, not %q.",
				spanText(timelineMinSpan), spanText(timelineMaxSpan), truncate(span)))
		}
		chosen = true
	}
	to = now.UTC().Truncate(time.Second)
	if end != "" {
		t, err := time.Parse(time.RFC3339, end)
		if err != nil {
			return from, to, false, errTimelineWindow(fmt.Sprintf("end must be a time in RFC 3339 form, like %s, not %q.", to.Format(time.RFC3339), truncate(end)))
		}
		if t.After(now) {
			return from, to, false, errTimelineWindow(fmt.Sprintf("end %s is in the future; the timeline shows what has happened.", t.UTC().Format(time.RFC3339)))
		}
		to = t.UTC().Truncate(time.Second)
	}
	return to.Add(-d), to, chosen, nil
}

// fitSpan is the span shown when none was asked for: the smallest offered
// span ending at to that reaches back to first (the earliest registration
// among the instances of the default window), so a young service's
// activity fills the plot rather than its last pixels; the default span
// when first is older, or there is no instance.
func fitSpan(to, first time.Time) time.Duration {
	if first.IsZero() {
		return timelineDefaultSpan
	}
	for _, d := range timelineOffered {
		if d > timelineDefaultSpan {
			break
		}
		if !to.Add(-d).After(first) {
			return d
		}
	}
	return timelineDefaultSpan
}

// spanText writes a span as ?span= takes it: 5m, 1h, 90s, 1h30m.
func spanText(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// tickFor is the spacing of the axis ticks over span: the smallest round
// step that gives at most eight.
func tickFor(span time.Duration) time.Duration {
	steps := []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour}
	for _, s := range steps {
		if span/s <= 8 {
			return s
		}
	}
	return 6 * time.Hour
}

// timelineInstance is an instance as the timeline draws it: its label,
// its lifetime in the registry, and its verdict now (drawn when the
// transitions log has nothing on it: its state has never changed).
type timelineInstance struct {
	ID          uuid.UUID
	Label, Zone string
	// State is the verdict now; "" for an ended instance (nothing is
	// known of it but the log).
	State string
	// Registered is when it was registered; zero when unknown (an
	// instance the log names that the registry did not list), taken as
	// before the window.
	Registered time.Time
	// Ended is when it ended, nil while it is live; EndState how
	// (deregistered, expired, replaced).
	Ended    *time.Time
	EndState string
}

// timelineData is what a timeline is laid out from.
type timelineData struct {
	From, To  time.Time
	Tick      time.Duration
	Instances []timelineInstance
	// Changes are the service's transitions in [From, To), oldest first.
	Changes []evaluator.Change
	// StateAt is each instance's state at From as the log tells it.
	StateAt   map[uuid.UUID]evaluator.StateAt
	Overrides []policy.Override
	Guards    []guardlog.Episode
	Shifts    []shift.Shift
}

// lifeSpans returns the state spans of one instance over [from, to),
// given its transitions in the window (oldest first) and its state at
// from as the log tells it (known false: the log has nothing on it).
// Nothing is drawn before its registration or after its end. Where the
// row begins, the state is:
//   - registered in the window: the state it was registered in, the
//     first transition's from-state (else its verdict now: it never
//     changed), the span's reason "registered";
//   - registered before the window: the to-state of its last transition
//     before the window, with that transition's time and reason; else
//     the from-state of its first transition, else its verdict now.
//
// A change to another state closes the span and opens the next; a change
// that keeps the state (a weight change) does not. The last span ends at
// the instance's end (saying how it ended) or the window's.
func lifeSpans(in timelineInstance, changes []evaluator.Change, at evaluator.StateAt, known bool, from, to time.Time) []views.TimelineBand {
	start, end, ended := from, to, ""
	registeredHere := !in.Registered.IsZero() && !in.Registered.Before(from)
	if registeredHere {
		start = in.Registered
	}
	if in.Ended != nil && in.Ended.Before(to) {
		end, ended = *in.Ended, in.EndState
		if ended == "" {
			ended = "ended"
		}
	}
	if !end.After(start) {
		return nil
	}
	cur := views.TimelineBand{State: in.State, Start: start, Began: start}
	switch {
	case registeredHere:
		cur.Reason = "registered"
		if len(changes) > 0 {
			cur.State = changes[0].From
		} else if known {
			cur.State = at.State
		}
	case known && at.Before:
		cur.State, cur.Began, cur.Reason = at.State, at.At, at.Reason
	case len(changes) > 0:
		cur.State, cur.Began = changes[0].From, time.Time{}
	case known:
		cur.State, cur.Began = at.State, time.Time{}
	default:
		cur.Began = time.Time{}
	}
	var out []views.TimelineBand
	for _, c := range changes {
		if c.At.Before(start) {
			// Written a moment before the registration's time (the
			// evaluator and the registry may read different clocks):
			// it still sets the state the row opens in.
			cur.State, cur.Weight = c.To, c.Weight
			continue
		}
		if !c.At.Before(end) || c.To == cur.State {
			continue
		}
		if c.At.After(cur.Start) {
			cur.End = c.At
			out = append(out, cur)
		}
		cur = views.TimelineBand{State: c.To, Reason: c.Reason, Weight: c.Weight, Start: c.At, Began: c.At}
	}
	cur.End, cur.Ended = end, ended
	return append(out, cur)
}

// layoutTimeline lays d out into tl's rows, marks and ticks: a pure
// function of its input, so tested without a database or a browser.
//
// Each instance that was registered at some time in the window gets a
// row with its state spans (lifeSpans), and a "not registered" line
// where the window runs before its registration or after its end;
// instances the log names that are not among d.Instances get rows of
// their own, from their first transition's from-state. Bands are
// clipped to the window. Zone rows carry guard trips (a band while
// tripped, a mark where it tripped) and shift steps.
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

	// Instance rows: the instances of the window, then any the log names.
	byID := make(map[uuid.UUID][]evaluator.Change)
	insts := slices.Clone(d.Instances)
	listed := make(map[uuid.UUID]bool, len(insts))
	for _, inst := range insts {
		listed[inst.ID] = true
	}
	for _, c := range d.Changes {
		if !listed[c.InstanceID] {
			listed[c.InstanceID] = true
			insts = append(insts, timelineInstance{ID: c.InstanceID, Label: "unlisted " + c.InstanceID.String()[:8]})
		}
		byID[c.InstanceID] = append(byID[c.InstanceID], c)
	}
	index := make(map[uuid.UUID]int, len(insts))
	rows := make([]views.TimelineRow, 0, len(insts))
	tl.FirstRegistered = time.Time{}
	for _, inst := range insts {
		at, known := d.StateAt[inst.ID]
		bands := lifeSpans(inst, byID[inst.ID], at, known, d.From, d.To)
		if len(bands) == 0 {
			continue
		}
		r := views.TimelineRow{Key: inst.ID.String(), Label: inst.Label, Zone: inst.Zone}
		for _, b := range bands {
			b.X, b.W = x(b.Start), x(b.End)-x(b.Start)
			r.Bands = append(r.Bands, b)
		}
		if first := bands[0].Start; first.After(d.From) {
			r.Absent = append(r.Absent, views.TimelineGap{X: x(d.From), W: x(first) - x(d.From),
				Title: "not registered until " + views.Absolute(first)})
		}
		if last := bands[len(bands)-1]; last.Ended != "" {
			r.Absent = append(r.Absent, views.TimelineGap{X: x(last.End), W: x(d.To) - x(last.End),
				Title: last.Ended + " at " + views.Absolute(last.End)})
		}
		if !inst.Registered.IsZero() && (tl.FirstRegistered.IsZero() || inst.Registered.Before(tl.FirstRegistered)) {
			tl.FirstRegistered = inst.Registered
		}
		index[inst.ID] = len(rows)
		rows = append(rows, r)
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
				label := views.Clock(t)
				if d.Tick < time.Minute {
					label = t.UTC().Format("15:04:05")
				}
				tl.Ticks = append(tl.Ticks, views.TimelineTick{X: x(t), Label: label})
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
