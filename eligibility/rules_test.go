package eligibility_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/eligibility"
)

const (
	probe   = eligibility.Probe
	self    = eligibility.Self
	passive = eligibility.Passive
	ok      = eligibility.Success
	fail    = eligibility.Failure
	hard    = eligibility.HardFailure
	unobs   = eligibility.Unobservable
)

// healthy feeds every class of allCaps a success: probe and self every 5 s,
// passive from three callers every second at 10 requests each.
func healthy(s *sim, id eligibility.InstanceID) func(time.Time) {
	return feedAll(s, id, 0)
}

// feedAll is healthy with every passive request and every probe and self
// sample failing when failing is 1.
func feedAll(s *sim, id eligibility.InstanceID, failing int) func(time.Time) {
	o := ok
	if failing == 1 {
		o = fail
	}
	return func(now time.Time) {
		if now.Sub(t0)%(5*time.Second) == 0 {
			s.obs(id, probe, o, 1)
			s.obs(id, self, o, 2)
		}
		if now.Sub(t0)%time.Second == 0 {
			for r := range 3 {
				s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: eligibility.ReporterID(100 + r),
					Successes: uint32(10 * (1 - failing)), Failures: uint32(10 * failing)})
			}
		}
	}
}

func hasReason(v eligibility.Verdict, sub string) bool {
	for _, r := range v.Reasons {
		if strings.Contains(r, sub) {
			return true
		}
	}
	return false
}

func TestAdmission(t *testing.T) {
	t.Parallel()
	requireReady := contract(allCaps)
	requireReady.RequireReadiness = true
	tests := []struct {
		name        string
		c           eligibility.Contract
		samples     []eligibility.Class // successes, one per tick
		want        eligibility.State
		healthKnown bool
	}{
		{"probe service enters on first success", contract(probeOnly), []eligibility.Class{probe}, eligibility.Eligible, true},
		{"probe service waits without success", contract(probeOnly), nil, eligibility.Ineligible, false},
		{"require readiness ignores a probe success", requireReady, []eligibility.Class{probe}, eligibility.Ineligible, true},
		{"require readiness enters on self", requireReady, []eligibility.Class{probe, self}, eligibility.Eligible, true},
		{"no readiness signal: eligible, health unknown", contract(passiveOnly), nil, eligibility.Eligible, false},
		{"no readiness signal: evidence makes health known", contract(passiveOnly), []eligibility.Class{passive}, eligibility.Eligible, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newSim(t, eligibility.Options{})
			s.service("svc", tt.c)
			id := s.add(1, "svc")
			for _, cl := range tt.samples {
				s.now = s.now.Add(time.Second)
				s.obs(id, cl, ok, 1)
				s.tick()
			}
			s.now = s.now.Add(time.Second)
			s.tick()
			v := s.verdict(id)
			if v.State != tt.want || v.HealthKnown != tt.healthKnown {
				t.Fatalf("state %v health known %v, want %v %v (reasons %q)", v.State, v.HealthKnown, tt.want, tt.healthKnown, v.Reasons)
			}
		})
	}
	t.Run("failures keep a new instance out", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, eligibility.Options{})
		s.service("svc", contract(probeOnly))
		id := s.add(1, "svc")
		s.run(30*time.Second, time.Second, every(5*time.Second, func(time.Time) { s.obs(id, probe, fail, 1) }))
		if got := s.state(id); got != eligibility.Ineligible || len(s.all) != 0 {
			t.Fatalf("state %v after failures, transitions %v; want ineligible and none", got, s.all)
		}
	})
}

