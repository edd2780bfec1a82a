package eligibility_test

import (
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/musterhq/muster/internal/eligibility"
)

func dur(rt *rapid.T, lo, hi time.Duration, label string) time.Duration {
	return time.Duration(rapid.Int64Range(int64(lo), int64(hi)).Draw(rt, label))
}

// Silence alone never yields ineligible: from any state in rotation, no
// sequence of silences and unobservable reports removes an instance.
func TestPropSilenceNeverRemoves(t *testing.T) {
	t.Parallel()
	outcomes := []eligibility.Outcome{ok, ok, ok, fail, unobs, 0}
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(rt, eligibility.Options{})
		s.service("svc", eligibility.DefaultContract(allCaps))
		id := s.add(1, "svc")
		s.obs(id, probe, ok, 1)
		s.tick()
		for range rapid.IntRange(0, 90).Draw(rt, "warm") {
			s.now = s.now.Add(time.Second)
			for cl := range eligibility.Class(3) {
				if o := rapid.SampledFrom(outcomes).Draw(rt, "outcome"); o != 0 {
					s.obs(id, cl, o, eligibility.ReporterID(rapid.IntRange(1, 3).Draw(rt, "reporter")))
				}
			}
			s.tick()
		}
		if !s.state(id).InRotation() {
			rt.Skip("warm-up removed the instance")
		}
		from := len(s.all)
		for range rapid.IntRange(1, 60).Draw(rt, "steps") {
			s.now = s.now.Add(dur(rt, time.Millisecond, time.Minute, "gap"))
			if rapid.Bool().Draw(rt, "unobservable") {
				cl := eligibility.Class(rapid.IntRange(0, 2).Draw(rt, "class"))
				s.obs(id, cl, unobs, eligibility.ReporterID(rapid.IntRange(1, 3).Draw(rt, "reporter")))
			}
			s.tick()
		}
		for _, tr := range s.all[from:] {
			if tr.To == eligibility.Ineligible {
				rt.Fatalf("silence removed the instance: %+v", tr)
			}
		}
	})
}

// Re-entry is never faster than removal, for any valid contract and
// cadence: clean -> removed under all-failing takes no longer than
// removed -> re-entered under all-succeeding.
func TestPropReentryNotFasterThanRemoval(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		passiveClass := rapid.Bool().Draw(rt, "passive")
		c := contract(probeOnly)
		if passiveClass {
			c = contract(passiveOnly)
		}
		c.Interval = time.Duration(rapid.IntRange(1, 30).Draw(rt, "interval")) * time.Second
		c.RemovalThreshold = rapid.Float64Range(0.05, 0.95).Draw(rt, "removal")
		c.ReentryThreshold = rapid.Float64Range(0, c.RemovalThreshold*0.99).Draw(rt, "reentry")
		hlMax := 10 / math.Log2(1/(1-c.RemovalThreshold))
		c.HalfLife = time.Duration(min(rapid.Float64Range(0.5, 30).Draw(rt, "halflife"), hlMax) * float64(time.Second))
		c.MinDwell = time.Duration(rapid.IntRange(5, 600).Draw(rt, "dwell")) * time.Second
		if err := c.Validate(); err != nil {
			rt.Fatalf("generated an invalid contract: %v", err)
		}
		period := c.Interval
		if passiveClass {
			period = time.Duration(rapid.IntRange(1, int(c.Interval/(100*time.Millisecond))).Draw(rt, "period")) * 100 * time.Millisecond
		}
		s := newSim(rt, eligibility.Options{})
		s.service("svc", c)
		id := s.add(1, "svc")
		failing := false
		var firstFail time.Time
		feed := func(now time.Time) {
			smp := eligibility.Sample{Instance: id, Class: probe, Outcome: ok, Reporter: 1}
			if passiveClass {
				smp.Class = passive
			}
			if failing {
				smp.Outcome = fail
				if firstFail.IsZero() {
					firstFail = now
				}
			}
			s.sample(smp)
			if passiveClass { // two callers: the population that may remove
				smp.Reporter = 2
				s.sample(smp)
			}
		}
		s.run(time.Duration(rapid.IntRange(1, 20).Draw(rt, "warm"))*period, period, feed)
		if got := s.state(id); got != eligibility.Eligible {
			rt.Fatalf("warm-up: %v", got)
		}
		failing = true
		var removedAt time.Time
		for i := 0; i < 10000 && removedAt.IsZero(); i++ {
			s.now = s.now.Add(period)
			feed(s.now)
			for _, tr := range s.tick() {
				if tr.To == eligibility.Ineligible {
					removedAt = tr.At
				}
			}
		}
		failing = false
		var backAt time.Time
		for i := 0; i < 100000 && backAt.IsZero(); i++ {
			s.now = s.now.Add(period)
			feed(s.now)
			for _, tr := range s.tick() {
				if tr.To.InRotation() {
					backAt = tr.At
				}
			}
		}
		if removedAt.IsZero() || backAt.IsZero() {
			rt.Fatalf("removed %v, back %v", removedAt, backAt)
		}
		if rm, re := removedAt.Sub(firstFail), backAt.Sub(removedAt); rm > re {
			rt.Fatalf("removal took %v, re-entry only %v", rm, re)
		}
	})
}

