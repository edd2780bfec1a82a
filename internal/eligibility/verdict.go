package eligibility

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"time"
)

// Verdict is an instance's eligibility with the evidence behind it.
type Verdict struct {
	// State and Weight are as decided by the last Tick.
	State  State
	Weight float64
	// HealthKnown: some evidence class is speaking (not silent) at now.
	// An instance of a service without a readiness signal is Eligible with
	// HealthKnown false until evidence arrives (ADR-16).
	HealthKnown bool
	// SingleClass: fewer than two classes the service supplies count as
	// sufficient evidence (passive counts only while primary).
	SingleClass bool
	// Primary is the class that may remove the instance on its own.
	Primary Class
	// Awaiting: never in rotation since the instance was added (see
	// Routing.Awaiting).
	Awaiting         bool
	QuarantinedUntil time.Time
	Classes          [numClasses]ClassSummary
	// Reasons are short human explanations, most decisive first.
	Reasons []string
}

// ClassSummary is one evidence class's view of an instance at a moment.
type ClassSummary struct {
	// Present: the service supplies the class and gives it a weight.
	Present bool
	// Silent: present, but no success or failure inside the silence window.
	Silent bool
	// FailureRate is the decayed failure rate (for passive, the mean over
	// reporters inside the window, each reporter counted once).
	FailureRate float64
	LastSample  time.Time
	Samples     uint64
	// Unobservable counts "could not observe" reports, kept apart from
	// both failures and silence.
	Unobservable     uint64
	LastUnobservable time.Time
	// Reporters: passive callers inside the window (at most 8 are kept);
	// probers inside the window whose evidence counts (at most 3 are
	// kept; a suspect prober's does not); 1 for self once a sample has
	// arrived.
	Reporters int
}

// Verdict returns the instance's verdict: state and weight as the last Tick
// decided them, evidence evaluated at now. It changes nothing.
func (e *Engine) Verdict(id InstanceID, now time.Time) (Verdict, bool) {
	i, ok := e.idx.get(id, e.inst)
	if !ok {
		return Verdict{}, false
	}
	in := &e.inst[i]
	svc := e.svcs[in.svc]
	c := &svc.c
	t := now.UnixNano()
	a := e.assess(in, svc, t)
	v := Verdict{
		State: in.state, Weight: in.weight, HealthKnown: a.nsp > 0,
		SingleClass: singleClass(c, a.passivePrimary), Primary: a.primary, Awaiting: !in.admitted,
	}
	if in.qUntil > t {
		v.QuarantinedUntil = tm(in.qUntil)
	}
	for cl := range Class(numClasses) {
		cs := &in.cls[cl]
		s := ClassSummary{
			Present: c.present(cl), FailureRate: a.rate[cl], LastSample: tm(cs.lastSample),
			Samples: uint64(cs.samples), Unobservable: uint64(cs.unobs), LastUnobservable: tm(cs.lastUnobs),
		}
		s.Silent = s.Present && !a.speaking[cl]
		switch {
		case cl == Passive:
			s.Reporters = a.reporters
		case cl == Probe:
			s.Reporters = bits.OnesCount8(a.slotSpeaking &^ a.slotSuspect)
			if !a.speaking[cl] {
				s.FailureRate = rememberedProbe(in)
			}
		case cs.samples > 0:
			s.Reporters = 1
			if !a.speaking[cl] {
				s.FailureRate = cs.t.rate()
			}
		}
		v.Classes[cl] = s
	}
	v.Reasons = e.reasons(in, svc, &a, t)
	return v, true
}