func TestHardFailure(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		fail func(s *sim, id eligibility.InstanceID)
	}{
		{"connection refused from the prober", func(s *sim, id eligibility.InstanceID) { s.obs(id, probe, hard, 1) }},
		{"process gone", func(s *sim, id eligibility.InstanceID) { s.e.HardFail(id, "process gone", s.now) }},
		{"lease expired", func(s *sim, id eligibility.InstanceID) { s.e.HardFail(id, "lease expired", s.now) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newSim(t, eligibility.Options{})
			s.service("svc", contract(allCaps))
			id := s.add(1, "svc")
			s.run(time.Minute, time.Second, healthy(s, id)) // passive primary, every class at 0
			s.now = s.now.Add(time.Second)
			tt.fail(s, id)
			trs := s.tick()
			if len(trs) != 1 || trs[0].To != eligibility.Ineligible || !trs[0].At.Equal(s.now) || !trs[0].FirstFailureAt.Equal(s.now) {
				t.Fatalf("transitions after hard failure = %+v; want one removal at %v with zero damping cost", trs, s.now)
			}
			removed := s.now
			// Back to all-healthy evidence: out for at least the dwell.
			s.run(2*time.Minute, time.Second, healthy(s, id))
			back := s.all[len(s.all)-1]
			for _, tr := range s.all {
				if tr.To.InRotation() && tr.At.After(removed) {
					back = tr
					break
				}
			}
			if !back.To.InRotation() || back.At.Sub(removed) < 30*time.Second {
				t.Fatalf("re-entry %+v came less than the 30 s dwell after removal at %v", back, removed)
			}
		})
	}
}

func TestSoftFailureDetection(t *testing.T) {
	t.Parallel()
	// Platform defaults: a genuine soft failure is removed at most 5 s
	// after its first failing sample, whatever the class cadence.
	for _, tt := range []struct {
		name    string
		caps    eligibility.Capabilities
		cl      eligibility.Class
		period  time.Duration
		maxCost time.Duration
	}{
		{"probe every 5 s", probeOnly, probe, 5 * time.Second, 0},
		{"passive every 1 s", passiveOnly, passive, time.Second, 3 * time.Second},
		{"passive every 250 ms", passiveOnly, passive, 250 * time.Millisecond, 4 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newSim(t, eligibility.Options{})
			s.service("svc", contract(tt.caps))
			id := s.add(1, "svc")
			o := ok
			var firstFail time.Time
			feed := every(tt.period, func(now time.Time) {
				if tt.cl == passive {
					smp := eligibility.Sample{Instance: id, Class: passive, Reporter: 7, Successes: 5}
					if o == fail {
						smp.Successes, smp.Failures = 0, 5
					}
					s.sample(smp)
				} else {
					s.obs(id, tt.cl, o, 1)
				}
				if o == fail && firstFail.IsZero() {
					firstFail = now
				}
			})
			s.run(time.Minute, 50*time.Millisecond, feed)
			o = fail
			s.run(20*time.Second, 50*time.Millisecond, feed)
			var removal *eligibility.Transition
			for i := range s.all {
				if s.all[i].To == eligibility.Ineligible {
					removal = &s.all[i]
					break
				}
			}
			if removal == nil {
				t.Fatal("never removed")
			}
			if cost := removal.At.Sub(firstFail); cost > tt.maxCost || cost > 5*time.Second {
				t.Fatalf("removed %v after the first failing sample, want at most %v", cost, tt.maxCost)
			}
			if !removal.FirstFailureAt.Equal(firstFail) {
				t.Errorf("FirstFailureAt = %v, want %v", removal.FirstFailureAt, firstFail)
			}
		})
	}
}