// A marginal instance whose callers see a failure fraction alternating
// between 40% and 60% changes state at most once in 30 minutes.
func TestPropMarginalDoesNotOscillate(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(rt, eligibility.Options{})
		s.service("svc", contract(passiveOnly))
		id := s.add(1, "svc")
		reporters := rapid.IntRange(1, 8).Draw(rt, "reporters")
		vol := rapid.IntRange(20, 200).Draw(rt, "requests per report")
		p := rapid.SampledFrom([]float64{0.4, 0.6}).Draw(rt, "first phase")
		phaseEnd := s.now.Add(dur(rt, 10*time.Second, 5*time.Minute, "phase"))
		s.run(30*time.Minute, time.Second, func(now time.Time) {
			if !now.Before(phaseEnd) {
				p = 1 - p
				phaseEnd = now.Add(dur(rt, 10*time.Second, 5*time.Minute, "phase"))
			}
			for r := range reporters {
				f := p + rapid.Float64Range(-0.05, 0.05).Draw(rt, "jitter")
				fails := uint32(math.Round(f * float64(vol)))
				s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: eligibility.ReporterID(r + 1),
					Failures: fails, Successes: uint32(vol) - fails})
			}
		})
		changes := 0
		for _, tr := range s.all {
			if tr.From != tr.To {
				changes++
			}
		}
		if changes > 1 {
			rt.Fatalf("%d state changes in 30 minutes: %+v", changes, s.all)
		}
	})
}

