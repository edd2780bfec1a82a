package preview

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
)

// Defaults of Input's zero fields.
const (
	DefaultStep     = time.Second
	DefaultMaxDiffs = 100
	// MaxTimeline bounds the points of each outcome's timeline; past it
	// the timeline keeps every other point (and the last), so a long
	// replay of a churning service still answers in a bounded document.
	MaxTimeline = 400
)

// Window is one observed window of one instance and evidence class, as
// the evaluator retains them: outcome counts between two flushes.
type Window struct {
	Instance     uuid.UUID
	Class        eligibility.Class
	End          time.Time
	Successes    uint32
	Failures     uint32
	HardFailures uint32
	Unobservable uint32
	// Reporters is how many distinct reporters spoke in the window (at
	// most 4 are told apart); 0 reads as 1.
	Reporters int
}

// Instance is one instance of the service as the replay starts it.
type Instance struct {
	ID   uuid.UUID
	Zone string
	// Awaiting: it has never been in rotation (a new instance of a
	// service with a readiness signal, before its first success).
	Awaiting bool
}

// Contract is one side of the comparison.
type Contract struct {
	Eligibility        eligibility.Contract
	MinHealthyFraction float64
}

// Input is what Run replays.
type Input struct {
	Service   string
	Instances []Instance
	// Windows in any order; windows of instances not in Instances, or
	// ending outside [From, To], are left out.
	Windows           []Window
	Current, Proposed Contract
	// From and To bound the replay. A zero From is the first window's
	// end (To when there is none).
	From, To time.Time
	// Step is the evaluation cadence between window ends (DefaultStep).
	Step time.Duration
	// Options are the live engine's, so silence and quarantine rules
	// match.
	Options eligibility.Options
	// MaxDiffs bounds Result.Differences (DefaultMaxDiffs).
	MaxDiffs int
}

// Counts are instances by state.
type Counts struct {
	Eligible   int `json:"eligible"`
	Degraded   int `json:"degraded"`
	Unknown    int `json:"unknown"`
	Ineligible int `json:"ineligible"`
}

// Point is the counts from At on, with the zones whose guard is tripped.
type Point struct {
	At           time.Time `json:"at"`
	Counts       Counts    `json:"counts"`
	GuardTripped int       `json:"guard_tripped_zones"`
}

// Guard is what the minimum-healthy-fraction guard would have done.
type Guard struct {
	MinHealthyFraction float64 `json:"min_healthy_fraction"`
	Tripped            bool    `json:"tripped"`
	// FirstTrippedAt is when a zone first fell below the fraction.
	FirstTrippedAt *time.Time `json:"first_tripped_at,omitempty"`
	// Zones lists every zone that tripped at some point, sorted.
	Zones []string `json:"zones"`
}

// Outcome is the replay under one contract.
type Outcome struct {
	// Removed counts instances taken out of rotation at least once,
	// Removals every such removal.
	Removed  int `json:"removed"`
	Removals int `json:"removals"`
	// Degraded counts instances degraded at least once; Unknown those
	// left unknown at the end.
	Degraded int `json:"degraded"`
	Unknown  int `json:"unknown"`
	// FirstRemovalAt is the first removal, if any.
	FirstRemovalAt *time.Time `json:"first_removal_at,omitempty"`
	// PeakIneligible is the most instances out of rotation at once,
	// first reached at PeakAt.
	PeakIneligible int        `json:"peak_ineligible"`
	PeakAt         *time.Time `json:"peak_at,omitempty"`
	Final          Counts     `json:"final"`
	Guard          Guard      `json:"guard"`
	// Timeline holds a point at From and at every change of the counts
	// or of the tripped zones.
	Timeline []Point `json:"timeline"`
}

// Verdict is one instance's replay under one contract.
type Verdict struct {
	Final    string `json:"final"`
	Worst    string `json:"worst"`
	Removals int    `json:"removals"`
	// FirstRemovedAt is its first removal, if any.
	FirstRemovedAt *time.Time `json:"first_removed_at,omitempty"`
}