func TestSilence(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T) (*sim, eligibility.InstanceID) {
		s := newSim(t, eligibility.Options{})
		s.service("svc", contract(allCaps))
		id := s.add(1, "svc")
		s.run(time.Minute, time.Second, healthy(s, id))
		if got := s.state(id); got != eligibility.Eligible {
			t.Fatalf("setup: state %v", got)
		}
		return s, id
	}
	t.Run("all classes silent: unknown, in rotation", func(t *testing.T) {
		t.Parallel()
		s, id := setup(t)
		s.run(20*time.Second, time.Second, nil)
		v := s.verdict(id)
		if v.State != eligibility.Unknown || !v.State.InRotation() || v.HealthKnown || !hasReason(v, "all classes silent") {
			t.Fatalf("verdict %+v", v)
		}
		if st := s.e.ServiceStats("svc", s.now); st.Unknown != 1 || st.HealthUnknown != 1 {
			t.Errorf("stats %+v: want one unknown", st)
		}
	})
	t.Run("unobservable is neither failure nor sample", func(t *testing.T) {
		t.Parallel()
		s, id := setup(t)
		s.run(2*time.Minute, time.Second, every(5*time.Second, func(time.Time) {
			s.obs(id, probe, unobs, 1)
			s.obs(id, self, unobs, 2)
			s.obs(id, passive, unobs, 100)
		}))
		v := s.verdict(id)
		if v.State != eligibility.Unknown || v.Classes[probe].Unobservable == 0 || !v.Classes[probe].Silent || !hasReason(v, "could not observe") {
			t.Fatalf("verdict %+v", v)
		}
	})
	t.Run("one failing class cannot remove an unknown instance", func(t *testing.T) {
		t.Parallel()
		s, id := setup(t)
		s.run(20*time.Second, time.Second, nil)
		s.run(time.Minute, time.Second, every(5*time.Second, func(time.Time) { s.obs(id, probe, hard, 1) }))
		v := s.verdict(id)
		if v.State != eligibility.Unknown || !hasReason(v, "second class") {
			t.Fatalf("verdict %+v", v)
		}
		// A second, independent class corroborates.
		s.run(10*time.Second, time.Second, func(time.Time) {
			s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 100, Failures: 10})
		})
		if got := s.state(id); got != eligibility.Ineligible {
			t.Fatalf("state %v after corroboration, want ineligible", got)
		}
		last := s.all[len(s.all)-1]
		if last.From != eligibility.Unknown || last.To != eligibility.Ineligible {
			t.Errorf("last transition %+v", last)
		}
	})
	t.Run("a class falling silent never triggers removal", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, eligibility.Options{})
		c := contract(eligibility.Capabilities{Probe: true, Passive: true})
		c.Weights[passive] = 2
		c.PassivePrimaryRPS = 0 // passive primary whenever it speaks, whatever its traffic
		s.service("svc", c)
		id := s.add(1, "svc")
		s.obs(id, probe, ok, 1)
		s.tick()
		// Probe failing at 5 s, passive (primary, twice the weight) healthy.
		probeFail := every(5*time.Second, func(time.Time) { s.obs(id, probe, fail, 1) })
		s.run(time.Minute, time.Second, func(now time.Time) {
			probeFail(now)
			s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 100, Successes: 20})
		})
		v := s.verdict(id)
		if v.State != eligibility.Eligible || v.Primary != passive || v.Classes[probe].FailureRate < 0.9 {
			t.Fatalf("setup verdict %+v", v)
		}
		// Passive stops and goes silent 15 s later (at +16 s, between probe
		// samples): that alone must not remove.
		s.run(16*time.Second, time.Second, probeFail)
		if got := s.state(id); got != eligibility.Eligible {
			t.Fatalf("passive falling silent: state %v, want eligible", got)
		}
		// The next probe failure is fresh evidence, and probe now speaks alone.
		s.run(4*time.Second, time.Second, probeFail)
		if got := s.state(id); got != eligibility.Ineligible {
			t.Fatalf("fresh probe failure with passive silent: state %v, want ineligible", got)
		}
	})
}

