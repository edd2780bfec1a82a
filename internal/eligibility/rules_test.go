package eligibility_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/eligibility"
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
	// A prober's hard failure is contradicted by a healthy self-report or
	// healthy callers (TestContradictedFailure), so it is tested where the
	// probe is the only class; HardFail is never contradicted, so it is
	// tested with every class healthy.
	for _, tt := range []struct {
		name string
		caps eligibility.Capabilities
		fail func(s *sim, id eligibility.InstanceID)
	}{
		{"connection refused from the prober", probeOnly, func(s *sim, id eligibility.InstanceID) { s.obs(id, probe, hard, 1) }},
		{"process gone", allCaps, func(s *sim, id eligibility.InstanceID) { s.e.HardFail(id, "process gone", s.now) }},
		{"lease expired", allCaps, func(s *sim, id eligibility.InstanceID) { s.e.HardFail(id, "lease expired", s.now) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newSim(t, eligibility.Options{})
			s.service("svc", contract(tt.caps))
			id := s.add(1, "svc")
			s.run(time.Minute, time.Second, healthy(s, id)) // every class at 0 (passive primary when present)
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
				if tt.cl == passive { // two callers: the population that may remove
					smp := eligibility.Sample{Instance: id, Class: passive, Reporter: 7, Successes: 5}
					if o == fail {
						smp.Successes, smp.Failures = 0, 5
					}
					s.sample(smp)
					smp.Reporter = 8
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
		// A second, independent class corroborates: two callers failing.
		s.run(10*time.Second, time.Second, func(time.Time) {
			s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 100, Failures: 10})
			s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 101, Failures: 10})
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
		// Probe failing at 5 s, passive (primary: two callers, twice the
		// weight) healthy.
		probeFail := every(5*time.Second, func(time.Time) { s.obs(id, probe, fail, 1) })
		s.run(time.Minute, time.Second, func(now time.Time) {
			probeFail(now)
			s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 100, Successes: 20})
			s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 101, Successes: 20})
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
		smp.Reporter = 2 // two callers: the population that may remove
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

// probeSelf is a service whose probe is primary and whose instances also
// report themselves: the shape in which a single prober used to drain a
// healthy fleet (issue 13).
var probeSelf = eligibility.Capabilities{Probe: true, Self: true, Readiness: true}

