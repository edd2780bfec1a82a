package views

import (
	"strconv"
	"time"
)

// Timeline geometry, in SVG user units: instance labels in a left gutter,
// then the plot; one row per instance or zone.
const (
	TimelineGutter    = 230.0
	TimelinePlotWidth = 1000.0
	TimelineRowHeight = 16.0
	TimelineBandInset = 2.0
	TimelineAxis      = 22.0
)

// Timeline is a service's state timeline over [From, To): one row per
// instance with a band per state span from the transitions log, and rows
// per zone for guard trips and shift steps; overrides are marked on their
// instance's row.
type Timeline struct {
	Page
	Service string
	// Span is the window's length as ?span= takes it ("1h"); Spans are
	// the spans offered as links.
	Span  string
	Spans []string
	// FitSpan is a shorter offered span whose window still holds every
	// registration drawn, linked from the page ("" when none is shorter).
	FitSpan  string
	From, To time.Time
	// EndParam is the end query parameter that shows this window ("" for
	// the window ending now); Earlier and Later are those of the windows
	// one span either side (Later is "" for now, and LaterOK false when
	// this window already ends now).
	EndParam, Earlier, Later string
	LaterOK                  bool
	Zones                    []TimelineRow // guard trips and shift steps, per zone
	Rows                     []TimelineRow // instances
	Ticks                    []TimelineTick
	Events                   []TimelineMark // every mark, in time order, for the text equivalent
	// Height is the SVG's height.
	Height float64
	// Truncated says the transitions log held more than the page reads.
	Truncated bool
	// Notes say which parts could not be read.
	Notes []string
	// FirstRegistered is the earliest registration among the instances
	// drawn (zero when none is known): the page says where the activity
	// begins when it is inside the window.
	FirstRegistered time.Time
}

// TimelineRow is one row of the plot.
type TimelineRow struct {
	Key   string // instance id, or the zone name for zone rows
	Label string
	Zone  string
	Y     float64
	Bands []TimelineBand
	Marks []TimelineMark
	// Absent are the parts of the window before the instance's
	// registration or after its end: drawn as a thin dashed line, not a
	// band, since it had no state there.
	Absent []TimelineGap
}

// TimelineGap is a stretch of a row where its instance was not
// registered.
type TimelineGap struct {
	X, W  float64
	Title string
}

// TimelineBand is a span of one state (an instance's verdict, or a zone's
// guard tripped).
type TimelineBand struct {
	State      string
	Start, End time.Time
	// Reason is why the span began ("registered" when the instance was
	// registered in it; "" when it began before the window and the log
	// does not say why).
	Reason string
	// Began is when the span truly began: Start, or the time of the last
	// transition before the window when the span began before it; zero
	// when that is not known.
	Began time.Time
	// Ended says how the instance ended at End (deregistered, expired,
	// replaced); "" when the span ends otherwise.
	Ended string
	// Weight is the instance's weight as the span began.
	Weight float64
	X, W   float64
}

// TimelineMark is a point event: an override, a guard trip, a shift step.
type TimelineMark struct {
	Kind string // "override", "guard" or "shift"
	// What the event was, in a word: trip or clear (guard), asked or
	// ended (override), drained, step, confirmed or ended (shift).
	What   string
	At     time.Time
	Where  string // the instance or zone it concerns
	Detail string
	X, Y   float64
}

// TimelineTick is a time label on the axis.
type TimelineTick struct {
	X     float64
	Label string
}

// Px formats an SVG coordinate.
func Px(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

// Clock renders t in UTC as hours and minutes, for axis labels.
func Clock(t time.Time) string { return t.UTC().Format("15:04") }

// StateText says what a timeline state is in words.
func StateText(s string) string {
	switch s {
	case "tripped":
		return "guard tripped"
	case "":
		return "no record"
	}
	return s
}

// BeganBefore says a band began before its window's start.
func (b TimelineBand) BeganBefore() bool { return !b.Began.IsZero() && b.Began.Before(b.Start) }

// bandFill is the pattern a state's bands are filled with: colour plus
// texture, so states differ without colour too.
func bandFill(state string) string {
	switch state {
	case "eligible", "degraded", "ineligible", "unknown", "tripped":
		return "url(#p-" + state + ")"
	}
	return "url(#p-other)"
}

// markPath draws a mark at x in the row at y, its shape by kind: a
// triangle for guard events, a diamond for overrides, a bar for shift
// steps.
func markPath(kind string, x, y float64) string {
	top, mid, bot := Px(y+2), Px(y+TimelineRowHeight/2), Px(y+TimelineRowHeight-2)
	switch kind {
	case "guard":
		return "M" + Px(x) + " " + bot + "L" + Px(x-5) + " " + top + "L" + Px(x+5) + " " + top + "Z"
	case "override":
		return "M" + Px(x) + " " + top + "L" + Px(x+5) + " " + mid + "L" + Px(x) + " " + bot + "L" + Px(x-5) + " " + mid + "Z"
	}
	return "M" + Px(x-1.5) + " " + top + "H" + Px(x+1.5) + "V" + bot + "H" + Px(x-1.5) + "Z"
}