func TestPassiveEvidence(t *testing.T) {
	t.Parallel()
	twoClass := contract(eligibility.Capabilities{Probe: true, Passive: true})
	t.Run("grey failure above the traffic threshold: passive is primary", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, eligibility.Options{})
		s.service("svc", twoClass)
		id := s.add(1, "svc")
		s.obs(id, probe, ok, 1)
		failing := 0
		feed := func(now time.Time) {
			if now.Sub(t0)%(5*time.Second) == 0 {
				s.obs(id, probe, ok, 1) // the prober's path is fine
			}
			for r := range 3 {
				s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: eligibility.ReporterID(100 + r),
					Successes: uint32(10 * (1 - failing)), Failures: uint32(10 * failing)})
			}
		}
		s.run(time.Minute, time.Second, feed)
		v := s.verdict(id)
		if v.Primary != passive || v.SingleClass {
			t.Fatalf("verdict %+v: want passive primary, two classes", v)
		}
		failing = 1
		start := s.now
		s.run(10*time.Second, time.Second, feed)
		if got := s.state(id); got != eligibility.Ineligible {
			t.Fatalf("grey failure not removed: %+v", s.verdict(id))
		}
		if cost := s.all[len(s.all)-1].At.Sub(start); cost > 5*time.Second {
			t.Errorf("grey failure removed after %v", cost)
		}
	})
	t.Run("below the traffic threshold probe is primary and evidence single-class", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, eligibility.Options{})
		s.service("svc", twoClass)
		id := s.add(1, "svc")
		s.run(2*time.Minute, time.Second, func(now time.Time) {
			if now.Sub(t0)%(5*time.Second) == 0 {
				s.obs(id, probe, ok, 1)
			}
			if now.Sub(t0)%(2*time.Second) == 0 { // 0.5 requests/s, all failing
				s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 100, Failures: 1})
			}
		})
		v := s.verdict(id)
		if v.State != eligibility.Eligible || v.Primary != probe || !v.SingleClass || !hasReason(v, "single-class") {
			t.Fatalf("verdict %+v", v)
		}
		if st := s.e.ServiceStats("svc", s.now); !st.SingleClass || st.SingleClassInstances != 1 {
			t.Errorf("stats %+v: want single-class", st)
		}
	})
	t.Run("a thousand reports from one caller count as one caller", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, eligibility.Options{})
		s.service("svc", contract(passiveOnly))
		id := s.add(1, "svc")
		s.run(time.Minute, time.Second, func(time.Time) {
			s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 1, Failures: 1000})
			for r := range 3 {
				s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: eligibility.ReporterID(10 + r), Successes: 2})
			}
		})
		v := s.verdict(id)
		if v.State != eligibility.Eligible || v.Classes[passive].Reporters != 4 {
			t.Fatalf("verdict %+v", v)
		}
		if r := v.Classes[passive].FailureRate; r < 0.24 || r > 0.26 {
			t.Errorf("passive failure rate %.3f, want 0.25 (one caller in four)", r)
		}
	})
}

func TestDependencyAuthority(t *testing.T) {
	t.Parallel()
	c := contract(allCaps)
	c.Dependencies = map[string]eligibility.Dependency{
		"cache": {Authority: eligibility.Unready},
		"db":    {Shared: true, Authority: eligibility.Weight},
		"logs":  {Authority: eligibility.Informational},
		"queue": {Shared: true, Authority: eligibility.Unready}, // refused upstream; defended here
	}
	tests := []struct {
		dep    string
		state  eligibility.State
		weight float64
	}{
		{"", eligibility.Eligible, 1},
		{"logs", eligibility.Eligible, 1},
		{"db", eligibility.Degraded, 0.5},
		{"undeclared", eligibility.Degraded, 0.5},
		{"queue", eligibility.Degraded, 0.5},
		{"cache", eligibility.Ineligible, 0},
	}
	for _, tt := range tests {
		t.Run(tt.dep, func(t *testing.T) {
			t.Parallel()
			s := newSim(t, eligibility.Options{})
			s.service("svc", c)
			id := s.add(1, "svc")
			s.run(time.Minute, time.Second, healthy(s, id))
			s.now = s.now.Add(time.Second)
			s.sample(eligibility.Sample{Instance: id, Class: self, Outcome: ok, Dependency: tt.dep})
			s.tick()
			v := s.verdict(id)
			if v.State != tt.state || v.Weight != tt.weight {
				t.Fatalf("state %v weight %v, want %v %v (reasons %q)", v.State, v.Weight, tt.state, tt.weight, v.Reasons)
			}
			// A self-report naming no dependency clears it.
			s.now = s.now.Add(time.Second)
			s.sample(eligibility.Sample{Instance: id, Class: self, Outcome: ok})
			s.tick()
			if tt.state != eligibility.Ineligible {
				if v := s.verdict(id); v.State != eligibility.Eligible || v.Weight != 1 {
					t.Fatalf("after clearing: %v %v", v.State, v.Weight)
				}
			}
		})
	}
}