// TestContradictedFailure: a failure from one class that another class or
// a peer prober contradicts degrades the instance, names who failed and who
// contradicts, and is no flap; corroboration or the end of the
// contradiction lets the normal rules remove it.
func TestContradictedFailure(t *testing.T) {
	t.Parallel()
	const az1, az2 eligibility.ReporterID = 7, 8
	// setup admits one instance of a service with caps, prober az1 (and
	// az2 when peer) assigned to it, and names both probers.
	setup := func(t *testing.T, caps eligibility.Capabilities, peer bool) (*sim, eligibility.InstanceID) {
		s := newSim(t, eligibility.Options{})
		c := contract(caps)
		if peer {
			// Two probers' rates are averaged: one failing against one
			// healthy is just under 0.5, so removal at 0.4 shows the peer
			// contradicting a soft failure.
			c.RemovalThreshold = 0.4
		}
		s.service("svc", c)
		id := s.add(1, "svc")
		s.e.AssignProber(az1, []eligibility.InstanceID{id})
		s.e.NameReporter(az1, "prober-az1")
		if peer {
			s.e.AssignProber(az2, []eligibility.InstanceID{id})
			s.e.NameReporter(az2, "prober-az2")
		}
		return s, id
	}
	// feed reports every 5 s: az1 says o1, az2 (if peer) success, self
	// (if selfOK) success; passive (if callers) two callers every second.
	feed := func(s *sim, id eligibility.InstanceID, o1 eligibility.Outcome, peer, selfOK bool, callers int) func(time.Time) {
		return func(now time.Time) {
			if now.Sub(t0)%(5*time.Second) == 0 {
				s.obs(id, probe, o1, az1)
				if peer {
					s.obs(id, probe, ok, az2)
				}
				if selfOK {
					s.obs(id, self, ok, 2)
				}
			}
			for r := range callers {
				s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: eligibility.ReporterID(100 + r), Successes: 1})
			}
		}
	}
	for _, tt := range []struct {
		name    string
		caps    eligibility.Capabilities
		o       eligibility.Outcome
		peer    bool
		self    bool
		callers int
		reason  string
	}{
		{"prober failing, self and callers healthy", allCaps, fail, false, true, 2,
			"probe failing (prober prober-az1) contradicted by self and passive: degraded"},
		{"prober refused, self healthy", probeSelf, hard, false, true, 0,
			"probe hard failure (prober prober-az1) contradicted by self: degraded"},
		{"prober failing, a peer prober healthy", probeOnly, fail, true, false, 0,
			"probe failing (prober prober-az1) contradicted by prober prober-az2: degraded"},
		{"prober refused, peer and self healthy", probeSelf, hard, true, true, 0,
			"probe hard failure (prober prober-az1) contradicted by self and prober prober-az2: degraded"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, id := setup(t, tt.caps, tt.peer)
			s.run(time.Minute, time.Second, feed(s, id, ok, tt.peer, tt.self, tt.callers))
			if v := s.verdict(id); v.State != eligibility.Eligible || v.Weight != 1 || v.Primary != probe {
				t.Fatalf("setup: %+v", v)
			}
			from := len(s.all)
			s.run(2*time.Minute, time.Second, feed(s, id, tt.o, tt.peer, tt.self, tt.callers))
			trs := s.all[from:]
			if len(trs) != 1 || trs[0].From != eligibility.Eligible || trs[0].To != eligibility.Degraded || trs[0].Weight != 0.5 || trs[0].Reason != tt.reason {
				t.Fatalf("transitions %+v, want one to degraded at 0.5: %q", trs, tt.reason)
			}
			v := s.verdict(id)
			if v.State != eligibility.Degraded || v.Weight != 0.5 || !hasReason(v, tt.reason) {
				t.Fatalf("verdict %+v", v)
			}
			st := s.e.ServiceStats("svc", s.now)
			if st.Degraded != 1 || st.Contradicted != 1 || st.Contradictions != 1 || st.Changes != 0 {
				t.Errorf("stats %+v: want one contradicted, no eligibility change", st)
			}
			// The prober recovers: back to full weight, still no change
			// into or out of rotation.
			s.run(time.Minute, time.Second, feed(s, id, ok, tt.peer, tt.self, tt.callers))
			if v := s.verdict(id); v.State != eligibility.Eligible || v.Weight != 1 {
				t.Fatalf("after the prober recovered: %+v", v)
			}
			if st := s.e.ServiceStats("svc", s.now); st.Changes != 0 || st.Contradicted != 0 {
				t.Errorf("stats %+v after recovery", st)
			}
		})
	}
	t.Run("self failing (primary), callers healthy", func(t *testing.T) {
		t.Parallel()
		// Two callers at 1 request/s each: below the traffic threshold,
		// so self is primary, but enough callers to contradict.
		s, id := setup(t, eligibility.Capabilities{Self: true, Passive: true, Readiness: true}, false)
		o := ok
		s.run(2*time.Minute, time.Second, func(now time.Time) {
			if now.Sub(t0) > time.Minute {
				o = fail
			}
			if now.Sub(t0)%(5*time.Second) == 0 {
				s.obs(id, self, o, 2)
			}
			for r := range 2 {
				s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: eligibility.ReporterID(100 + r), Successes: 1})
			}
		})
		want := "self failing contradicted by passive: degraded"
		if v := s.verdict(id); v.State != eligibility.Degraded || v.Weight != 0.5 || !hasReason(v, want) {
			t.Fatalf("verdict %+v, want degraded: %q", v, want)
		}
	})
	for _, o := range []eligibility.Outcome{fail, hard} {
		t.Run("prober "+o.String()+" corroborated by self, callers healthy notwithstanding", func(t *testing.T) {
			t.Parallel()
			s, id := setup(t, allCaps, false)
			s.run(time.Minute, time.Second, feed(s, id, ok, false, true, 2)) // two quiet callers: probe primary
			var firstFail time.Time
			s.run(30*time.Second, time.Second, func(now time.Time) {
				if now.Sub(t0)%(5*time.Second) == 0 {
					if firstFail.IsZero() {
						firstFail = now
					}
					s.obs(id, probe, o, az1)
					s.obs(id, self, fail, 2)
				}
				for r := range 2 {
					s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: eligibility.ReporterID(100 + r), Successes: 1})
				}
			})
			last := s.all[len(s.all)-1]
			if last.To != eligibility.Ineligible || !last.FirstFailureAt.Equal(firstFail) || !last.At.Equal(firstFail) {
				t.Fatalf("last transition %+v, want removal at the first failure %v", last, firstFail)
			}
		})
	}
	t.Run("the contradiction ends: fresh failure evidence removes", func(t *testing.T) {
		t.Parallel()
		s, id := setup(t, probeSelf, false)
		s.run(time.Minute, time.Second, feed(s, id, ok, false, true, 0))
		firstFail := s.now.Add(5 * time.Second)
		s.run(30*time.Second, time.Second, feed(s, id, fail, false, true, 0))
		if got := s.state(id); got != eligibility.Degraded {
			t.Fatalf("contradicted: %v", got)
		}
		// Self falls silent 15 s after its last report; the probe's next
		// failure after that removes.
		from := len(s.all)
		s.run(30*time.Second, time.Second, feed(s, id, fail, false, false, 0))
		var removal *eligibility.Transition
		for i := range s.all[from:] {
			if tr := &s.all[from+i]; tr.To == eligibility.Ineligible {
				removal = tr
			}
		}
		if removal == nil || removal.From != eligibility.Degraded || !removal.FirstFailureAt.Equal(firstFail) {
			t.Fatalf("transitions %+v, want a removal from degraded with first failure %v", s.all[from:], firstFail)
		}
		for _, tr := range s.all[from:] {
			if tr.To == eligibility.Eligible {
				t.Errorf("went back to eligible in between: %+v", tr)
			}
		}
	})
	t.Run("a contradicted hard failure latches nothing", func(t *testing.T) {
		t.Parallel()
		// Self reports until just before the prober's one hard failure,
		// so it falls silent a second before the probe does: the hard
		// failure, contradicted when it came, must not remove then.
		s, id := setup(t, probeSelf, false)
		s.run(time.Minute, time.Second, feed(s, id, ok, false, true, 0))
		s.now = s.now.Add(4 * time.Second)
		s.obs(id, probe, hard, az1)
		s.tick()
		if got := s.state(id); got != eligibility.Degraded {
			t.Fatalf("contradicted hard failure: %v", got)
		}
		s.run(time.Minute, time.Second, nil)
		for _, tr := range s.all {
			if tr.To == eligibility.Ineligible {
				t.Fatalf("removed without fresh failure evidence: %+v", tr)
			}
		}
		if got := s.state(id); got != eligibility.Unknown {
			t.Fatalf("all silent: %v, want unknown", got)
		}
	})
	t.Run("HardFail is never contradicted", func(t *testing.T) {
		t.Parallel()
		s, id := setup(t, allCaps, false)
		s.run(time.Minute, time.Second, feed(s, id, ok, false, true, 2))
		s.now = s.now.Add(time.Second)
		s.e.HardFail(id, "lease expired", s.now)
		if trs := s.tick(); len(trs) != 1 || trs[0].To != eligibility.Ineligible || trs[0].Reason != "hard failure: lease expired" {
			t.Fatalf("transitions %+v, want removal", trs)
		}
	})
}

