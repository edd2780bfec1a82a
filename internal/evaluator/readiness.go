package evaluator

import (
	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/eligibility"
)

// Readiness is what a reconciliation source says of one of its instances:
// a Kubernetes EndpointSlice endpoint's conditions (ready, serving,
// terminating), or an inventory snapshot's health column.
type Readiness struct {
	Instance uuid.UUID
	// Serving: the instance can take traffic. Ready implies it; an
	// endpoint terminating but still serving (KEP-1669) keeps it until it
	// stops serving.
	Ready, Serving, Terminating bool
}

// ObserveReadiness applies readiness evidence from the reconciliation
// source named source, as self-class samples attributed to that source
// ("reconcile:<source>"): the orchestrator relays the instance's own
// readiness probe, so it is the instance's self-report in the core's terms,
// and it needs no token because the reconciler is muster itself, handing
// over only instances of its own source. Serving is a success, not serving
// a failure (soft: one signal never drains an instance on its own).
// Instances the evaluator does not know are skipped; before the rebuild is
// done nothing is applied. It returns how many samples were applied.
func (e *Evaluator) ObserveReadiness(source string, rs []Readiness) int {
	if !e.ready.Load() || len(rs) == 0 {
		return 0
	}
	reporter := e.internReporter("reconcile:" + source)
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.cfg.Now()
	n := 0
	for _, r := range rs {
		in, ok := e.instances[r.Instance]
		if !ok {
			continue
		}
		s := eligibility.Sample{Instance: eligibility.InstanceID(r.Instance), Class: eligibility.Self, At: now, Reporter: reporter, Outcome: eligibility.Success}
		if !r.Serving {
			s.Outcome = eligibility.Failure
		}
		if err := e.engine.Observe(s); err != nil {
			continue
		}
		e.countWindow(in.win, s)
		n++
	}
	e.metrics.accepted.Add(float64(n))
	return n
}