// A prober partition that silences 30% of the probers moves no instance
// to ineligible, and the outage is attributed to exactly those probers.
func TestPropProberPartition(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		const nProbers, nInstances = 10, 40
		s := newSim(rt, eligibility.Options{})
		s.service("probe-only", contract(probeOnly))
		s.service("probe+passive", contract(eligibility.Capabilities{Probe: true, Passive: true}))
		assign := map[eligibility.ReporterID][]eligibility.InstanceID{}
		probersOf := make([][]eligibility.ReporterID, nInstances)
		ids := make([]eligibility.InstanceID, nInstances)
		hasPassive := make([]bool, nInstances)
		for i := range ids {
			hasPassive[i] = rapid.Bool().Draw(rt, "passive")
			svc := "probe-only"
			if hasPassive[i] {
				svc = "probe+passive"
			}
			ids[i] = s.add(i, svc)
			a := eligibility.ReporterID(rapid.IntRange(1, nProbers).Draw(rt, "prober"))
			b := eligibility.ReporterID(rapid.IntRange(1, nProbers).Draw(rt, "prober"))
			for _, p := range []eligibility.ReporterID{a, b} {
				assign[p] = append(assign[p], ids[i])
			}
			probersOf[i] = []eligibility.ReporterID{a, b}
		}
		for p, ts := range assign {
			s.e.AssignProber(p, ts)
		}
		silenced := map[eligibility.ReporterID]bool{}
		for _, p := range rapid.Permutation([]eligibility.ReporterID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}).Draw(rt, "order")[:3] {
			silenced[p] = true
		}
		partitionAt := s.now.Add(dur(rt, 10*time.Second, 5*time.Minute, "partition at"))
		feed := func(now time.Time) {
			for i, id := range ids {
				if now.Sub(t0)%(5*time.Second) == 0 {
					for _, p := range probersOf[i] {
						if !silenced[p] || now.Before(partitionAt) {
							s.obs(id, probe, ok, p)
						}
					}
				}
				if hasPassive[i] && rapid.Bool().Draw(rt, "traffic") {
					s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 500, Successes: 10})
				}
			}
		}
		s.run(partitionAt.Sub(s.now)+10*time.Minute, time.Second, feed)
		for _, tr := range s.all {
			if tr.To == eligibility.Ineligible {
				rt.Fatalf("partition removed an instance: %+v", tr)
			}
		}
		for _, o := range s.e.ProberOutages() {
			if !silenced[o.Prober] {
				rt.Fatalf("healthy prober %d reported in outage", o.Prober)
			}
		}
		for p := range silenced {
			if _, assigned := assign[p]; !assigned {
				continue
			}
			found := false
			for _, o := range s.e.ProberOutages() {
				found = found || o.Prober == p
			}
			if !found {
				rt.Fatalf("silenced prober %d not reported in outage", p)
			}
		}
	})
}

// Quarantine durations go 1, 2, 4, 8, 16, 30, 30 minutes for an instance
// that keeps flapping, whatever its reporting cadence.
func TestPropQuarantineEscalates(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(rt, eligibility.Options{})
		s.service("svc", contract(passiveOnly))
		id := s.add(1, "svc")
		period := time.Duration(rapid.IntRange(1, 5).Draw(rt, "period")) * time.Second
		var got []time.Duration
		for step := 0; step < 20000 && len(got) < 7; step++ {
			s.now = s.now.Add(time.Second)
			if s.now.Sub(t0)%period == 0 {
				smp := eligibility.Sample{Instance: id, Class: passive, Reporter: 1, Successes: 10}
				if s.state(id).InRotation() {
					smp.Successes, smp.Failures = 0, 10
				}
				s.sample(smp)
				smp.Reporter = 2
				s.sample(smp)
			}
			for _, tr := range s.tick() {
				if !tr.QuarantinedUntil.IsZero() {
					got = append(got, tr.QuarantinedUntil.Sub(tr.At))
				}
			}
		}
		want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
		if len(got) != len(want) {
			rt.Fatalf("quarantines %v, want %d", got, len(want))
		}
		for i := range want {
			if got[i] != want[i]*time.Minute {
				rt.Fatalf("quarantines %v, want %v minutes", got, want)
			}
		}
	})
}

// A quarantine restored after a restart, at any moment of it or after it,
// carries on as if there had been no restart: the instance stays out until
// its end, and the next quarantine lasts twice as long (to the cap), or
// QuarantineBase again when it starts QuarantineForgive after the end.
func TestPropRestoredQuarantineEscalates(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(rt, eligibility.Options{})
		s.service("svc", contract(passiveOnly))
		id := s.add(1, "svc")
		var last *eligibility.Transition
		for range rapid.IntRange(1, 6).Draw(rt, "quarantines") {
			if last = s.flap(id, passive, 2*time.Hour); last == nil {
				rt.Fatalf("never quarantined")
			}
		}
		// The restarted engine knows nothing but the quarantine.
		r := newSim(rt, eligibility.Options{})
		r.now = last.At.Add(time.Duration(rapid.IntRange(0, 90*60).Draw(rt, "restart after (s)")) * time.Second)
		r.service("svc", contract(passiveOnly))
		r.add(1, "svc")
		q := eligibility.Quarantine{Start: last.At, Until: last.QuarantinedUntil, Step: last.QuarantineStep}
		if err := r.e.RestoreQuarantine(id, q, r.now); err != nil {
			rt.Fatalf("restore: %v", err)
		}
		end := r.now
		if q.Until.After(end) {
			end = q.Until
		}
		for end = end.Add(2 * time.Minute); r.now.Before(end); {
			r.now = r.now.Add(time.Second)
			r.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 1, Successes: 10})
			r.tick()
			if r.state(id).InRotation() && r.now.Before(q.Until) {
				rt.Fatalf("back in rotation at %v, quarantined until %v", r.now, q.Until)
			}
		}
		next := r.flap(id, passive, 2*time.Hour)
		if next == nil {
			rt.Fatalf("never quarantined after the restart")
		}
		want := min(time.Minute<<q.Step, 30*time.Minute)
		if next.At.Sub(q.Until) >= time.Hour {
			want = time.Minute
		}
		if got := next.QuarantinedUntil.Sub(next.At); got != want {
			rt.Fatalf("quarantine after the restart lasts %v, want %v (restored %+v)", got, want, q)
		}
	})
}