// TestContradictionIsNoFlap: a prober that fails and recovers every 20 s
// for 20 minutes, contradicted by the instance's own report, changes only
// its weight: no eligibility change, no quarantine.
func TestContradictionIsNoFlap(t *testing.T) {
	t.Parallel()
	s := newSim(t, eligibility.Options{})
	s.service("svc", contract(probeSelf))
	id := s.add(1, "svc")
	s.run(20*time.Minute, time.Second, every(5*time.Second, func(now time.Time) {
		o := ok
		if now.Sub(t0)/(20*time.Second)%2 == 1 {
			o = fail
		}
		s.obs(id, probe, o, 1)
		s.obs(id, self, ok, 2)
	}))
	degraded := 0
	for _, tr := range s.all {
		if !tr.To.InRotation() || !tr.QuarantinedUntil.IsZero() {
			t.Fatalf("transition %+v", tr)
		}
		if tr.To == eligibility.Degraded {
			degraded++
		}
	}
	st := s.e.ServiceStats("svc", s.now)
	if degraded < 20 || st.Changes != 0 || st.Quarantines != 0 || uint64(degraded) != st.Contradictions {
		t.Fatalf("%d contradictions, stats %+v: want dozens, no changes, no quarantine", degraded, st)
	}
}

// TestProberSuspect: a prober whose failures are contradicted on at least
// three targets and half of those it reports on is suspect; its evidence
// is ignored (its targets stay as the other evidence says), it stays
// suspect while it keeps failing even once the contradiction falls silent,
// and the suspicion ends when it stops failing.
func TestProberSuspect(t *testing.T) {
	t.Parallel()
	const bad, good eligibility.ReporterID = 7, 8
	s := newSim(t, eligibility.Options{})
	s.service("web", contract(probeSelf))
	s.service("api", contract(probeSelf))
	var web, api []eligibility.InstanceID
	for n := range 4 {
		web = append(web, s.add(n, "web"))
		api = append(api, s.add(10+n, "api"))
	}
	// bad probes web and two api instances; good probes the rest.
	s.e.AssignProber(bad, append(slices.Clone(web), api[:2]...))
	s.e.AssignProber(good, api[2:])
	s.e.NameReporter(bad, "prober-az1")
	s.e.NameReporter(good, "prober-az2")
	failing, selfOn := false, true
	feed := every(5*time.Second, func(time.Time) {
		for i, id := range append(slices.Clone(web), api...) {
			o, p := ok, bad
			if i >= 6 {
				p = good
			}
			if failing && p == bad {
				o = fail
			}
			s.obs(id, probe, o, p)
			if selfOn {
				s.obs(id, self, ok, 2)
			}
		}
	})
	s.run(time.Minute, time.Second, feed)
	if sus := s.e.ProberSuspects(); len(sus) != 0 {
		t.Fatalf("suspects while every prober is healthy: %+v", sus)
	}
	failing = true
	s.run(time.Minute, time.Second, feed)
	sus := s.e.ProberSuspects()
	if len(sus) != 1 {
		t.Fatalf("suspects %+v, want prober-az1", sus)
	}
	want := eligibility.ProberStat{Prober: bad, Name: "prober-az1", Targets: 6, Reported: 6, Failing: 6, Contradicted: 6,
		Suspect: true, SuspectSince: sus[0].SuspectSince, Suspicions: 1,
		Services: []eligibility.ProberServiceCounts{{Service: "api", Reported: 2, Failing: 2, Contradicted: 2}, {Service: "web", Reported: 4, Failing: 4, Contradicted: 4}}}
	if d := cmp.Diff(want, sus[0]); d != "" {
		t.Fatalf("suspect (-want +got):\n%s", d)
	}
	if since := sus[0].SuspectSince; since.Before(t0.Add(time.Minute)) || since.After(t0.Add(time.Minute+6*time.Second)) {
		t.Errorf("suspect since %v, want within a probe interval and a tick of the first failure at %v", since, t0.Add(time.Minute))
	}
	if all := s.e.ProberStats(); len(all) != 2 || all[1].Prober != good || all[1].Suspect || all[1].Reported != 2 || all[1].Failing != 0 {
		t.Errorf("prober stats %+v", all)
	}
	for _, id := range web {
		v := s.verdict(id)
		if v.State != eligibility.Eligible || v.Weight != 1 || !v.Classes[probe].Silent || v.Classes[probe].Reporters != 0 ||
			!hasReason(v, "probe from prober prober-az1 ignored: suspect since") {
			t.Fatalf("target of the suspect prober: %+v", v)
		}
	}
	if st := s.e.ServiceStats("web", s.now); st.SuspectProbed != 4 || st.Eligible != 4 {
		t.Errorf("web stats %+v", st)
	}
	if st := s.e.ServiceStats("api", s.now); st.SuspectProbed != 2 || st.Eligible != 4 {
		t.Errorf("api stats %+v", st)
	}
	// The self-reports fall silent: nothing contradicts the prober any
	// more, but it is still failing, so still suspect; its targets are
	// unknown, not removed.
	selfOn = false
	s.run(time.Minute, time.Second, feed)
	if sus := s.e.ProberSuspects(); len(sus) != 1 || sus[0].Contradicted != 0 || sus[0].Failing != 6 {
		t.Fatalf("suspects after the contradiction fell silent: %+v", sus)
	}
	for _, id := range web {
		if got := s.state(id); got != eligibility.Unknown {
			t.Errorf("target of the suspect prober with self silent: %v, want unknown", got)
		}
	}
	// The prober recovers: no longer suspect.
	failing, selfOn = false, true
	s.run(time.Minute, time.Second, feed)
	if sus := s.e.ProberSuspects(); len(sus) != 0 {
		t.Fatalf("suspects after recovery: %+v", sus)
	}
	for _, id := range append(slices.Clone(web), api...) {
		if v := s.verdict(id); v.State != eligibility.Eligible || v.Classes[probe].Silent {
			t.Errorf("after recovery: %+v", v)
		}
	}
	for _, tr := range s.all {
		if tr.To == eligibility.Ineligible {
			t.Errorf("removal: %+v", tr)
		}
	}
}