// Difference is an instance the two contracts disagree on.
type Difference struct {
	InstanceID uuid.UUID `json:"instance_id"`
	Zone       string    `json:"zone"`
	Current    Verdict   `json:"current"`
	Proposed   Verdict   `json:"proposed"`
}

// Result is the preview.
type Result struct {
	Service   string    `json:"service"`
	From      time.Time `json:"from"`
	To        time.Time `json:"to"`
	Instances int       `json:"instances"`
	// Windows is how many observed windows were replayed.
	Windows  int     `json:"windows"`
	Current  Outcome `json:"current"`
	Proposed Outcome `json:"proposed"`
	// Differences lists instances whose final or worst state or removal
	// count differ, by id, at most Input.MaxDiffs; DiffsTotal counts them
	// all.
	Differences []Difference `json:"differences"`
	DiffsTotal  int          `json:"differences_total"`
}

// ErrInvalidInput: To before From, a negative Step, or an instance listed
// twice.
var ErrInvalidInput = errors.New("preview: invalid input")

// Run replays in under both contracts. It never touches anything but the
// engines it builds.
func Run(in Input) (Result, error) {
	if in.Step == 0 {
		in.Step = DefaultStep
	}
	if in.MaxDiffs <= 0 {
		in.MaxDiffs = DefaultMaxDiffs
	}
	if in.Step < 0 {
		return Result{}, fmt.Errorf("%w: step %v", ErrInvalidInput, in.Step)
	}
	known := make(map[uuid.UUID]int32, len(in.Instances))
	for i, x := range in.Instances {
		if _, dup := known[x.ID]; dup {
			return Result{}, fmt.Errorf("%w: instance %s listed twice", ErrInvalidInput, x.ID)
		}
		known[x.ID] = int32(i)
	}
	ws := make([]Window, 0, len(in.Windows))
	for _, w := range in.Windows {
		if _, ok := known[w.Instance]; ok && !w.End.After(in.To) && (in.From.IsZero() || !w.End.Before(in.From)) {
			ws = append(ws, w)
		}
	}
	slices.SortStableFunc(ws, func(a, b Window) int { return a.End.Compare(b.End) })
	if in.From.IsZero() {
		in.From = in.To
		if len(ws) > 0 {
			in.From = ws[0].End
		}
	}
	if in.To.Before(in.From) {
		return Result{}, fmt.Errorf("%w: to %v is before from %v", ErrInvalidInput, in.To, in.From)
	}
	cur, err := replay(in, ws, known, in.Current)
	if err != nil {
		return Result{}, fmt.Errorf("preview under the current contract: %w", err)
	}
	prop, err := replay(in, ws, known, in.Proposed)
	if err != nil {
		return Result{}, fmt.Errorf("preview under the proposed contract: %w", err)
	}
	res := Result{Service: in.Service, From: in.From, To: in.To, Instances: len(in.Instances), Windows: len(ws),
		Current: cur.outcome, Proposed: prop.outcome, Differences: []Difference{}}
	order := make([]int, len(in.Instances))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(in.Instances[a].ID.String(), in.Instances[b].ID.String()) })
	for _, i := range order {
		c, p := cur.inst[i], prop.inst[i]
		if c.final == p.final && c.worst == p.worst && c.removals == p.removals {
			continue
		}
		res.DiffsTotal++
		if len(res.Differences) < in.MaxDiffs {
			res.Differences = append(res.Differences, Difference{InstanceID: in.Instances[i].ID, Zone: in.Instances[i].Zone,
				Current: c.verdict(), Proposed: p.verdict()})
		}
	}
	return res, nil
}

// track is one instance during one replay.
type track struct {
	state, final, worst eligibility.State
	awaiting            bool
	degraded            bool
	removals            int
	firstRemoved        time.Time
	zone                int
}

func (t *track) verdict() Verdict {
	v := Verdict{Final: t.final.String(), Worst: t.worst.String(), Removals: t.removals}
	if !t.firstRemoved.IsZero() {
		at := t.firstRemoved
		v.FirstRemovedAt = &at
	}
	return v
}