// With platform defaults a genuine soft failure (every sample of every
// class failing from some moment) is removed at most 5 s after the first
// failing sample, for any mix of classes and cadences (passive: two to
// five reporters, the population that may remove, flushing at least every
// second). A hard failure from the only class present (probe or self) is
// removed at 0 s; with more classes the first hard failure is contradicted
// by the classes still healthy until they fail too, which the same 5 s
// bound covers, and a passive hard failure is a strong vote, never the
// fast path.
func TestPropDetectionBound(t *testing.T) {
	t.Parallel()
	const tick = 50 * time.Millisecond
	rapid.Check(t, func(rt *rapid.T) {
		caps := eligibility.Capabilities{
			Probe: rapid.Bool().Draw(rt, "probe"), Self: rapid.Bool().Draw(rt, "self"),
			Passive: rapid.Bool().Draw(rt, "passive"), Readiness: true,
		}
		if !caps.Probe && !caps.Self && !caps.Passive {
			caps.Probe = true
		}
		isHard := rapid.Bool().Draw(rt, "hard")
		c := eligibility.DefaultContract(caps)
		c.SlowStart = 0
		s := newSim(rt, eligibility.Options{})
		s.service("svc", c)
		id := s.add(1, "svc")
		type source struct {
			cl            eligibility.Class
			rep           eligibility.ReporterID
			period, phase time.Duration
			vol           uint32
		}
		var srcs []source
		slots := func(lo, hi time.Duration, label string) time.Duration {
			return time.Duration(rapid.Int64Range(int64(lo/tick), int64(hi/tick)).Draw(rt, label)) * tick
		}
		if caps.Probe {
			srcs = append(srcs, source{cl: probe, rep: 1, period: 5 * time.Second, phase: slots(0, 5*time.Second-tick, "phase")})
		}
		if caps.Self {
			srcs = append(srcs, source{cl: self, rep: 2, period: 5 * time.Second, phase: slots(0, 5*time.Second-tick, "phase")})
		}
		if caps.Passive {
			for r := range rapid.IntRange(2, 5).Draw(rt, "reporters") {
				p := slots(tick, time.Second, "period")
				srcs = append(srcs, source{cl: passive, rep: eligibility.ReporterID(100 + r), period: p,
					phase: slots(0, p-tick, "phase"), vol: uint32(rapid.IntRange(1, 50).Draw(rt, "volume"))})
			}
		}
		failing := false
		var firstFail time.Time
		feed := func(now time.Time) {
			for _, src := range srcs {
				if (now.Sub(t0)-src.phase)%src.period != 0 {
					continue
				}
				smp := eligibility.Sample{Instance: id, Class: src.cl, Reporter: src.rep, Outcome: ok}
				if failing {
					smp.Outcome = fail
					if isHard {
						smp.Outcome = hard
					}
					if firstFail.IsZero() {
						firstFail = now
					}
				}
				if src.cl == passive && !(failing && isHard) {
					smp.Successes = src.vol
					if failing {
						smp.Successes, smp.Failures = 0, src.vol
					}
				}
				s.sample(smp)
			}
		}
		s.run(slots(time.Minute, 3*time.Minute, "warm"), tick, feed)
		if got := s.state(id); got != eligibility.Eligible {
			rt.Fatalf("warm-up: %v", got)
		}
		failing = true
		from := len(s.all)
		s.run(15*time.Second, tick, feed)
		var removal *eligibility.Transition
		for i := range s.all[from:] {
			if tr := &s.all[from+i]; tr.To == eligibility.Ineligible {
				removal = tr
				break
			}
		}
		if removal == nil {
			rt.Fatalf("not removed within 15 s")
		}
		limit := 5 * time.Second
		if isHard && len(srcs) == 1 && srcs[0].cl != passive {
			limit = 0
		}
		if cost := removal.At.Sub(firstFail); cost > limit {
			rt.Fatalf("removed %v after the first failing sample, limit %v (%+v)", cost, limit, removal)
		}
		if !removal.FirstFailureAt.Equal(firstFail) {
			rt.Fatalf("FirstFailureAt %v, want %v", removal.FirstFailureAt, firstFail)
		}
	})
}