func TestFlapQuarantine(t *testing.T) {
	t.Parallel()
	s := newSim(t, eligibility.Options{})
	s.service("svc", contract(passiveOnly))
	id := s.add(1, "svc")
	var q *eligibility.Transition
	for step := 0; step < 3600 && q == nil; step++ {
		s.now = s.now.Add(time.Second)
		smp := eligibility.Sample{Instance: id, Class: passive, Reporter: 1, Successes: 10}
		if s.state(id).InRotation() { // adversarial: fail while in, recover while out
			smp.Successes, smp.Failures = 0, 10
		}
		s.sample(smp)
		for _, tr := range s.tick() {
			if tr.History != nil {
				q = &tr
			}
		}
	}
	if q == nil {
		t.Fatal("never quarantined")
	}
	if len(q.History) != 5 || q.To != eligibility.Ineligible || q.QuarantinedUntil.Sub(q.At) != time.Minute || !strings.Contains(q.Reason, "quarantined") {
		t.Fatalf("quarantine transition %+v", q)
	}
	for i, h := range q.History {
		if h.From.InRotation() == h.To.InRotation() || (i > 0 && h.At.Before(q.History[i-1].At)) {
			t.Errorf("history[%d] = %+v is not an eligibility change in order", i, h)
		}
	}
	v := s.verdict(id)
	if !v.QuarantinedUntil.Equal(q.QuarantinedUntil) || !hasReason(v, "quarantined") {
		t.Errorf("verdict %+v", v)
	}
	st := s.e.ServiceStats("svc", s.now)
	if st.Quarantined != 1 || st.Quarantines != 1 || st.Changes < 4 || st.FlapRate <= 0 {
		t.Errorf("stats %+v", st)
	}
	// Held out with clean evidence until the quarantine ends.
	s.run(2*time.Minute, time.Second, func(time.Time) {
		s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 1, Successes: 10})
	})
	for _, tr := range s.all {
		if tr.At.After(q.At) && tr.To.InRotation() && tr.At.Before(q.QuarantinedUntil) {
			t.Fatalf("re-entered during quarantine: %+v", tr)
		}
	}
	if got := s.state(id); !got.InRotation() {
		t.Errorf("state %v two minutes after a one-minute quarantine", got)
	}
}

func TestSlowStart(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		slowStart time.Duration
		weights   []float64
	}{
		{"default 60 s in 10 steps", 60 * time.Second, []float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}},
		{"0: full weight at once", 0, []float64{1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newSim(t, eligibility.Options{})
			c := eligibility.DefaultContract(probeOnly)
			c.SlowStart = tt.slowStart
			s.service("svc", c)
			id := s.add(1, "svc")
			probeOK := every(5*time.Second, func(time.Time) { s.obs(id, probe, ok, 1) })
			s.run(2*time.Minute, 500*time.Millisecond, probeOK)
			var ws []float64
			for _, tr := range s.all {
				ws = append(ws, tr.Weight)
			}
			if len(ws) != len(tt.weights) {
				t.Fatalf("weights %v, want %v", ws, tt.weights)
			}
			for i := range ws {
				if ws[i] != tt.weights[i] {
					t.Fatalf("weights %v, want %v", ws, tt.weights)
				}
			}
			if tt.slowStart > 0 {
				if got := s.all[len(s.all)-1].At.Sub(s.all[0].At); got != tt.slowStart {
					t.Errorf("full weight %v after entry, want %v", got, tt.slowStart)
				}
			}
		})
	}
}