// severity orders states for "worst": eligible < unknown < degraded <
// ineligible.
func severity(s eligibility.State) int {
	switch s {
	case eligibility.Eligible:
		return 0
	case eligibility.Unknown:
		return 1
	case eligibility.Degraded:
		return 2
	}
	return 3
}

type replayed struct {
	outcome Outcome
	inst    []track
}

// replay runs one contract over the windows.
func replay(in Input, ws []Window, known map[uuid.UUID]int32, c Contract) (replayed, error) {
	e := eligibility.NewEngine(in.Options)
	e.SetService(in.Service, c.Eligibility)
	const reporter eligibility.ReporterID = 1
	e.SetHistoryReporter(reporter)

	zoneIdx := map[string]int{}
	var zoneNames []string
	ts := make([]track, len(in.Instances))
	for i, x := range in.Instances {
		id := eligibility.InstanceID(x.ID)
		if err := e.AddInstance(id, in.Service, in.From); err != nil {
			return replayed{}, fmt.Errorf("add instance %s: %w", x.ID, err)
		}
		if !x.Awaiting {
			if err := e.RestoreAdmission(id, eligibility.Eligible, in.From, in.From); err != nil {
				return replayed{}, fmt.Errorf("restate instance %s: %w", x.ID, err)
			}
		}
		r, _ := e.Routing(id, in.From)
		z, ok := zoneIdx[x.Zone]
		if !ok {
			z = len(zoneNames)
			zoneIdx[x.Zone] = z
			zoneNames = append(zoneNames, x.Zone)
		}
		ts[i] = track{state: r.State, worst: r.State, awaiting: r.Awaiting, zone: z}
	}

	frac := assembler.NormFraction(c.MinHealthyFraction)
	out := Outcome{Guard: Guard{MinHealthyFraction: frac, Zones: []string{}}, Timeline: []Point{}}
	zones := make([]assembler.Capacity, len(zoneNames))
	everTripped := make([]bool, len(zoneNames))
	var counts Counts
	add := func(s eligibility.State, d int) {
		switch s {
		case eligibility.Eligible:
			counts.Eligible += d
		case eligibility.Degraded:
			counts.Degraded += d
		case eligibility.Unknown:
			counts.Unknown += d
		default:
			counts.Ineligible += d
		}
	}
	// capacity counts t as the guard does (assembler.Counted and
	// Routable; no overrides or expired leases in a replay).
	capacity := func(t *track, d int) {
		z := &zones[t.zone]
		x := assembler.InstanceInput{State: t.state, Awaiting: t.awaiting}
		if assembler.Counted(&x) {
			z.Counted += d
		}
		if assembler.Routable(&x) {
			z.Routable += d
		}
	}
	for i := range ts {
		add(ts[i].state, 1)
		capacity(&ts[i], 1)
	}
	tripped := func() int {
		n := 0
		for z := range zones {
			if zones[z].Tripped(frac) {
				n++
			}
		}
		return n
	}
	record := func(at time.Time) {
		n := tripped()
		p := Point{At: at, Counts: counts, GuardTripped: n}
		switch last := len(out.Timeline) - 1; {
		case last >= 0 && out.Timeline[last].Counts == counts && out.Timeline[last].GuardTripped == n:
			return
		case last >= 0 && out.Timeline[last].At.Equal(at):
			out.Timeline[last] = p // the restated start, evaluated at once
		default:
			out.Timeline = append(out.Timeline, p)
		}
		if n > 0 {
			if out.Guard.FirstTrippedAt == nil {
				t := at
				out.Guard.FirstTrippedAt = &t
			}
			out.Guard.Tripped = true
			for z := range zones {
				if zones[z].Tripped(frac) {
					everTripped[z] = true
				}
			}
		}
		if counts.Ineligible > out.PeakIneligible {
			out.PeakIneligible = counts.Ineligible
			t := at
			out.PeakAt = &t
		}
	}
	out.PeakIneligible = counts.Ineligible
	if counts.Ineligible > 0 {
		t := in.From
		out.PeakAt = &t
	}
	record(in.From)

	idx := func(id eligibility.InstanceID) (int32, bool) {
		i, ok := known[uuid.UUID(id)]
		return i, ok
	}
	tick := func(at time.Time) {
		for _, tr := range e.Tick(at) {
			i, ok := idx(tr.Instance)
			if !ok || tr.To == ts[i].state {
				continue
			}
			t := &ts[i]
			add(t.state, -1)
			capacity(t, -1)
			if t.state.InRotation() && tr.To == eligibility.Ineligible {
				t.removals++
				out.Removals++
				if t.firstRemoved.IsZero() {
					t.firstRemoved = at
					out.Removed++
				}
				if out.FirstRemovalAt == nil {
					a := at
					out.FirstRemovalAt = &a
				}
			}
			t.state = tr.To
			if t.state.InRotation() {
				t.awaiting = false
			}
			if t.state == eligibility.Degraded && !t.degraded {
				t.degraded = true
				out.Degraded++
			}
			if severity(t.state) > severity(t.worst) {
				t.worst = t.state
			}
			add(t.state, 1)
			capacity(t, 1)
		}
		record(at)
	}

	next := in.From
	for k := 0; ; {
		// Everything that ended by next is observed, then next is
		// evaluated: the first Tick is at From.
		for ; k < len(ws) && !ws[k].End.After(next); k++ {
			observe(e, ws[k], reporter)
		}
		tick(next)
		if !next.Before(in.To) {
			break
		}
		step := next.Add(in.Step)
		if k < len(ws) && ws[k].End.Before(step) {
			step = ws[k].End
		}
		if step.After(in.To) {
			step = in.To
		}
		next = step
	}

	for i := range ts {
		ts[i].final = ts[i].state
		if ts[i].state == eligibility.Unknown {
			out.Unknown++
		}
	}
	out.Final = counts
	for z, ok := range everTripped {
		if ok {
			out.Guard.Zones = append(out.Guard.Zones, zoneNames[z])
		}
	}
	slices.Sort(out.Guard.Zones)
	out.Timeline = thin(out.Timeline)
	return replayed{outcome: out, inst: ts}, nil
}