// A single evidence class never moves an instance from unknown straight to
// ineligible, whatever it reports (hard failures and unready dependencies
// included).
func TestPropSingleClassCannotRemoveUnknown(t *testing.T) {
	t.Parallel()
	outcomes := []eligibility.Outcome{ok, fail, fail, hard, unobs}
	rapid.Check(t, func(rt *rapid.T) {
		c := contract(allCaps)
		c.Dependencies = map[string]eligibility.Dependency{"cache": {Authority: eligibility.Unready}}
		s := newSim(rt, eligibility.Options{})
		s.service("svc", c)
		id := s.add(1, "svc")
		s.run(time.Minute, time.Second, healthy(s, id))
		s.run(time.Duration(rapid.IntRange(16, 120).Draw(rt, "silence"))*time.Second, time.Second, nil)
		if got := s.state(id); got != eligibility.Unknown {
			rt.Fatalf("after silence: %v", got)
		}
		cl := eligibility.Class(rapid.IntRange(0, 2).Draw(rt, "class"))
		for range rapid.IntRange(1, 100).Draw(rt, "steps") {
			s.now = s.now.Add(dur(rt, 100*time.Millisecond, 10*time.Second, "gap"))
			smp := eligibility.Sample{Instance: id, Class: cl, Outcome: rapid.SampledFrom(outcomes).Draw(rt, "outcome"),
				Reporter: eligibility.ReporterID(rapid.IntRange(1, 4).Draw(rt, "reporter"))}
			if cl == self && rapid.Bool().Draw(rt, "dependency") {
				smp.Dependency = "cache"
			}
			s.sample(smp)
			s.tick()
		}
		for _, tr := range s.all {
			if tr.From == eligibility.Unknown && tr.To == eligibility.Ineligible {
				rt.Fatalf("single class %v removed an unknown instance: %+v", cl, tr)
			}
		}
	})
}

// Slow start: under all-success the weight never falls, reaches 1 exactly
// when SlowStart has passed, and changes at most SlowStartSteps times.
func TestPropSlowStart(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		c := contract(probeOnly)
		c.SlowStart = time.Duration(rapid.IntRange(0, 600).Draw(rt, "slow start")) * time.Second
		steps := rapid.IntRange(2, 20).Draw(rt, "steps")
		s := newSim(rt, eligibility.Options{SlowStartSteps: steps})
		s.service("svc", c)
		id := s.add(1, "svc")
		tickEvery := time.Duration(rapid.IntRange(1, 10).Draw(rt, "tick")) * 100 * time.Millisecond
		s.obs(id, probe, ok, 1)
		s.tick()
		entered := s.now
		prev := 0.0
		for s.now.Sub(entered) <= c.SlowStart+time.Second {
			s.now = s.now.Add(tickEvery)
			s.obs(id, probe, ok, 1)
			s.tick()
			v := s.verdict(id)
			if v.Weight < prev {
				rt.Fatalf("weight fell from %v to %v at %v", prev, v.Weight, s.now.Sub(entered))
			}
			prev = v.Weight
			if reached := s.now.Sub(entered) >= c.SlowStart; reached != (v.Weight == 1) {
				rt.Fatalf("weight %v at %v of a %v slow start", v.Weight, s.now.Sub(entered), c.SlowStart)
			}
		}
		changes, w := 0, 0.0
		for _, tr := range s.all {
			if tr.Weight != w {
				changes, w = changes+1, tr.Weight
			}
		}
		if changes > steps {
			rt.Fatalf("%d weight changes for %d steps: %+v", changes, steps, s.all)
		}
	})
}