// rememberedProbe is the probe class's rate as last heard: the mean over
// the probers remembered whose evidence counts.
func rememberedProbe(in *instance) float64 {
	var sum float64
	n := 0
	for k := range in.probe {
		sl := &in.probe[k]
		if sl.t.last == 0 || (sl.p != nil && sl.p.suspect) {
			continue
		}
		sum += sl.t.rate()
		n++
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

func singleClass(c *Contract, passivePrimary bool) bool {
	n := 0
	if c.present(Probe) {
		n++
	}
	if c.present(Self) {
		n++
	}
	if c.present(Passive) && passivePrimary {
		n++
	}
	return n < 2
}

func (e *Engine) reasons(in *instance, svc *service, a *assessment, now int64) []string {
	c := &svc.c
	var rs []string
	if in.qUntil > now {
		rs = append(rs, fmt.Sprintf("quarantined until %s", tm(in.qUntil).Format(time.RFC3339)))
	}
	switch in.reason {
	case rHard, rUnready, rSoft, rUncorroborated, rReentry, rAwaiting, rNoReadiness, rAdmitted,
		rContradicted, rContradictionEnded:
		rs = append(rs, e.reasonText(in, svc, in.reason, in.reasonVal))
	}
	if a.nsp == 0 {
		rs = append(rs, "all classes silent")
	}
	for cl := range Class(numClasses) {
		if !c.present(cl) {
			continue
		}
		cs := &in.cls[cl]
		if cl == Probe {
			for k := range in.probe {
				if a.slotSuspect&(1<<k) == 0 {
					continue
				}
				sl := &in.probe[k]
				c := sl.p.counts
				rs = append(rs, fmt.Sprintf("probe from prober %s ignored: suspect since %s, failing %d of the %d targets it reports on (%d contradicted)",
					e.reporterName(in.probeID[k]), tm(sl.p.suspectSince).Format(time.RFC3339), c.failing, c.reported, c.contradicted))
			}
		}
		if a.speaking[cl] {
			r := a.rate[cl]
			switch {
			case cl == Passive && r >= c.RemovalThreshold && a.failingReporters < c.MinPassiveReporters:
				rs = append(rs, fmt.Sprintf("passive failure rate %.2f from %d failing reporters, fewer than %d: cannot remove without another class",
					r, a.failingReporters, c.MinPassiveReporters))
			case r >= c.RemovalThreshold:
				rs = append(rs, fmt.Sprintf("%s failure rate %.2f >= removal %g", cl, r, c.RemovalThreshold))
			default:
				rs = append(rs, fmt.Sprintf("%s failure rate %.2f", cl, r))
			}
			if cl == Passive && !a.passivePrimary && a.reporters < c.MinPassiveReporters && c.PassivePrimaryRPS > 0 && a.rps >= c.PassivePrimaryRPS {
				rs = append(rs, fmt.Sprintf("passive traffic %.1f req/s from %d reporters: primary needs %d", a.rps, a.reporters, c.MinPassiveReporters))
			}
			continue
		}
		s := fmt.Sprintf("%s silent: no sample in %v", cl, time.Duration(e.windowFor(svc, cl, a.passivePrimary)))
		if cl == Probe && a.slotSuspect != 0 {
			s = fmt.Sprintf("probe silent: no sample from a prober that counts in %v", time.Duration(e.windowFor(svc, cl, a.passivePrimary)))
		}
		if cs.lastUnobs != 0 && now-cs.lastUnobs <= svc.window {
			s += "; reporter could not observe (not a failure)"
		}
		if cl == Probe {
			for _, id := range e.outagesCovering(in.id) {
				s += "; prober " + e.reporterName(id) + " in outage"
			}
		}
		rs = append(rs, s)
	}
	if in.dep != "" && a.speaking[Self] {
		switch a.depAuth {
		case Unready:
			rs = append(rs, "dependency "+in.dep+" unready")
		case Weight:
			rs = append(rs, fmt.Sprintf("dependency %s degraded: weight x%g", in.dep, e.opt.DependencyWeight))
		default:
			rs = append(rs, "dependency "+in.dep+" degraded (informational)")
		}
	}
	if in.state.InRotation() && !in.rampDone {
		rs = append(rs, fmt.Sprintf("slow start: weight %.2f", in.weight))
	}
	if singleClass(c, a.passivePrimary) {
		rs = append(rs, "single-class evidence")
	}
	return rs
}

// ServiceStats summarises one service's instances at a moment.
type ServiceStats struct {
	Service   string
	Instances int
	// Counts by state, as the last Tick decided.
	Eligible, Degraded, Ineligible, Unknown int
	// HealthUnknown counts instances in rotation with no speaking class
	// (Unknown, and Eligible with health unknown): the observation
	// coverage gap (ADR-05).
	HealthUnknown int
	Quarantined   int
	// SingleClass: the service has fewer than two sufficient evidence
	// classes (passive counts when its mean traffic per instance is at or
	// above the contract's threshold).
	SingleClass          bool
	SingleClassInstances int
	PassivePrimary       int
	// PassiveRPS is the total caller traffic observed across instances.
	PassiveRPS float64
	// Changes counts eligibility changes (into or out of rotation) within
	// the flap window; FlapRate is that per instance per hour.
	Changes  int
	FlapRate float64
	// Quarantines counts quarantines started since the service was set.
	Quarantines uint64
	// Contradicted counts instances held in rotation, Degraded, because
	// their failure comes from one class and another class or a peer
	// prober contradicts it; Contradictions counts such holds started
	// since the service was set.
	Contradicted   int
	Contradictions uint64
	// SuspectProbed counts instances whose evidence from a suspect prober
	// is being ignored.
	SuspectProbed int
	// Classes are the evidence classes the service's contract weighs, in
	// class order.
	Classes []Class
}

// ServiceStats returns the stats of one service (zero if unknown). It scans
// every instance; use AllServiceStats for more than one service.
func (e *Engine) ServiceStats(service string, now time.Time) ServiceStats {
	i, ok := e.svcIdx[service]
	if !ok {
		return ServiceStats{Service: service}
	}
	return e.stats(now, i)[0]
}

// AllServiceStats returns every service's stats, ordered by name, in one
// pass over the instances.
func (e *Engine) AllServiceStats(now time.Time) []ServiceStats {
	out := e.stats(now, -1)
	slices.SortFunc(out, func(a, b ServiceStats) int { return strings.Compare(a.Service, b.Service) })
	return out
}

func (e *Engine) stats(now time.Time, only int32) []ServiceStats {
	t := now.UnixNano()
	n := len(e.svcs)
	if only >= 0 {
		n = 1
	}
	out := make([]ServiceStats, n)
	slot := func(si int32) *ServiceStats {
		if only >= 0 {
			if si != only {
				return nil
			}
			return &out[0]
		}
		return &out[si]
	}
	for k := range e.inst {
		in := &e.inst[k]
		st := slot(in.svc)
		if st == nil {
			continue
		}
		svc := e.svcs[in.svc]
		a := e.assess(in, svc, t)
		st.Instances++
		switch in.state {
		case Eligible:
			st.Eligible++
		case Degraded:
			st.Degraded++
		case Ineligible:
			st.Ineligible++
		default:
			st.Unknown++
		}
		if in.state.InRotation() && a.nsp == 0 {
			st.HealthUnknown++
		}
		if in.qUntil > t {
			st.Quarantined++
		}
		if singleClass(&svc.c, a.passivePrimary) {
			st.SingleClassInstances++
		}
		if a.passivePrimary {
			st.PassivePrimary++
		}
		if in.state == Degraded && (in.reason == rContradicted || in.reason == rContradictionEnded) {
			st.Contradicted++
		}
		if a.slotSuspect != 0 {
			st.SuspectProbed++
		}
		st.PassiveRPS += a.rps
	}
	for si, svc := range e.svcs {
		st := slot(int32(si))
		if st == nil {
			continue
		}
		st.Service = svc.name
		st.Quarantines = svc.quarant
		st.Contradictions = svc.contradictions
		for cl := range Class(numClasses) {
			if svc.c.present(cl) {
				st.Classes = append(st.Classes, cl)
			}
		}
		width := int64(e.opt.FlapWindow) / flapBuckets
		cur := t / width
		for _, b := range svc.flap {
			if b.slot > cur-flapBuckets && b.slot <= cur {
				st.Changes += int(b.n)
			}
		}
		if st.Instances > 0 {
			st.FlapRate = float64(st.Changes) / float64(st.Instances) / e.opt.FlapWindow.Hours()
		}
		perInstance := 0.0
		if st.Instances > 0 {
			perInstance = st.PassiveRPS / float64(st.Instances)
		}
		st.SingleClass = singleClass(&svc.c, svc.c.present(Passive) && perInstance >= svc.c.PassivePrimaryRPS)
	}
	return out
}

// Routing is the part of a verdict a view needs.
type Routing struct {
	State       State
	Weight      float64
	HealthKnown bool
	Quarantined bool
	// Awaiting: the instance has never been in rotation since it was
	// added (a new instance of a service with a readiness signal, before
	// its first success). It is not capacity yet: the guard neither counts
	// it nor publishes it.
	Awaiting bool
}

// Routing returns what a view needs of an instance at now: much cheaper
// than Verdict (no reasons, no per-class summaries, no allocation), for
// assembling a service's view on every change.
func (e *Engine) Routing(id InstanceID, now time.Time) (Routing, bool) {
	i, ok := e.idx.get(id, e.inst)
	if !ok {
		return Routing{}, false
	}
	in := &e.inst[i]
	t := now.UnixNano()
	a := e.assess(in, e.svcs[in.svc], t)
	return Routing{State: in.state, Weight: in.weight, HealthKnown: a.nsp > 0, Quarantined: in.qUntil > t, Awaiting: !in.admitted}, true
}

// outagesCovering lists the probers in outage assigned to id, in order.
func (e *Engine) outagesCovering(id InstanceID) []ReporterID {
	var out []ReporterID
	for pid, p := range e.probers {
		if p.out && p.covers(id) {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}