// TestProberNotSuspectBelowThreshold: a prober contradicted on two targets
// is no suspect (the minimum is three), nor is one contradicted on three of
// the eight it reports on (less than half).
func TestProberNotSuspectBelowThreshold(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ targets, failing int }{{2, 2}, {8, 3}} {
		s := newSim(t, eligibility.Options{})
		s.service("svc", contract(probeSelf))
		var ids []eligibility.InstanceID
		for n := range tt.targets {
			ids = append(ids, s.add(n, "svc"))
		}
		s.e.AssignProber(7, ids)
		s.run(2*time.Minute, time.Second, every(5*time.Second, func(now time.Time) {
			for i, id := range ids {
				o := ok
				if i < tt.failing && now.After(t0.Add(time.Minute)) {
					o = fail
				}
				s.obs(id, probe, o, 7)
				s.obs(id, self, ok, 2)
			}
		}))
		if sus := s.e.ProberSuspects(); len(sus) != 0 {
			t.Errorf("%d of %d targets failing: suspects %+v", tt.failing, tt.targets, sus)
		}
		if st := s.e.ProberStats(); len(st) != 1 || st[0].Contradicted != tt.failing || st[0].Reported != tt.targets {
			t.Errorf("%d of %d targets failing: stats %+v", tt.failing, tt.targets, st)
		}
		if st := s.e.ServiceStats("svc", s.now); st.Contradicted != tt.failing || st.Ineligible != 0 {
			t.Errorf("%d of %d targets failing: service stats %+v", tt.failing, tt.targets, st)
		}
	}
}