// (a) A partitioned prober that reports failure (or hard failure) on every
// target, while each target's self-report and/or callers (or a peer prober,
// for a probe-only service) say healthy, removes nothing, ever; it becomes
// suspect once it meets the threshold (contradicted on at least 3 targets,
// half of those it reports on), and no healthy prober ever does. Once
// suspect it removes nothing even when the evidence that contradicted it
// falls silent.
func TestPropPartitionedProberRemovesNothing(t *testing.T) {
	t.Parallel()
	shapes := []struct {
		name string
		caps eligibility.Capabilities
	}{
		{"probe+self", eligibility.Capabilities{Probe: true, Self: true, Readiness: true}},
		{"probe+passive", eligibility.Capabilities{Probe: true, Passive: true}},
		{"probe+self+passive", allCaps},
		{"probe only, peer prober", probeOnly},
	}
	rapid.Check(t, func(rt *rapid.T) {
		shape := rapid.SampledFrom(shapes).Draw(rt, "shape")
		outcome := rapid.SampledFrom([]eligibility.Outcome{fail, hard}).Draw(rt, "outcome")
		c := contract(shape.caps)
		peerOnly := !shape.caps.Self && !shape.caps.Passive
		if peerOnly {
			// One failing prober against one healthy is just under 0.5.
			c.RemovalThreshold = rapid.SampledFrom([]float64{0.3, 0.4, 0.5}).Draw(rt, "removal")
		}
		s := newSim(rt, eligibility.Options{})
		s.service("svc", c)
		const bad eligibility.ReporterID = 1
		nBad := rapid.IntRange(1, 8).Draw(rt, "bad prober's targets")
		nOther := rapid.IntRange(0, 4).Draw(rt, "other targets")
		var ids []eligibility.InstanceID
		probersOf := map[eligibility.InstanceID][]eligibility.ReporterID{}
		assign := map[eligibility.ReporterID][]eligibility.InstanceID{}
		for n := range nBad + nOther {
			id := s.add(n, "svc")
			ids = append(ids, id)
			var ps []eligibility.ReporterID
			if n < nBad {
				ps = append(ps, bad)
			}
			// A peer prober: always for a probe-only service's targets,
			// at random otherwise.
			if n >= nBad || peerOnly || rapid.Bool().Draw(rt, "peer") {
				ps = append(ps, eligibility.ReporterID(rapid.IntRange(2, 3).Draw(rt, "peer prober")))
			}
			probersOf[id] = ps
			for _, p := range ps {
				assign[p] = append(assign[p], id)
			}
		}
		for p, ts := range assign {
			s.e.AssignProber(p, ts)
		}
		callers := rapid.IntRange(2, 4).Draw(rt, "callers")
		phase := time.Duration(rapid.IntRange(0, 4).Draw(rt, "phase")) * time.Second
		partitionAt := t0.Add(dur(rt, 10*time.Second, 3*time.Minute, "partition at"))
		feed := func(now time.Time) {
			for _, id := range ids {
				if (now.Sub(t0)-phase)%(5*time.Second) == 0 {
					for _, p := range probersOf[id] {
						o := ok
						if p == bad && !now.Before(partitionAt) {
							o = outcome
						}
						s.obs(id, probe, o, p)
					}
				}
				if shape.caps.Self && now.Sub(t0)%(5*time.Second) == 0 {
					s.obs(id, self, ok, 50)
				}
				if shape.caps.Passive {
					for r := range callers {
						s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: eligibility.ReporterID(100 + r), Successes: 1})
					}
				}
			}
		}
		s.run(partitionAt.Sub(s.now)+dur(rt, time.Minute, 10*time.Minute, "partition lasts"), time.Second, feed)
		if nBad >= 3 && rapid.Bool().Draw(rt, "silence the rest") {
			// Only the suspect prober still reports.
			s.run(dur(rt, 20*time.Second, 5*time.Minute, "silence lasts"), time.Second, every(5*time.Second, func(time.Time) {
				for _, id := range ids[:nBad] {
					s.obs(id, probe, outcome, bad)
				}
			}))
			for _, id := range ids[:nBad] {
				if got := s.state(id); got != eligibility.Unknown {
					rt.Fatalf("target of the suspect prober, all else silent: %v, want unknown", got)
				}
			}
		}
		admitted := map[eligibility.InstanceID]bool{}
		for _, tr := range s.all {
			if tr.To == eligibility.Ineligible {
				rt.Fatalf("the partitioned prober removed an instance: %+v", tr)
			}
			admitted[tr.Instance] = admitted[tr.Instance] || tr.To.InRotation()
		}
		for _, id := range ids {
			if !admitted[id] || !s.state(id).InRotation() {
				rt.Fatalf("instance %v out of rotation: %+v", id, s.verdict(id))
			}
		}
		sus := s.e.ProberSuspects()
		for _, p := range sus {
			if p.Prober != bad {
				rt.Fatalf("healthy prober suspect: %+v", p)
			}
		}
		if wantSuspect := nBad >= 3; wantSuspect != (len(sus) == 1) {
			rt.Fatalf("prober failing on %d targets: suspects %+v", nBad, sus)
		}
	})
}

