package evaluator

import (
	"fmt"
	"strings"
	"time"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
)

// Alarm kinds for probers (ADR-05: prober reachability is itself a
// monitored signal, attributed to the prober rather than inferred from its
// targets).
const (
	// AlarmProberOutage: the prober has observed none of its targets for
	// the engine's ProberSilence; its targets' probe evidence is silent.
	AlarmProberOutage = "prober_outage"
	// AlarmProberSuspect: the prober reports failure that other evidence
	// classes or peer probers contradict on many of its targets; its
	// evidence is ignored until it stops failing.
	AlarmProberSuspect = "prober_suspect"
)

// ProberAlarm is an open alarm about one prober.
type ProberAlarm struct {
	Kind string `json:"kind"` // prober_outage or prober_suspect
	// Prober is the prober's name as its assignment gives it.
	Prober string    `json:"prober"`
	Since  time.Time `json:"since"`
	Detail string    `json:"detail"`
}

// Alarm is a in the shape of the server's alarm list. A prober serves many
// services, so Service is empty; Detail names the prober.
func (a ProberAlarm) Alarm() assembler.Alarm {
	return assembler.Alarm{Kind: a.Kind, Since: a.Since, Detail: a.Detail}
}

// assignProber hands the engine a prober's targets and its name, which the
// engine's reasons use instead of the interned number. Called with e.mu
// held.
func (e *Evaluator) assignProber(id eligibility.ReporterID, name string, targets []eligibility.InstanceID) {
	e.engine.NameReporter(id, name)
	e.engine.AssignProber(id, targets)
}

// ProberAlarms lists the prober outages and suspicions current at the last
// evaluation, outages first, each ordered by prober; nil while the
// evaluator is rebuilding.
func (e *Evaluator) ProberAlarms() []ProberAlarm {
	if !e.ready.Load() {
		return nil
	}
	e.mu.Lock()
	outages := e.engine.ProberOutages()
	suspects := e.engine.ProberSuspects()
	e.mu.Unlock()
	var names map[uint64]string
	name := func(id eligibility.ReporterID, n string) string {
		if n != "" {
			return n
		}
		if names == nil {
			names = e.reporterNames()
		}
		if n, ok := names[uint64(id)]; ok {
			return strings.TrimPrefix(n, "prober:")
		}
		return fmt.Sprint(uint64(id))
	}
	out := make([]ProberAlarm, 0, len(outages)+len(suspects))
	for _, o := range outages {
		p := name(o.Prober, o.Name)
		detail := fmt.Sprintf("prober %s has observed none of its %d targets since %s", p, o.Targets, o.Since.UTC().Format(time.RFC3339))
		if o.Unobservable {
			detail = fmt.Sprintf("prober %s reports only that it cannot observe its %d targets, since %s", p, o.Targets, o.Since.UTC().Format(time.RFC3339))
		}
		detail += "; their probe evidence is silent (unknown, not ineligible)"
		out = append(out, ProberAlarm{Kind: AlarmProberOutage, Prober: p, Since: o.Since, Detail: detail})
	}
	for _, s := range suspects {
		p := name(s.Prober, s.Name)
		var b strings.Builder
		fmt.Fprintf(&b, "prober %s reports failure on %d of the %d targets it reports on (%d assigned), %d of them contradicted by other evidence or a peer prober; its evidence is ignored until it stops failing",
			p, s.Failing, s.Reported, s.Targets, s.Contradicted)
		for i, sc := range s.Services {
			sep := ", "
			if i == 0 {
				sep = " ("
			}
			fmt.Fprintf(&b, "%s%s: %d failing, %d contradicted", sep, sc.Service, sc.Failing, sc.Contradicted)
		}
		if len(s.Services) > 0 {
			b.WriteString(")")
		}
		out = append(out, ProberAlarm{Kind: AlarmProberSuspect, Prober: p, Since: s.SuspectSince, Detail: b.String()})
	}
	return out
}

// ProberReach is one prober's reach now: how many of its assigned
// targets it reports on, and whether it is out (observes none) or
// suspect (its failures are contradicted and ignored).
type ProberReach struct {
	Prober            string
	Targets, Reported int
	Outage, Suspect   bool
}

// ProberReaches returns every assigned prober's reach, by name (nil
// until the evaluator is ready).
func (e *Evaluator) ProberReaches() []ProberReach {
	if !e.ready.Load() {
		return nil
	}
	e.mu.Lock()
	stats := e.engine.ProberStats()
	e.mu.Unlock()
	var names map[uint64]string
	out := make([]ProberReach, 0, len(stats))
	for _, s := range stats {
		n := s.Name
		if n == "" {
			if names == nil {
				names = e.reporterNames()
			}
			n = strings.TrimPrefix(names[uint64(s.Prober)], "prober:")
		}
		if n == "" {
			n = fmt.Sprint(uint64(s.Prober))
		}
		out = append(out, ProberReach{Prober: n, Targets: s.Targets, Reported: s.Reported, Outage: s.Outage, Suspect: s.Suspect})
	}
	return out
}