func TestProberOutage(t *testing.T) {
	t.Parallel()
	s := newSim(t, eligibility.Options{})
	s.service("svc", contract(probeOnly))
	var ids []eligibility.InstanceID
	for n := range 4 {
		ids = append(ids, s.add(n, "svc"))
	}
	s.e.AssignProber(1, ids[:2])
	s.e.AssignProber(2, ids[2:])
	aUp, aBlind := true, false
	feed := every(5*time.Second, func(time.Time) {
		for i, id := range ids {
			switch {
			case i >= 2:
				s.obs(id, probe, ok, 2)
			case aUp:
				s.obs(id, probe, ok, 1)
			case aBlind:
				s.obs(id, probe, unobs, 1)
			}
		}
	})
	s.run(30*time.Second, time.Second, feed)
	lastA := s.now.Add(-s.now.Sub(t0) % (5 * time.Second))
	aUp = false
	s.run(30*time.Second, time.Second, feed)
	outs := s.e.ProberOutages()
	if len(outs) != 1 || outs[0].Prober != 1 || !outs[0].Since.Equal(lastA) || outs[0].Targets != 2 || outs[0].Unobservable {
		t.Fatalf("outages %+v, want prober 1 silent since %v", outs, lastA)
	}
	for i, id := range ids {
		v := s.verdict(id)
		switch {
		case i < 2 && (v.State != eligibility.Unknown || !hasReason(v, "prober 1 in outage")):
			t.Errorf("instance %d of the silent prober: %+v", i, v)
		case i >= 2 && v.State != eligibility.Eligible:
			t.Errorf("instance %d of the healthy prober: %+v", i, v)
		}
	}
	aBlind = true
	s.run(10*time.Second, time.Second, feed)
	if outs := s.e.ProberOutages(); len(outs) != 1 || !outs[0].Unobservable {
		t.Errorf("blind prober: outages %+v, want one, unobservable", outs)
	}
	aUp = true
	s.run(10*time.Second, time.Second, feed)
	if outs := s.e.ProberOutages(); len(outs) != 0 {
		t.Errorf("prober back: outages %+v", outs)
	}
	for i, id := range ids {
		if got := s.state(id); got != eligibility.Eligible {
			t.Errorf("instance %d after the prober came back: %v", i, got)
		}
	}
	for _, tr := range s.all {
		if tr.To == eligibility.Ineligible {
			t.Errorf("prober outage removed an instance: %+v", tr)
		}
	}
}

func TestRemoveInstanceAndStats(t *testing.T) {
	t.Parallel()
	s := newSim(t, eligibility.Options{})
	s.service("svc", contract(probeOnly))
	s.service("quiet", contract(passiveOnly))
	a, b, c := s.add(1, "svc"), s.add(2, "svc"), s.add(3, "svc")
	q := s.add(4, "quiet")
	s.run(10*time.Second, time.Second, every(5*time.Second, func(time.Time) {
		s.obs(a, probe, ok, 1)
		s.obs(c, probe, ok, 1)
	}))
	s.e.RemoveInstance(a)
	if _, found := s.e.Verdict(a, s.now); found {
		t.Error("verdict for a removed instance")
	}
	if err := s.e.Observe(eligibility.Sample{Instance: a, Outcome: ok, At: s.now}); err == nil {
		t.Error("observe accepted a removed instance")
	}
	if s.state(b) != eligibility.Ineligible || s.state(c) != eligibility.Eligible || s.state(q) != eligibility.Eligible {
		t.Fatalf("states after removal: %v %v %v", s.state(b), s.state(c), s.state(q))
	}
	all := s.e.AllServiceStats(s.now)
	if len(all) != 2 || all[0].Service != "quiet" || all[1].Service != "svc" {
		t.Fatalf("AllServiceStats = %+v", all)
	}
	if st := all[1]; st.Instances != 2 || st.Eligible != 1 || st.Ineligible != 1 {
		t.Errorf("svc stats %+v", st)
	}
	if st := all[0]; st.Instances != 1 || st.Eligible != 1 || st.HealthUnknown != 1 {
		t.Errorf("quiet stats %+v", st)
	}
}

