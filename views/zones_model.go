package views

import (
	"strconv"
	"strings"
)

// Spark is one sparkline: a quantity over time, oldest first, drawn on a
// scale from 0 to Top.
type Spark struct {
	Name   string // what it counts, for the title and the text
	Values []float64
	Top    float64
	// Percent: the values are fractions shown as percentages.
	Percent bool
}

// ZoneTrend is one zone's sparklines on the overview.
type ZoneTrend struct {
	Zone              string
	Unknown, Fraction Spark
}

// sparkWidth and sparkHeight are a sparkline's size in pixels.
const sparkWidth, sparkHeight = 160.0, 28.0

// points is the polyline of the values, x by sample index (samples are
// taken at a fixed interval), y up from the bottom to Top.
func (s Spark) points() string {
	var b strings.Builder
	n := len(s.Values)
	for i, v := range s.Values {
		x := sparkWidth / 2
		if n > 1 {
			x = 1 + float64(i)*(sparkWidth-2)/float64(n-1)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(x, 'f', 1, 64) + "," + strconv.FormatFloat(s.y(v), 'f', 1, 64))
	}
	return b.String()
}

func (s Spark) y(v float64) float64 {
	top := s.Top
	if top <= 0 {
		top = 1
	}
	return sparkHeight - 1 - min(max(v/top, 0), 1)*(sparkHeight-2)
}

// dataValues is the values as the page carries them for tests and
// readers: space-separated, as drawn.
func (s Spark) dataValues() string {
	out := make([]string, len(s.Values))
	for i, v := range s.Values {
		out[i] = strconv.FormatFloat(v, 'g', 4, 64)
	}
	return strings.Join(out, " ")
}

func (s Spark) show(v float64) string {
	if s.Percent {
		return strconv.FormatFloat(v*100, 'f', 0, 64) + "%"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// text is the sparkline's text equivalent: now, low and high.
func (s Spark) text() string {
	if len(s.Values) == 0 {
		return s.Name + ": no samples yet"
	}
	lo, hi := s.Values[0], s.Values[0]
	for _, v := range s.Values {
		lo, hi = min(lo, v), max(hi, v)
	}
	return s.Name + ": now " + s.show(s.Values[len(s.Values)-1]) + ", low " + s.show(lo) + ", high " + s.show(hi)
}

// ProberTrend is one prober's reach on the overview: the share of its
// assigned targets it reported on over the last hour, and its state now.
type ProberTrend struct {
	Prober  string
	Reach   Spark
	State   string // "outage", "suspect" or "reporting"
	Targets int
}

func (p ProberTrend) stateClass() string {
	switch p.State {
	case "outage":
		return "bad"
	case "suspect":
		return "warn"
	}
	return "ok"
}