// TestReasonsNameProbers: an outage reason names the prober by the name the
// evaluator gave it, and by number when it has none.
func TestReasonsNameProbers(t *testing.T) {
	t.Parallel()
	s := newSim(t, eligibility.Options{})
	s.service("svc", contract(probeOnly))
	a, b := s.add(1, "svc"), s.add(2, "svc")
	s.e.AssignProber(6, []eligibility.InstanceID{a})
	s.e.AssignProber(9, []eligibility.InstanceID{b})
	s.e.NameReporter(6, "prober-az1")
	up := true
	s.run(time.Minute, time.Second, every(5*time.Second, func(time.Time) {
		if up {
			s.obs(a, probe, ok, 6)
			s.obs(b, probe, ok, 9)
		}
	}))
	up = false
	s.run(time.Minute, time.Second, nil)
	if v := s.verdict(a); !hasReason(v, "prober prober-az1 in outage") || hasReason(v, "prober 6") {
		t.Errorf("named prober: %q", v.Reasons)
	}
	if v := s.verdict(b); !hasReason(v, "prober 9 in outage") {
		t.Errorf("unnamed prober: %q", v.Reasons)
	}
	if outs := s.e.ProberOutages(); len(outs) != 2 || outs[0].Name != "prober-az1" || outs[1].Name != "" {
		t.Errorf("outages %+v", outs)
	}
	s.e.NameReporter(6, "")
	if v := s.verdict(a); !hasReason(v, "prober 6 in outage") {
		t.Errorf("name forgotten: %q", v.Reasons)
	}
}

