package eligibility_test

import (
	"slices"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/eligibility"
)

// Changed names a service whose instance's health became known or unknown
// without a transition (issue 14): the view carries health, so it must be
// assembled again.
func TestChangedReportsHealthWithoutTransition(t *testing.T) {
	s := newSim(t, eligibility.Options{})
	s.service("api", contract(passiveOnly))
	s.service("web", contract(probeOnly))
	a := s.add(1, "api")
	s.tick()
	if c := s.e.Changed(); len(c) != 0 {
		t.Fatalf("Changed after the first tick = %v, want none", c)
	}

	// No readiness signal: the first success makes health known and
	// changes nothing else.
	s.now = s.now.Add(time.Second)
	s.obs(a, eligibility.Passive, eligibility.Success, 7)
	if ts := s.tick(); len(ts) != 0 {
		t.Fatalf("transitions %+v on a first success at full weight", ts)
	}
	if c := s.e.Changed(); !slices.Equal(c, []string{"api"}) {
		t.Fatalf("Changed = %v, want [api]", c)
	}
	s.now = s.now.Add(time.Millisecond)
	s.tick()
	if c := s.e.Changed(); len(c) != 0 {
		t.Fatalf("Changed with nothing new = %v, want none", c)
	}

	// An instance out of rotation whose classes fall silent: health goes
	// unknown without a transition.
	w := s.add(2, "web")
	s.obs(w, eligibility.Probe, eligibility.Success, 9)
	s.tick()
	s.now = s.now.Add(time.Second)
	s.obs(w, eligibility.Probe, eligibility.HardFailure, 9)
	s.tick()
	if s.state(w) != eligibility.Ineligible || !s.verdict(w).HealthKnown {
		t.Fatalf("web after a hard failure: %+v", s.verdict(w))
	}
	for deadline := s.now.Add(10 * time.Minute); s.verdict(w).HealthKnown; {
		if s.now.After(deadline) {
			t.Fatal("the probe class never fell silent")
		}
		s.now = s.now.Add(time.Second)
		for _, tr := range s.tick() {
			if tr.Instance == w {
				t.Fatalf("a transition %+v while web stays out", tr)
			}
		}
		if !s.verdict(w).HealthKnown && !slices.Contains(s.e.Changed(), "web") {
			t.Fatalf("web's health went unknown at %v; Changed = %v", s.now, s.e.Changed())
		}
	}
}