// (b) A single passive reporter, whatever its volume and outcomes (hard
// failures included), never removes an instance while another class is
// healthy, nor alone with MinPassiveReporters 2, however many healthy
// callers it is mixed with.
func TestPropSingleCallerRemovesNothing(t *testing.T) {
	t.Parallel()
	shapes := []eligibility.Capabilities{
		passiveOnly,
		{Probe: true, Passive: true},
		{Self: true, Passive: true, Readiness: true},
		allCaps,
	}
	rapid.Check(t, func(rt *rapid.T) {
		caps := rapid.SampledFrom(shapes).Draw(rt, "capabilities")
		s := newSim(rt, eligibility.Options{})
		s.service("svc", contract(caps))
		id := s.add(1, "svc")
		healthyCallers := rapid.IntRange(0, 4).Draw(rt, "healthy callers")
		others := func(now time.Time) {
			if now.Sub(t0)%(5*time.Second) == 0 {
				if caps.Probe {
					s.obs(id, probe, ok, 1)
				}
				if caps.Self {
					s.obs(id, self, ok, 2)
				}
			}
			for r := range healthyCallers {
				s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: eligibility.ReporterID(200 + r), Successes: 5})
			}
		}
		s.run(time.Minute, time.Second, others)
		if !s.state(id).InRotation() {
			rt.Fatalf("warm-up: %+v", s.verdict(id))
		}
		for range rapid.IntRange(1, 300).Draw(rt, "steps") {
			s.now = s.now.Add(dur(rt, 50*time.Millisecond, 2*time.Second, "gap"))
			others(s.now)
			smp := eligibility.Sample{Instance: id, Class: passive, Reporter: 100}
			switch rapid.IntRange(0, 3).Draw(rt, "kind") {
			case 0:
				smp.Outcome = hard
			case 1:
				smp.Outcome = fail
			case 2:
				smp.Failures = uint32(rapid.IntRange(1, 100000).Draw(rt, "failures"))
				smp.Successes = uint32(rapid.IntRange(0, 10).Draw(rt, "successes"))
			default:
				smp.Outcome = ok
			}
			s.sample(smp)
			s.tick()
		}
		for _, tr := range s.all {
			if tr.To == eligibility.Ineligible {
				rt.Fatalf("one caller removed the instance: %+v (verdict %+v)", tr, s.verdict(id))
			}
		}
	})
}