// TestPassivePopulation: passive evidence counts callers, not requests.
func TestPassivePopulation(t *testing.T) {
	t.Parallel()
	callers := func(s *sim, id eligibility.InstanceID, n int, f func(r int) eligibility.Sample) func(time.Time) {
		return func(time.Time) {
			for r := range n {
				smp := f(r)
				smp.Instance, smp.Class, smp.Reporter = id, passive, eligibility.ReporterID(100+r)
				s.sample(smp)
			}
		}
	}
	t.Run("one caller's volume does not make passive primary", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, eligibility.Options{})
		s.service("svc", contract(eligibility.Capabilities{Probe: true, Passive: true}))
		id := s.add(1, "svc")
		probeOK := every(5*time.Second, func(time.Time) { s.obs(id, probe, ok, 1) })
		one := callers(s, id, 1, func(int) eligibility.Sample { return eligibility.Sample{Successes: 1000} })
		s.run(time.Minute, time.Second, func(now time.Time) { probeOK(now); one(now) })
		if v := s.verdict(id); v.Primary != probe || !v.SingleClass || !hasReason(v, "from 1 reporters: primary needs 2") {
			t.Fatalf("one caller at 1000 req/s: %+v", v)
		}
		two := callers(s, id, 2, func(int) eligibility.Sample { return eligibility.Sample{Successes: 10} })
		s.run(10*time.Second, time.Second, func(now time.Time) { probeOK(now); two(now) })
		if v := s.verdict(id); v.Primary != passive || v.SingleClass {
			t.Fatalf("two callers at 10 req/s: %+v", v)
		}
	})
	t.Run("one caller failing cannot remove alone", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, eligibility.Options{})
		s.service("svc", contract(passiveOnly))
		id := s.add(1, "svc")
		s.run(time.Minute, time.Second, callers(s, id, 1, func(int) eligibility.Sample { return eligibility.Sample{Failures: 1000} }))
		if v := s.verdict(id); v.State != eligibility.Eligible || !hasReason(v, "from 1 failing reporters, fewer than 2") {
			t.Fatalf("one caller failing: %+v", v)
		}
		// A second caller failing is the population that may remove.
		s.run(5*time.Second, time.Second, callers(s, id, 2, func(int) eligibility.Sample { return eligibility.Sample{Failures: 10} }))
		if got := s.state(id); got != eligibility.Ineligible {
			t.Fatalf("two callers failing: %v", got)
		}
	})
	t.Run("MinPassiveReporters 1: one caller may remove", func(t *testing.T) {
		t.Parallel()
		c := contract(passiveOnly)
		c.MinPassiveReporters = 1
		s := newSim(t, eligibility.Options{})
		s.service("svc", c)
		id := s.add(1, "svc")
		s.run(5*time.Second, time.Second, callers(s, id, 1, func(int) eligibility.Sample { return eligibility.Sample{Failures: 10} }))
		if got := s.state(id); got != eligibility.Ineligible {
			t.Fatalf("one caller failing: %v", got)
		}
	})
	t.Run("a caller's hard failure is a full vote, not the fast path", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, eligibility.Options{})
		s.service("svc", contract(passiveOnly))
		id := s.add(1, "svc")
		s.run(time.Minute, time.Second, callers(s, id, 3, func(int) eligibility.Sample { return eligibility.Sample{Successes: 50} }))
		s.now = s.now.Add(time.Second)
		s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 100, Outcome: hard})
		s.tick()
		v := s.verdict(id)
		if v.State != eligibility.Eligible {
			t.Fatalf("one caller refused: %+v", v)
		}
		if r := v.Classes[passive].FailureRate; r < 0.33 || r > 0.34 {
			t.Errorf("passive rate %.3f after one of three callers refused, want 1/3 (its full vote)", r)
		}
		s.now = s.now.Add(time.Second)
		s.sample(eligibility.Sample{Instance: id, Class: passive, Reporter: 101, Outcome: hard})
		if trs := s.tick(); len(trs) != 1 || trs[0].To != eligibility.Ineligible || trs[0].Reason == "hard failure" {
			t.Fatalf("two callers refused: %+v, want a soft removal", trs)
		}
	})
}

// TestTwoBrokenProbersRemoveNothing is issue 13's finding: two probers
// that report failure for every target (instead of going silent) while
// the targets say they are healthy took a service's six instances out.
// Now neither removes anything, and both are found suspect against a
// healthy peer prober.
func TestTwoBrokenProbersRemoveNothing(t *testing.T) {
	t.Parallel()
	const brokenA, brokenB, healthy eligibility.ReporterID = 7, 8, 9
	s := newSim(t, eligibility.Options{})
	s.service("web", contract(probeSelf))
	s.service("api", contract(probeSelf))
	var web, api []eligibility.InstanceID
	for n := range 6 {
		web = append(web, s.add(n, "web"))
		api = append(api, s.add(10+n, "api"))
	}
	s.e.AssignProber(brokenA, append(slices.Clone(web[:3]), api[:1]...))
	s.e.AssignProber(brokenB, append(slices.Clone(web[3:]), api[1:2]...))
	s.e.AssignProber(healthy, api[2:])
	s.e.NameReporter(brokenA, "prober-az1")
	s.e.NameReporter(brokenB, "prober-az2")
	s.e.NameReporter(healthy, "prober-az3")
	broken := false
	feed := every(5*time.Second, func(time.Time) {
		for i, id := range append(slices.Clone(web), api...) {
			p := healthy
			switch {
			case i < 3 || i == 6:
				p = brokenA
			case i < 6 || i == 7:
				p = brokenB
			}
			o := ok
			if broken && p != healthy {
				o = fail
			}
			s.obs(id, probe, o, p)
			s.obs(id, self, ok, 2)
		}
	})
	s.run(time.Minute, time.Second, feed)
	broken = true
	for range 60 {
		s.run(time.Second, time.Second, feed)
		for _, id := range append(slices.Clone(web), api...) {
			if st := s.state(id); st == eligibility.Ineligible {
				t.Fatalf("instance %v removed by two broken probers against its own healthy reports: %+v", id, s.verdict(id))
			}
		}
	}
	sus := s.e.ProberSuspects()
	names := []string{}
	for _, p := range sus {
		names = append(names, p.Name)
	}
	if !slices.Equal(names, []string{"prober-az1", "prober-az2"}) {
		t.Fatalf("suspect probers %v, want prober-az1 and prober-az2", names)
	}
}

