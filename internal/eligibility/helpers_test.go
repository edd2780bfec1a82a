package eligibility_test

import (
	"time"

	"github.com/musterhq/muster/internal/eligibility"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func iid(n int) eligibility.InstanceID {
	var id eligibility.InstanceID
	id[0], id[1], id[2], id[15] = byte(n>>16), byte(n>>8), byte(n), 0x42
	return id
}

var (
	allCaps     = eligibility.Capabilities{Probe: true, Self: true, Passive: true, Readiness: true}
	probeOnly   = eligibility.Capabilities{Probe: true}
	passiveOnly = eligibility.Capabilities{Passive: true}
)

// tb is what sim needs from *testing.T, *testing.B and *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

// sim drives an engine in simulated time.
type sim struct {
	tb  tb
	e   *eligibility.Engine
	now time.Time
	all []eligibility.Transition // every transition so far, copied
}

func newSim(tb tb, opts eligibility.Options) *sim {
	return &sim{tb: tb, e: eligibility.NewEngine(opts), now: t0}
}

func (s *sim) service(name string, c eligibility.Contract) { s.e.SetService(name, c) }

func (s *sim) add(n int, service string) eligibility.InstanceID {
	s.tb.Helper()
	id := iid(n)
	if err := s.e.AddInstance(id, service, s.now); err != nil {
		s.tb.Fatalf("add instance %d: %v", n, err)
	}
	return id
}

func (s *sim) obs(id eligibility.InstanceID, cl eligibility.Class, o eligibility.Outcome, rep eligibility.ReporterID) {
	s.tb.Helper()
	if err := s.e.Observe(eligibility.Sample{Instance: id, Class: cl, Outcome: o, At: s.now, Reporter: rep}); err != nil {
		s.tb.Fatalf("observe: %v", err)
	}
}

func (s *sim) sample(smp eligibility.Sample) {
	s.tb.Helper()
	smp.At = s.now
	if err := s.e.Observe(smp); err != nil {
		s.tb.Fatalf("observe: %v", err)
	}
}

// tick evaluates at the current time and returns (a copy of) the transitions.
func (s *sim) tick() []eligibility.Transition {
	trs := append([]eligibility.Transition(nil), s.e.Tick(s.now)...)
	s.all = append(s.all, trs...)
	return trs
}

// run advances time by total in steps, calling feed before each tick.
func (s *sim) run(total, step time.Duration, feed func(now time.Time)) {
	end := s.now.Add(total)
	for s.now.Before(end) {
		s.now = s.now.Add(step)
		if feed != nil {
			feed(s.now)
		}
		s.tick()
	}
}

func (s *sim) verdict(id eligibility.InstanceID) eligibility.Verdict {
	s.tb.Helper()
	v, ok := s.e.Verdict(id, s.now)
	if !ok {
		s.tb.Fatalf("no verdict for %v", id)
	}
	return v
}

func (s *sim) state(id eligibility.InstanceID) eligibility.State { return s.verdict(id).State }

// every returns a feed that calls f whenever now is a multiple of period
// past t0.
func every(period time.Duration, f func(now time.Time)) func(time.Time) {
	return func(now time.Time) {
		if now.Sub(t0)%period == 0 {
			f(now)
		}
	}
}

// contract returns the platform defaults for caps with slow start off, so
// tests about other rules see whole weights.
func contract(caps eligibility.Capabilities) eligibility.Contract {
	c := eligibility.DefaultContract(caps)
	c.SlowStart = 0
	return c
}

// flap feeds id adversarial evidence of class cl, one sample a second
// (failing while the instance is in rotation, succeeding while it is out;
// passive from two callers, the population that may remove), until a
// quarantine starts, and returns that transition (nil if none within
// limit).
func (s *sim) flap(id eligibility.InstanceID, cl eligibility.Class, limit time.Duration) *eligibility.Transition {
	s.tb.Helper()
	for end := s.now.Add(limit); s.now.Before(end); {
		s.now = s.now.Add(time.Second)
		smp := eligibility.Sample{Instance: id, Class: cl, Reporter: 1, Outcome: eligibility.Success, Successes: 10}
		if s.state(id).InRotation() {
			smp.Outcome, smp.Successes, smp.Failures = eligibility.Failure, 0, 10
		}
		if cl != eligibility.Passive {
			smp.Successes, smp.Failures = 0, 0
		}
		s.sample(smp)
		if cl == eligibility.Passive {
			smp.Reporter = 2
			s.sample(smp)
		}
		for _, tr := range s.tick() {
			if !tr.QuarantinedUntil.IsZero() {
				return &tr
			}
		}
	}
	return nil
}
