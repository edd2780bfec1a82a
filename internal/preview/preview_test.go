package preview_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/preview"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// flush is the evaluator's default window period (FlushEvery).
const flush = 10 * time.Second

func id(i int) uuid.UUID {
	var u uuid.UUID
	u[0], u[14], u[15] = 0x42, byte(i>>8), byte(i)
	return u
}

// hairTrigger is a contract that removes at a 5% failure rate, the
// platform floors otherwise kept.
func hairTrigger(caps eligibility.Capabilities) preview.Contract {
	c := eligibility.DefaultContract(caps)
	c.RemovalThreshold, c.ReentryThreshold = 0.05, 0.01
	if err := c.Validate(); err != nil {
		panic(err)
	}
	return preview.Contract{Eligibility: c, MinHealthyFraction: 0.5}
}

func defaults(caps eligibility.Capabilities) preview.Contract {
	return preview.Contract{Eligibility: eligibility.DefaultContract(caps), MinHealthyFraction: 0.5}
}

// lowGrade is ten minutes of probe windows for 10 instances in az1 and 10
// in az2, every 10 s, ten probes a window: all pass, but for az1's first
// six instances, which fail one probe in ten from minute 3 to minute 6 (a
// 10% failure rate, far below the default removal threshold of 50%).
func lowGrade() ([]preview.Instance, []preview.Window) {
	var ins []preview.Instance
	for i := range 20 {
		zone := "az1"
		if i >= 10 {
			zone = "az2"
		}
		ins = append(ins, preview.Instance{ID: id(i), Zone: zone})
	}
	var ws []preview.Window
	for end := t0.Add(flush); !end.After(t0.Add(10 * time.Minute)); end = end.Add(flush) {
		for i := range ins {
			w := preview.Window{Instance: ins[i].ID, Class: eligibility.Probe, End: end, Successes: 10, Reporters: 1}
			if i < 6 && end.After(t0.Add(3*time.Minute)) && !end.After(t0.Add(6*time.Minute)) {
				w.Successes, w.Failures = 9, 1
			}
			ws = append(ws, w)
		}
	}
	return ins, ws
}

var probeOnly = eligibility.Capabilities{Probe: true}

// TestHairTriggerRemovesMore: on the same recorded evidence a contract
// with a hair-trigger removal threshold previews more removals than the
// platform defaults, trips az1's guard (4 of 10 left), and the six
// instances it removes are the differences.
func TestHairTriggerRemovesMore(t *testing.T) {
	t.Parallel()
	ins, ws := lowGrade()
	res, err := preview.Run(preview.Input{
		Service: "web", Instances: ins, Windows: ws,
		Current: defaults(probeOnly), Proposed: hairTrigger(probeOnly),
		From: t0, To: t0.Add(10 * time.Minute),
	})
	if err != nil {
		t.Fatal(err)
	}
	cur, prop := res.Current, res.Proposed
	if cur.Removed != 0 || cur.Guard.Tripped || cur.FirstRemovalAt != nil {
		t.Errorf("current contract: removed %d, guard tripped %v; want none: %+v", cur.Removed, cur.Guard.Tripped, cur)
	}
	if prop.Removed != 6 || prop.Removed <= cur.Removed {
		t.Errorf("hair-trigger contract: removed %d, current %d; want 6 > current", prop.Removed, cur.Removed)
	}
	if prop.FirstRemovalAt == nil || !prop.FirstRemovalAt.Equal(t0.Add(3*time.Minute+flush)) {
		t.Errorf("first removal at %v; want at the first failing window, %v", prop.FirstRemovalAt, t0.Add(3*time.Minute+flush))
	}
	if !prop.Guard.Tripped || len(prop.Guard.Zones) != 1 || prop.Guard.Zones[0] != "az1" || prop.Guard.FirstTrippedAt == nil {
		t.Errorf("guard under the hair trigger: %+v; want az1 tripped", prop.Guard)
	}
	if prop.PeakIneligible != 6 {
		t.Errorf("peak out of rotation %d; want 6", prop.PeakIneligible)
	}
	if res.DiffsTotal != 6 || len(res.Differences) != 6 {
		t.Fatalf("differences %d (%d listed); want the 6 failing instances: %+v", res.DiffsTotal, len(res.Differences), res.Differences)
	}
	for i, d := range res.Differences {
		if d.InstanceID != id(i) || d.Zone != "az1" || d.Current.Removals != 0 || d.Proposed.Removals == 0 || d.Proposed.Worst != "ineligible" {
			t.Errorf("difference %d: %+v", i, d)
		}
	}
	if res.Windows != len(ws) || res.Instances != 20 {
		t.Errorf("replayed %d windows of %d instances; want %d of 20", res.Windows, res.Instances, len(ws))
	}
	// Both replays end with every instance heard and back in rotation
	// (the failures stopped 4 minutes before the end).
	if cur.Final.Eligible != 20 || cur.Unknown != 0 {
		t.Errorf("current final %+v", cur.Final)
	}
	if len(prop.Timeline) < 3 || prop.Timeline[0].At != t0 {
		t.Errorf("timeline %+v", prop.Timeline)
	}
}