// (c) A genuine failure seen by two classes (every sample of both failing
// from some moment; probe from one or two probers, passive from two to five
// callers) is removed within the 5 s damping budget of doc.go, soft or hard:
// contradiction never holds back a failure that two classes see.
func TestPropTwoClassFailureRemoves(t *testing.T) {
	t.Parallel()
	const tick = 50 * time.Millisecond
	pairs := [][2]eligibility.Class{{probe, self}, {probe, passive}, {self, passive}}
	rapid.Check(t, func(rt *rapid.T) {
		pair := rapid.SampledFrom(pairs).Draw(rt, "classes")
		var caps eligibility.Capabilities
		for _, cl := range pair {
			switch cl {
			case probe:
				caps.Probe = true
			case self:
				caps.Self, caps.Readiness = true, true
			default:
				caps.Passive = true
			}
		}
		isHard := rapid.Bool().Draw(rt, "hard")
		s := newSim(rt, eligibility.Options{})
		s.service("svc", contract(caps))
		id := s.add(1, "svc")
		type source struct {
			cl            eligibility.Class
			rep           eligibility.ReporterID
			period, phase time.Duration
			vol           uint32
		}
		slots := func(lo, hi time.Duration, label string) time.Duration {
			return time.Duration(rapid.Int64Range(int64(lo/tick), int64(hi/tick)).Draw(rt, label)) * tick
		}
		var srcs []source
		if caps.Probe {
			for p := range rapid.IntRange(1, 2).Draw(rt, "probers") {
				rep := eligibility.ReporterID(10 + p)
				srcs = append(srcs, source{cl: probe, rep: rep, period: 5 * time.Second, phase: slots(0, 5*time.Second-tick, "phase")})
				s.e.AssignProber(rep, []eligibility.InstanceID{id})
			}
		}
		if caps.Self {
			srcs = append(srcs, source{cl: self, rep: 2, period: 5 * time.Second, phase: slots(0, 5*time.Second-tick, "phase")})
		}
		if caps.Passive {
			for r := range rapid.IntRange(2, 5).Draw(rt, "callers") {
				p := slots(tick, time.Second, "period")
				srcs = append(srcs, source{cl: passive, rep: eligibility.ReporterID(100 + r), period: p,
					phase: slots(0, p-tick, "phase"), vol: uint32(rapid.IntRange(1, 50).Draw(rt, "volume"))})
			}
		}
		failing := false
		var firstFail time.Time
		feed := func(now time.Time) {
			for _, src := range srcs {
				if (now.Sub(t0)-src.phase)%src.period != 0 {
					continue
				}
				smp := eligibility.Sample{Instance: id, Class: src.cl, Reporter: src.rep, Outcome: ok}
				if failing {
					smp.Outcome = fail
					if isHard {
						smp.Outcome = hard
					}
					if firstFail.IsZero() {
						firstFail = now
					}
				}
				if src.cl == passive && !(failing && isHard) {
					smp.Successes = src.vol
					if failing {
						smp.Successes, smp.Failures = 0, src.vol
					}
				}
				s.sample(smp)
			}
		}
		s.run(slots(time.Minute, 3*time.Minute, "warm"), tick, feed)
		if got := s.state(id); got != eligibility.Eligible {
			rt.Fatalf("warm-up: %v", got)
		}
		failing = true
		from := len(s.all)
		s.run(15*time.Second, tick, feed)
		var removal *eligibility.Transition
		for i := range s.all[from:] {
			if tr := &s.all[from+i]; tr.To == eligibility.Ineligible {
				removal = tr
				break
			}
		}
		if removal == nil {
			rt.Fatalf("not removed within 15 s: %+v", s.all[from:])
		}
		if cost := removal.At.Sub(firstFail); cost > 5*time.Second || !removal.FirstFailureAt.Equal(firstFail) {
			rt.Fatalf("removed %v after the first failing sample at %v, budget 5 s (%+v)", cost, firstFail, removal)
		}
	})
}