// TestReplayedHistoryDoesNotContradictALiveProber: after a rebuild the
// probe windows replayed from the database are recorded under the
// history reporter (SetHistoryReporter). They are not a peer prober: the
// first live probe sample for an instance supersedes them, so a live
// prober's hard failure removes the instance at once instead of being
// "contradicted" by the history until it falls silent (the rolling-restart
// test saw withdrawals take 15 s, or never land when the prober reported
// once).
func TestReplayedHistoryDoesNotContradictALiveProber(t *testing.T) {
	t.Parallel()
	const az1, history eligibility.ReporterID = 7, 99
	s := newSim(t, eligibility.Options{})
	s.service("svc", contract(probeOnly))
	id := s.add(1, "svc")
	s.e.AssignProber(az1, []eligibility.InstanceID{id})
	s.e.NameReporter(az1, "prober-az1")
	s.e.SetHistoryReporter(history)
	s.run(time.Minute, time.Second, func(now time.Time) {
		if now.Sub(t0)%(5*time.Second) == 0 {
			s.obs(id, probe, ok, az1)
		}
	})
	if v := s.verdict(id); v.State != eligibility.Eligible {
		t.Fatalf("setup: %+v", v)
	}
	// The rebuild's replay: the healthy history, under its own reporter.
	s.obs(id, probe, ok, history)
	from := len(s.all)
	s.run(10*time.Second, time.Second, func(now time.Time) {
		if now.Sub(t0)%(5*time.Second) == 0 {
			s.obs(id, probe, hard, az1)
		}
	})
	trs := s.all[from:]
	if len(trs) != 1 || trs[0].To != eligibility.Ineligible {
		t.Fatalf("transitions after the live prober's hard failure %+v, want one to ineligible", trs)
	}
}

// A hard failure is its reporter's latest word: the same prober's older
// successes, delivered after it (a forwarder sends hard failures first;
// a replica taking a service is replayed what its owner was sent), do
// not dilute it, and the instance is withdrawn.
func TestOlderSuccessesDoNotDiluteAHardFailure(t *testing.T) {
	t.Parallel()
	const az1 eligibility.ReporterID = 7
	s := newSim(t, eligibility.Options{})
	s.service("svc", contract(probeOnly))
	id := s.add(1, "svc")
	s.e.AssignProber(az1, []eligibility.InstanceID{id})
	s.run(10*time.Second, time.Second, func(time.Time) { s.obs(id, probe, ok, az1) })
	if v := s.verdict(id); v.State != eligibility.Eligible {
		t.Fatalf("setup: %+v", v)
	}
	failedAt := s.now.Add(time.Second)
	if err := s.e.Observe(eligibility.Sample{Instance: id, Class: probe, Outcome: hard, At: failedAt, Reporter: az1}); err != nil {
		t.Fatal(err)
	}
	// The 30 s before it arrive late, every half second.
	for back := 30 * time.Second; back > 0; back -= 500 * time.Millisecond {
		if err := s.e.Observe(eligibility.Sample{Instance: id, Class: probe, Outcome: ok, At: failedAt.Add(-back), Reporter: az1}); err != nil {
			t.Fatal(err)
		}
	}
	s.now = failedAt
	trs := s.tick()
	if len(trs) != 1 || trs[0].To != eligibility.Ineligible {
		t.Fatalf("after a hard failure and the prober's older successes: %+v, want one withdrawal; verdict %+v", trs, s.verdict(id))
	}
	// A newer success still ends it, as before.
	s.now = s.now.Add(time.Second)
	s.obs(id, probe, ok, az1)
	s.tick()
	if v := s.verdict(id); v.State != eligibility.Ineligible {
		t.Fatalf("right after: %+v (the dwell holds it out)", v)
	}
}