// TestSameContractSameOutcome: previewing the contract in force against
// itself shows no difference, and a run is a function of its input.
func TestSameContractSameOutcome(t *testing.T) {
	t.Parallel()
	ins, ws := lowGrade()
	in := preview.Input{Service: "web", Instances: ins, Windows: ws,
		Current: hairTrigger(probeOnly), Proposed: hairTrigger(probeOnly), From: t0, To: t0.Add(10 * time.Minute)}
	a, err := preview.Run(in)
	if err != nil {
		t.Fatal(err)
	}
	b, err := preview.Run(in)
	if err != nil {
		t.Fatal(err)
	}
	if a.DiffsTotal != 0 || fmt.Sprint(a.Current) != fmt.Sprint(a.Proposed) {
		t.Errorf("one contract, two outcomes: %+v vs %+v", a.Current, a.Proposed)
	}
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Error("two runs on the same input differ")
	}
}

// TestPassiveSpreadOverReporters: a passive window heard from several
// callers acts as that many callers' evidence, so a contract needing two
// failing callers removes on it, and one needing more than the window's
// callers does not.
func TestPassiveSpreadOverReporters(t *testing.T) {
	t.Parallel()
	caps := eligibility.Capabilities{Passive: true}
	ins := []preview.Instance{{ID: id(1), Zone: "az1"}, {ID: id(2), Zone: "az1"}, {ID: id(3), Zone: "az1"}}
	var ws []preview.Window
	for k := 1; k <= 12; k++ {
		end := t0.Add(time.Duration(k) * flush)
		for i, x := range ins {
			w := preview.Window{Instance: x.ID, Class: eligibility.Passive, End: end, Successes: 300, Reporters: 3}
			if i == 0 && k > 3 {
				w.Successes, w.Failures = 30, 270
			}
			ws = append(ws, w)
		}
	}
	two, four := defaults(caps), defaults(caps)
	four.Eligibility.MinPassiveReporters = 4
	res, err := preview.Run(preview.Input{Service: "api", Instances: ins, Windows: ws, Current: four, Proposed: two,
		From: t0, To: t0.Add(2 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Proposed.Removed != 1 || res.Current.Removed != 0 {
		t.Errorf("removed: needing 2 callers %d, needing 4 %d; want 1 and 0", res.Proposed.Removed, res.Current.Removed)
	}
}

// TestTimelineBounded: a replay that changes its counts at every step
// keeps at most MaxTimeline points, the first and the last among them.
func TestTimelineBounded(t *testing.T) {
	t.Parallel()
	var ins []preview.Instance
	var ws []preview.Window
	for i := range 2 * preview.MaxTimeline {
		// Awaiting their first success, admitted one a second: the
		// count out of rotation falls by one at every step.
		ins = append(ins, preview.Instance{ID: id(i), Zone: "az1", Awaiting: true})
		ws = append(ws, preview.Window{Instance: id(i), Class: eligibility.Probe, End: t0.Add(time.Duration(i+1) * time.Second), Successes: 1})
	}
	to := t0.Add(time.Duration(len(ins)) * time.Second)
	res, err := preview.Run(preview.Input{Service: "web", Instances: ins, Windows: ws, Current: defaults(probeOnly), Proposed: defaults(probeOnly),
		From: t0, To: to})
	if err != nil {
		t.Fatal(err)
	}
	tl := res.Current.Timeline
	if len(tl) > preview.MaxTimeline || len(tl) < preview.MaxTimeline/2 {
		t.Fatalf("timeline of %d points; want at most %d (and not thinned to nothing)", len(tl), preview.MaxTimeline)
	}
	if !tl[0].At.Equal(t0) || tl[0].Counts.Ineligible != len(ins) {
		t.Errorf("first point %+v; want all %d awaiting at the start", tl[0], len(ins))
	}
	if last := tl[len(tl)-1]; !last.At.Equal(to) || last.Counts.Ineligible != 0 {
		t.Errorf("last point %+v; want every instance admitted at the end", last)
	}
	if res.Current.Removed != 0 || res.Current.Guard.Tripped {
		t.Errorf("admissions counted as removals or a trip: %+v", res.Current)
	}
}

func TestInvalidInput(t *testing.T) {
	t.Parallel()
	c := defaults(probeOnly)
	for name, in := range map[string]preview.Input{
		"to before from": {Service: "web", Current: c, Proposed: c, From: t0, To: t0.Add(-time.Second)},
		"duplicate":      {Service: "web", Current: c, Proposed: c, From: t0, To: t0, Instances: []preview.Instance{{ID: id(1)}, {ID: id(1)}}},
	} {
		if _, err := preview.Run(in); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// BenchmarkPreview1000Instances10Minutes previews a contract for a
// 1,000-instance service (probe, self and passive) over ten minutes of
// windows (one per class every 10 s: 180,000), a tenth of it failing a
// tenth of its probes and passive calls, both contracts replayed.
// Issue 30 asks for at most 1 s per preview.
func BenchmarkPreview1000Instances10Minutes(b *testing.B) {
	const n = 1000
	caps := eligibility.Capabilities{Probe: true, Self: true, Passive: true}
	ins := make([]preview.Instance, n)
	for i := range ins {
		ins[i] = preview.Instance{ID: id(i), Zone: fmt.Sprintf("az%d", i%3+1)}
	}
	var ws []preview.Window
	for end := t0.Add(flush); !end.After(t0.Add(10 * time.Minute)); end = end.Add(flush) {
		for i, x := range ins {
			failing := i%10 == 0 && end.After(t0.Add(2*time.Minute))
			for cl := range eligibility.Class(3) {
				w := preview.Window{Instance: x.ID, Class: cl, End: end, Successes: 2, Reporters: 1}
				switch {
				case cl == eligibility.Passive:
					w.Successes, w.Reporters = 200, 3
					if failing {
						w.Successes, w.Failures = 180, 20
					}
				case cl == eligibility.Probe && failing:
					w.Successes, w.Failures = 9, 1
				}
				ws = append(ws, w)
			}
		}
	}
	in := preview.Input{Service: "big", Instances: ins, Windows: ws, Current: defaults(caps), Proposed: hairTrigger(caps),
		From: t0, To: t0.Add(10 * time.Minute)}
	b.ReportAllocs()
	var res preview.Result
	for b.Loop() {
		var err error
		if res, err = preview.Run(in); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(ws)), "windows")
	b.ReportMetric(float64(res.Proposed.Removed), "removed-proposed")
	b.ReportMetric(float64(res.Current.Removed), "removed-current")
}