// TestRoutingAgreesWithVerdict: the cheap accessor the assembler uses says
// what Verdict says.
func TestRoutingAgreesWithVerdict(t *testing.T) {
	e := eligibility.NewEngine(eligibility.Options{})
	e.SetService("svc", contract(allCaps))
	ids := []eligibility.InstanceID{iid(1), iid(2), iid(3)}
	for _, id := range ids {
		if err := e.AddInstance(id, "svc", t0); err != nil {
			t.Fatal(err)
		}
	}
	for k, id := range ids[:2] {
		out := ok
		if k == 1 {
			out = eligibility.HardFailure
		}
		if err := e.Observe(eligibility.Sample{Instance: id, Class: eligibility.Probe, Outcome: eligibility.Success, At: t0, Reporter: 1}); err != nil {
			t.Fatal(err)
		}
		e.Tick(t0)
		if err := e.Observe(eligibility.Sample{Instance: id, Class: eligibility.Probe, Outcome: out, At: t0.Add(time.Second), Reporter: 1}); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(2 * time.Second)
	e.Tick(now)
	for _, id := range ids {
		v, _ := e.Verdict(id, now)
		r, found := e.Routing(id, now)
		if !found || r.State != v.State || r.Weight != v.Weight || r.HealthKnown != v.HealthKnown || r.Quarantined != v.QuarantinedUntil.After(now) {
			t.Errorf("%v: routing %+v, verdict state %s weight %v known %v", id, r, v.State, v.Weight, v.HealthKnown)
		}
	}
	if _, found := e.Routing(iid(99), now); found {
		t.Error("routing for an unknown instance")
	}
}

// TestRestoreQuarantine: a quarantine handed back after a restart holds the
// instance out as the live one did, and the next quarantine escalates from
// its step unless it comes QuarantineForgive after the last one ended.
func TestRestoreQuarantine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		caps eligibility.Capabilities
		cl   eligibility.Class
		step int
		// ends is when the restored quarantine ends, after the restore
		// (negative: it ended before the restart).
		ends time.Duration
		// The next quarantine's duration and step.
		next     time.Duration
		nextStep int
	}{
		{"live first quarantine, readiness signal", probeOnly, probe, 1, 50 * time.Second, 2 * time.Minute, 2},
		{"live first quarantine, no readiness signal", passiveOnly, passive, 1, 50 * time.Second, 2 * time.Minute, 2},
		{"live third quarantine", passiveOnly, passive, 3, 3 * time.Minute, 8 * time.Minute, 4},
		{"live quarantine next to the cap", passiveOnly, passive, 5, time.Minute, 30 * time.Minute, 6},
		{"live quarantine at the cap", passiveOnly, passive, 9, 10 * time.Minute, 30 * time.Minute, 10},
		{"ended 10 min before the restart", passiveOnly, passive, 2, -10 * time.Minute, 4 * time.Minute, 3},
		{"ended 10 min before the restart, readiness signal", probeOnly, probe, 2, -10 * time.Minute, 4 * time.Minute, 3},
		{"ended QuarantineForgive before: forgiven", passiveOnly, passive, 4, -time.Hour, time.Minute, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newSim(t, eligibility.Options{})
			s.service("svc", contract(tt.caps))
			id := s.add(1, "svc")
			// A restarted engine: the instance is new to it and its
			// evidence (replayed windows) is healthy.
			ok := eligibility.Sample{Instance: id, Class: tt.cl, Reporter: 1, Outcome: eligibility.Success}
			if tt.cl == passive {
				ok.Successes = 10
			}
			s.sample(ok)
			until := s.now.Add(tt.ends)
			q := eligibility.Quarantine{Start: until.Add(-time.Minute), Until: until, Step: tt.step}
			if err := s.e.RestoreQuarantine(id, q, s.now); err != nil {
				t.Fatal(err)
			}
			s.tick()
			v := s.verdict(id)
			r, _ := s.e.Routing(id, s.now)
			st := s.e.ServiceStats("svc", s.now)
			if tt.ends > 0 {
				if v.State != eligibility.Ineligible || !v.QuarantinedUntil.Equal(until) || !hasReason(v, "quarantined until") ||
					!r.Quarantined || st.Quarantined != 1 || st.Quarantines != 0 {
					t.Fatalf("after restoring a live quarantine: verdict %+v, routing %+v, stats %+v", v, r, st)
				}
				// Healthy evidence does not bring it back before the end.
				s.run(tt.ends-time.Second, time.Second, every(time.Second, func(time.Time) { s.sample(ok) }))
				if got := s.state(id); got != eligibility.Ineligible {
					t.Fatalf("state %v a second before the restored quarantine ends", got)
				}
			} else if !v.State.InRotation() || r.Quarantined || st.Quarantined != 0 || !v.QuarantinedUntil.IsZero() {
				t.Fatalf("after restoring an ended quarantine: verdict %+v, routing %+v, stats %+v", v, r, st)
			}
			for _, tr := range s.all {
				if tr.Reason != "first success: entering rotation" {
					t.Fatalf("the restore emitted %+v", tr)
				}
			}
			// Out of quarantine, healthy until it is back in rotation.
			s.run(2*time.Minute, time.Second, every(time.Second, func(time.Time) { s.sample(ok) }))
			if got := s.state(id); !got.InRotation() {
				t.Fatalf("state %v two minutes after the restored quarantine ended", got)
			}
			next := s.flap(id, tt.cl, time.Hour)
			if next == nil {
				t.Fatal("never quarantined again")
			}
			if d := next.QuarantinedUntil.Sub(next.At); d != tt.next || next.QuarantineStep != tt.nextStep {
				t.Fatalf("next quarantine %v at step %d, want %v at step %d", d, next.QuarantineStep, tt.next, tt.nextStep)
			}
		})
	}
}