// HoldSilence: a service whose evidence comes late (another replica
// evaluates it; this one reads its owner's windows) never falls silent
// while held, so a replica dealt it takes it with the verdicts the owner
// held, and a hard failure alone still withdraws an instance. Once the
// hold stops, a class unheard for a silence window past it is silent.
func TestHeldSilence(t *testing.T) {
	t.Parallel()
	const az1 eligibility.ReporterID = 7
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("held=%v", held), func(t *testing.T) {
			t.Parallel()
			s := newSim(t, eligibility.Options{})
			s.service("svc", contract(probeOnly))
			id := s.add(1, "svc")
			s.e.AssignProber(az1, []eligibility.InstanceID{id})
			s.run(10*time.Second, time.Second, func(time.Time) { s.obs(id, probe, ok, az1) })
			// 20 s without a sample: beyond the 15 s silence window.
			s.run(20*time.Second, time.Second, func(now time.Time) {
				if held {
					s.e.HoldSilence("svc", now)
				}
			})
			want := eligibility.Unknown
			if held {
				want = eligibility.Eligible
			}
			if v := s.verdict(id); v.State != want {
				t.Fatalf("after 20 s unheard: %+v, want %v", v, want)
			}
			s.now = s.now.Add(time.Second)
			s.obs(id, probe, hard, az1)
			trs := s.tick()
			withdrawn := len(trs) == 1 && trs[0].To == eligibility.Ineligible
			if withdrawn != held {
				t.Fatalf("a hard failure alone: %+v (withdrawn %v, want %v: a silent instance needs a second class)", trs, withdrawn, held)
			}
		})
	}
	// The hold stops: silent a window later.
	s := newSim(t, eligibility.Options{})
	s.service("svc", contract(probeOnly))
	id := s.add(1, "svc")
	s.e.AssignProber(az1, []eligibility.InstanceID{id})
	s.run(10*time.Second, time.Second, func(time.Time) { s.obs(id, probe, ok, az1) })
	s.run(20*time.Second, time.Second, func(now time.Time) { s.e.HoldSilence("svc", now) })
	stopped := s.now
	s.run(14*time.Second, time.Second, nil)
	if v := s.verdict(id); v.State != eligibility.Eligible {
		t.Fatalf("14 s after the hold stopped: %+v", v)
	}
	s.run(2*time.Second, time.Second, nil)
	if v := s.verdict(id); v.State != eligibility.Unknown {
		t.Fatalf("%v after the hold stopped: %+v, want unknown", s.now.Sub(stopped), v)
	}
}

// A replica dealt a service whose owner died restores the owner's
// admissions from the record (RestoreAdmission) when it never heard the
// instances itself: here the prober's hard failure reached it first and
// the older successes that would have admitted the instance came after
// it (forwarded hard failures go first), so they do not count. Restored
// from eligible, the instance is Unknown only because this engine has
// not heard it: the hard failure withdraws it, as the owner would have.
// Restored from unknown, or unheard for a silence window after the
// restore, a single class still cannot remove it (ADR-05).
func TestARestoredInstanceIsJudgedAsItsRecordedState(t *testing.T) {
	t.Parallel()
	const az1 eligibility.ReporterID = 7
	for _, tc := range []struct {
		name     string
		last     eligibility.State
		unheard  time.Duration // between the restore and the hard failure's evaluation
		withdraw bool
	}{
		{"eligible", eligibility.Eligible, 0, true},
		{"degraded", eligibility.Degraded, 0, true},
		{"unknown", eligibility.Unknown, 0, false},
		{"eligible, unheard for a window", eligibility.Eligible, 16 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSim(t, eligibility.Options{})
			s.service("svc", contract(probeOnly))
			id := s.add(1, "svc")
			s.e.AssignProber(az1, []eligibility.InstanceID{id})
			s.now = s.now.Add(time.Minute)
			failedAt := s.now
			if tc.unheard == 0 {
				// The hard failure, then the 10 s of successes before it.
				if err := s.e.Observe(eligibility.Sample{Instance: id, Class: probe, Outcome: hard, At: failedAt, Reporter: az1}); err != nil {
					t.Fatal(err)
				}
				for back := 10 * time.Second; back > 0; back -= 500 * time.Millisecond {
					if err := s.e.Observe(eligibility.Sample{Instance: id, Class: probe, Outcome: ok, At: failedAt.Add(-back), Reporter: az1}); err != nil {
						t.Fatal(err)
					}
				}
			}
			s.now = s.now.Add(7 * time.Second) // the dead owner's lease expires; this replica is dealt the service
			if err := s.e.RestoreAdmission(id, tc.last, t0, s.now); err != nil {
				t.Fatal(err)
			}
			s.tick()
			if tc.unheard > 0 {
				s.run(tc.unheard, time.Second, nil)
				s.obs(id, probe, hard, az1)
			}
			s.tick()
			v := s.verdict(id)
			if got := v.State == eligibility.Ineligible; got != tc.withdraw {
				t.Fatalf("restored from %v, a hard failure %s: %+v, withdrawn %v, want %v", tc.last, map[bool]string{true: "after a silent window", false: "heard first"}[tc.unheard > 0], v, got, tc.withdraw)
			}
			if !tc.withdraw && v.State != eligibility.Unknown {
				t.Fatalf("restored from %v: %+v, want unknown", tc.last, v)
			}
		})
	}
}