// thin halves a timeline longer than MaxTimeline until it fits, keeping
// its first and last points.
func thin(ps []Point) []Point {
	for len(ps) > MaxTimeline {
		last := ps[len(ps)-1]
		n := 0
		for i := 0; i < len(ps); i += 2 {
			ps[n] = ps[i]
			n++
		}
		if !ps[n-1].At.Equal(last.At) {
			ps[n] = last
			n++
		}
		ps = ps[:n]
	}
	return ps
}

// maxSpread is how many callers a passive window's outcomes are spread
// over at most (a window tells at most 4 apart).
const maxSpread = 4

// observe feeds one window to the engine as the rebuild's replay does
// (evaluator.replayWindow), but for passive windows, whose outcomes are
// spread evenly over the window's reporters (see doc.go).
func observe(e *eligibility.Engine, w Window, rep eligibility.ReporterID) {
	s := eligibility.Sample{Instance: eligibility.InstanceID(w.Instance), Class: w.Class, At: w.End, Reporter: rep}
	n := 1
	if w.Class == eligibility.Passive {
		n = min(max(w.Reporters, 1), maxSpread)
	}
	for r := range n {
		s.Reporter = rep + eligibility.ReporterID(r)
		if w.HardFailures > uint32(r) {
			s.Outcome = eligibility.HardFailure
			_ = e.Observe(s)
		}
		succ, fail := share(w.Successes, n, r), share(w.Failures, n, r)
		switch {
		case succ > 0 || fail > 0:
			s.Outcome, s.Successes, s.Failures = eligibility.Success, succ, fail
			_ = e.Observe(s)
			s.Successes, s.Failures = 0, 0
		case r == 0 && w.Unobservable > 0 && w.Successes == 0 && w.Failures == 0:
			s.Outcome = eligibility.Unobservable
			_ = e.Observe(s)
		}
	}
}

// share is part r of v split n ways, the remainder to the first parts.
func share(v uint32, n, r int) uint32 {
	q, rem := v/uint32(n), v%uint32(n)
	if uint32(r) < rem {
		q++
	}
	return q
}