func TestRestoreQuarantineRefusals(t *testing.T) {
	t.Parallel()
	s := newSim(t, eligibility.Options{})
	s.service("svc", contract(passiveOnly))
	id := s.add(1, "svc")
	for _, tt := range []struct {
		name string
		id   eligibility.InstanceID
		q    eligibility.Quarantine
		want error
	}{
		{"unknown instance", iid(2), eligibility.Quarantine{Start: s.now, Until: s.now.Add(time.Minute), Step: 1}, eligibility.ErrUnknownInstance},
		{"step 0", id, eligibility.Quarantine{Start: s.now, Until: s.now.Add(time.Minute), Step: 0}, eligibility.ErrInvalidQuarantine},
		{"ends before it starts", id, eligibility.Quarantine{Start: s.now, Until: s.now.Add(-time.Minute), Step: 1}, eligibility.ErrInvalidQuarantine},
	} {
		if err := s.e.RestoreQuarantine(tt.id, tt.q, s.now); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	// An older quarantine handed back after a newer one changes nothing.
	newer := eligibility.Quarantine{Start: s.now, Until: s.now.Add(4 * time.Minute), Step: 3}
	older := eligibility.Quarantine{Start: s.now.Add(-time.Hour), Until: s.now.Add(time.Minute), Step: 1}
	for _, q := range []eligibility.Quarantine{newer, older} {
		if err := s.e.RestoreQuarantine(id, q, s.now); err != nil {
			t.Fatal(err)
		}
	}
	s.tick()
	if v := s.verdict(id); !v.QuarantinedUntil.Equal(newer.Until) {
		t.Fatalf("quarantined until %v, want %v", v.QuarantinedUntil, newer.Until)
	}
}
