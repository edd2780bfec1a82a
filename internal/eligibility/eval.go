package eligibility

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"time"
)

// Transition is a change of an instance's state or published weight.
// From == To marks a weight-only change (slow-start step, dependency
// degradation) or a quarantine notice for an instance already out.
type Transition struct {
	Instance InstanceID
	Service  string
	From, To State
	Weight   float64
	At       time.Time
	Reason   string
	// History is set on the transition that starts a quarantine: the
	// eligibility changes within the flap window that caused it, oldest
	// first, ending with the change that tipped it over.
	History []Transition
	// QuarantinedUntil is set on the transition that starts a quarantine.
	QuarantinedUntil time.Time
	// QuarantineStep is set with QuarantinedUntil: the quarantine's place
	// in its escalation, 1 for the first (QuarantineBase), 2 for the
	// doubled one, and so on (past the cap it keeps counting). Together
	// with At and QuarantinedUntil it is what RestoreQuarantine needs.
	QuarantineStep int
	// FirstFailureAt is set on removals: the first failed sample of the
	// episode (the hard failure itself on the fast path). At minus
	// FirstFailureAt is the damping cost (ADR-07).
	FirstFailureAt time.Time
}

type reasonCode uint8

const (
	rNone reasonCode = iota
	rAwaiting
	rNoReadiness
	rAdmitted
	rHard
	rUnready
	rSoft
	rUncorroborated
	rSilent
	rDepWeight
	rHealthy
	rReentry
	rQuarantine
	rRestored
	rContradicted
	rContradictionEnded
)

func tm(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

// Tick evaluates every instance that received evidence since the last
// Tick or has a time-driven condition due (silence, dwell, quarantine end,
// a slow-start step; at the latest one contract interval after its last
// evaluation) and returns the resulting transitions in instance order.
// The returned slice is reused by the next Tick: copy what must outlive it
// (History slices are freshly allocated and may be kept).
func (e *Engine) Tick(now time.Time) []Transition {
	clear(e.buf)
	e.buf = e.buf[:0]
	for _, name := range e.changed {
		e.svcs[e.svcIdx[name]].changed = false
	}
	e.changed = e.changed[:0]
	t := now.UnixNano()
	e.tickProbers(t)
	for i := range e.inst {
		in := &e.inst[i]
		if in.dirty || t >= in.nextDue {
			e.eval(in, t)
		}
	}
	return e.buf
}

// Changed names the services with an instance whose Routing changed in the
// last Tick without a transition: its health became known or unknown (the
// first success of an instance without a readiness signal; an instance out
// of rotation whose classes fell silent or spoke again) or its quarantine
// ended while it stayed out. A view carries both, so its service must be
// assembled again. Valid until the next Tick.
func (e *Engine) Changed() []string { return e.changed }

// assessment is the evidence about one instance at one moment.
type assessment struct {
	speaking  [numClasses]bool
	rate      [numClasses]float64
	reporters int // passive reporters inside the silence window
	// failingReporters: of those, the ones whose own rate is at or above
	// removal (their volume weighs in the class rate, not here).
	failingReporters int
	nsp              int // speaking classes
	mean, fused      float64
	primary          Class
	passivePrimary   bool
	rps              float64
	// failMask: speaking classes that fail (rate at or above removal;
	// passive only with MinPassiveReporters failing reporters; self also
	// when it names an unready dependency). healthy: speaking classes able
	// to contradict another's failure (rate below re-entry; passive only
	// with MinPassiveReporters reporters; self not naming an unready
	// dependency). One bit per class.
	failMask, healthy uint8
	failing           int // classes in failMask
	// Probe slots (one bit per slot): speaking, and of those failing
	// (at or above removal), healthy (below re-entry), and from a suspect
	// prober (left out of the probe class).
	slotSpeaking, slotFailing, slotHealthy, slotSuspect uint8
	depAuth                                             Authority
	depActive                                           bool // a speaking self-report names a dependency with more than informational authority
}

// probeWindow is the probe class's silence window: stretched while passive
// is primary, because probing is then at confirmation cadence.
func (e *Engine) windowFor(svc *service, cl Class, passivePrimary bool) int64 {
	if cl == Probe && passivePrimary {
		return int64(float64(svc.window) * e.opt.ConfirmationMultiple)
	}
	return svc.window
}

// assess computes the evidence at now without changing the instance.
func (e *Engine) assess(in *instance, svc *service, now int64) assessment {
	c := &svc.c
	var a assessment
	ps := &in.cls[Passive]
	// n decayed with half-life H holds rate × H / ln 2 requests.
	a.rps = ps.t.volume(now, svc.invH) * math.Ln2 * svc.invH * float64(time.Second)
	if c.present(Passive) && ps.lastSample != 0 && now-svc.heard(ps.lastSample) <= svc.window {
		var num, den float64
		for k := range in.rep {
			r := &in.rep[k]
			if r.last == 0 || now-svc.heard(r.last) > svc.window {
				continue
			}
			conf := min(1, r.volume(now, svc.invH)/e.opt.MinReporterVolume)
			rate := r.rate()
			num += conf * rate
			den += conf
			a.reporters++
			if rate >= c.RemovalThreshold {
				a.failingReporters++
			}
		}
		if den > 0 {
			a.speaking[Passive], a.rate[Passive] = true, num/den
		}
	}
	// Passive is primary by traffic and by population: one caller's
	// volume is not statistical sufficiency (ADR-04).
	thr := c.PassivePrimaryRPS
	if in.passivePrimary {
		thr *= e.opt.PrimaryHysteresis
	}
	a.passivePrimary = a.speaking[Passive] && a.rps >= thr && a.reporters >= c.MinPassiveReporters
	if c.present(Probe) {
		win := e.windowFor(svc, Probe, a.passivePrimary)
		var sum float64
		n := 0
		for k := range in.probe {
			sl := &in.probe[k]
			if sl.t.last == 0 || now-svc.heard(sl.t.last) > win {
				continue
			}
			bit := uint8(1) << k
			a.slotSpeaking |= bit
			r := sl.t.rate()
			switch {
			case r >= c.RemovalThreshold:
				a.slotFailing |= bit
			case r < svc.reentry:
				a.slotHealthy |= bit
			}
			if sl.p != nil && sl.p.suspect {
				a.slotSuspect |= bit
				continue
			}
			sum += r
			n++
		}
		if n > 0 {
			a.speaking[Probe], a.rate[Probe] = true, sum/float64(n)
		}
	}
	if cs := &in.cls[Self]; c.present(Self) && cs.lastSample != 0 && now-svc.heard(cs.lastSample) <= svc.window {
		a.speaking[Self], a.rate[Self] = true, cs.t.rate()
	}
	var num, den float64
	for cl := range Class(numClasses) {
		if !a.speaking[cl] {
			continue
		}
		a.nsp++
		w := c.Weights[cl]
		if cl == Passive && !a.passivePrimary && c.PassivePrimaryRPS > 0 {
			// Below the traffic threshold passive evidence is not yet
			// statistically sufficient: it counts in proportion to its
			// traffic, so the weight is continuous across the threshold.
			w *= min(1, a.rps/c.PassivePrimaryRPS)
		}
		num += w * a.rate[cl]
		den += w
		r := a.rate[cl]
		switch {
		case r >= c.RemovalThreshold && (cl != Passive || a.failingReporters >= c.MinPassiveReporters):
			a.failMask |= 1 << cl
		case r < svc.reentry && (cl != Passive || a.reporters >= c.MinPassiveReporters):
			a.healthy |= 1 << cl
		}
	}
	switch {
	case a.passivePrimary:
		a.primary = Passive
	case a.speaking[Probe]:
		a.primary = Probe
	case a.speaking[Self]:
		a.primary = Self
	case a.speaking[Passive]:
		a.primary = Passive
	case c.present(Probe):
		a.primary = Probe
	case c.present(Self):
		a.primary = Self
	default:
		a.primary = Passive
	}
	if den > 0 {
		a.mean = num / den
		// The primary class may remove on its own; the others count
		// through the weighted mean.
		a.fused = max(a.mean, a.rate[a.primary])
	}
	if in.dep != "" && a.speaking[Self] {
		d, ok := c.Dependencies[in.dep]
		if !ok {
			d = Dependency{Authority: Weight}
		}
		a.depAuth = d.effective()
		a.depActive = a.depAuth != Informational
		if a.depAuth == Unready {
			// The instance's own word counts as its class failing.
			a.failMask |= 1 << Self
			a.healthy &^= 1 << Self
		}
	}
	a.failing = bits.OnesCount8(a.failMask)
	return a
}

// contradict says whether a failure from class f alone is contradicted:
// no other class fails, and another class, or for probe a peer prober, is
// speaking and healthy. Passive failing as primary is not contradicted: its
// failure is already the word of MinPassiveReporters callers, and grey
// failure is exactly what a probe cannot see and a process reports healthy
// through (ADR-04).
func contradict(a *assessment, f Class, hard bool) contradiction {
	if a.failMask&^(1<<f) != 0 || (f == Passive && a.passivePrimary) {
		return contradiction{}
	}
	ct := contradiction{fail: f, hard: hard, by: a.healthy &^ (1 << f), nfail: a.failingReporters}
	if f == Probe {
		ct.failing = a.slotFailing &^ a.slotSuspect
		ct.peers = a.slotHealthy &^ a.slotSuspect
	}
	return ct
}

func (e *Engine) eval(in *instance, now int64) {
	svc := e.svcs[in.svc]
	in.dirty = false
	pend := in.pendFail
	in.pendFail = false
	if in.knownUntil != 0 && (now >= in.knownUntil || in.state != Unknown) {
		in.knownUntil = 0 // left Unknown since the restore, or unheard for a window: as any other
	}
	if in.hard && !in.hardExternal && in.hardClass == Probe {
		if sl := in.probeSlotOf(in.hardRep); sl != nil && sl.p != nil && sl.p.suspect {
			in.hard = false // the prober turned suspect: its failures no longer count
		}
	}
	a := e.assess(in, svc, now)
	in.passivePrimary, in.primary = a.passivePrimary, a.primary
	if a.nsp > 0 {
		in.everKnown = true
	}
	if in.dep != "" && !a.speaking[Self] {
		in.dep = "" // a silent class's claim goes stale with it
	}
	emitted := len(e.buf)
	if in.state == Ineligible {
		e.evalOut(in, svc, &a, now)
	} else {
		e.evalIn(in, svc, &a, pend, now)
	}
	// What Routing shows: a change of it that no transition carries must
	// still reach the view.
	known, quar := a.nsp > 0, in.qUntil > now
	if (known != in.shownKnown || quar != in.shownQuarantined) && len(e.buf) == emitted && !svc.changed {
		svc.changed = true
		e.changed = append(e.changed, svc.name)
	}
	in.shownKnown, in.shownQuarantined = known, quar
	e.countProbers(in, &a)
	in.nextDue = e.due(in, svc, &a, now)
}

// evalIn decides for an instance in rotation.
func (e *Engine) evalIn(in *instance, svc *service, a *assessment, pend bool, now int64) {
	c := &svc.c
	code, val := rNone, 0.0
	switch {
	case in.hard:
		code = rHard
	case a.depActive && a.depAuth == Unready:
		code = rUnready
	case pend && a.failing > 0 && a.fused >= c.RemovalThreshold:
		// Removal needs fresh failure evidence: a class falling silent
		// may raise the fused rate but never triggers removal (ADR-05).
		// It needs a failing class too: passive below its population
		// (MinPassiveReporters failing callers) cannot remove alone.
		code, val = rSoft, a.fused
	}
	// A failure from one class that another class (or a peer prober)
	// contradicts degrades the instance instead (ADR-04: a partitioned
	// prober must not drain a healthy fleet). Out-of-band hard failures and
	// the instance's own unready dependency are never contradicted.
	var ct contradiction
	switch {
	case code == rHard && !in.hardExternal:
		ct = contradict(a, in.hardClass, true)
	case code == rHard, code == rUnready:
	case a.failing == 1 && a.fused >= c.RemovalThreshold:
		ct = contradict(a, Class(bits.TrailingZeros8(a.failMask)), false)
	}
	if ct.ok() {
		if in.state != Degraded || in.reason != rContradicted {
			svc.contradictions++
		}
		// A contradicted hard failure latches nothing: its track stays
		// at rate 1, and once the contradiction ends removal needs fresh
		// failure evidence, as for any other failure (a class falling
		// silent never removes).
		in.hard = false
		in.ctr = ct
		e.publish(in, svc, Degraded, e.ramp(in, svc, a, now)*e.opt.DependencyWeight, rContradicted, a.fused, now)
		return
	}
	// Unknown -> ineligible needs a second, independent class (ADR-05);
	// only the out-of-band hard path (lease, process) skips that, and an
	// instance restated from a known state not yet heard here
	// (RestoreAdmission) is judged as that state.
	if code != rNone && (in.state != Unknown || in.hardExternal || a.failing >= 2 || now < in.knownUntil) {
		e.remove(in, svc, now, code, val)
		return
	}
	next := in.state
	switch {
	case code != rNone || (in.state == Unknown && a.nsp > 0 && a.fused >= c.RemovalThreshold):
		next, code, val = Unknown, rUncorroborated, a.fused
	case in.state == Degraded && (in.reason == rContradicted || in.reason == rContradictionEnded) &&
		a.failing > 0 && a.fused >= c.RemovalThreshold:
		// The contradiction ended between failure samples: the
		// instance stays as it is until fresh failure evidence removes
		// it or the failure clears.
		e.publish(in, svc, Degraded, in.weight, rContradictionEnded, a.fused, now)
		return
	case a.nsp == 0 && in.everKnown:
		next, code = Unknown, rSilent
	case a.nsp == 0:
		code = rNoReadiness
	case a.depActive && a.depAuth == Weight:
		next, code = Degraded, rDepWeight
	default:
		next, code = Eligible, rHealthy
	}
	w := e.ramp(in, svc, a, now)
	if next == Degraded {
		w *= e.opt.DependencyWeight
	}
	e.publish(in, svc, next, w, code, val, now)
}

// evalOut decides for an instance out of rotation.
func (e *Engine) evalOut(in *instance, svc *service, a *assessment, now int64) {
	c := &svc.c
	unready := a.depActive && a.depAuth == Unready
	if !in.admitted {
		if in.readySeen && !in.hard && !unready && a.nsp > 0 && a.fused < c.RemovalThreshold {
			in.admitted = true
			e.enter(in, svc, a, now, rAdmitted, false)
		}
		return
	}
	switch {
	case now < in.qUntil, in.hard, unready, a.nsp == 0,
		a.fused >= svc.reentry, now-in.inelSince < svc.dwell:
		return
	}
	e.enter(in, svc, a, now, rReentry, true)
}

func (e *Engine) enter(in *instance, svc *service, a *assessment, now int64, code reasonCode, counted bool) {
	if counted && e.flapExceeds(in, now) {
		e.recordFlap(in, svc, Ineligible, Eligible, code, now, false)
		in.reason, in.reasonVal = code, a.fused
		tr := Transition{Instance: in.id, Service: svc.name, From: Ineligible, To: Ineligible,
			At: tm(now), Reason: "re-entry held: " + e.reasonText(in, svc, code, a.fused)}
		e.quarantine(in, svc, now, &tr)
		e.buf = append(e.buf, tr)
		return
	}
	in.tIn, in.rampDone, in.firstFail = now, false, [numClasses + 1]int64{}
	next := Eligible
	w := e.ramp(in, svc, a, now)
	if a.depActive && a.depAuth == Weight {
		next, w = Degraded, w*e.opt.DependencyWeight
	}
	if counted {
		e.recordFlap(in, svc, Ineligible, next, code, now, true)
	}
	e.publish(in, svc, next, w, code, a.fused, now)
}

func (e *Engine) remove(in *instance, svc *service, now int64, code reasonCode, val float64) {
	from := in.state
	first := in.episodeStart()
	if first == 0 || first > now {
		first = now
	}
	quarantine := e.flapExceeds(in, now)
	e.recordFlap(in, svc, from, Ineligible, code, now, true)
	in.state, in.weight, in.inelSince, in.firstFail = Ineligible, 0, now, [numClasses + 1]int64{}
	in.reason, in.reasonVal = code, val
	tr := Transition{Instance: in.id, Service: svc.name, From: from, To: Ineligible,
		At: tm(now), Reason: e.reasonText(in, svc, code, val), FirstFailureAt: tm(first)}
	if quarantine {
		e.quarantine(in, svc, now, &tr)
	}
	e.buf = append(e.buf, tr)
}

func (e *Engine) publish(in *instance, svc *service, next State, w float64, code reasonCode, val float64, now int64) {
	in.reason, in.reasonVal = code, val
	if next == in.state && w == in.weight {
		return
	}
	from := in.state
	in.state, in.weight = next, w
	reason := e.reasonText(in, svc, code, val)
	if from == next && !in.rampDone {
		reason = fmt.Sprintf("slow start: weight %.2f (%s)", w, reason)
	}
	e.buf = append(e.buf, Transition{Instance: in.id, Service: svc.name, From: from, To: next,
		Weight: w, At: tm(now), Reason: reason})
}

// ramp is the slow-start weight (ADR-12): the fraction of SlowStart spent
// in rotation, capped by the success rate, in SlowStartSteps steps and
// never below one step.
func (e *Engine) ramp(in *instance, svc *service, a *assessment, now int64) float64 {
	if in.rampDone {
		return 1
	}
	ss := int64(svc.c.SlowStart)
	if ss <= 0 {
		in.rampDone = true
		return 1
	}
	steps := int64(e.opt.SlowStartSteps)
	kt := steps
	if el := now - in.tIn; el < ss {
		kt = max(0, el) * steps / ss
	}
	ks := steps
	if a.nsp > 0 {
		if s := (1 - a.fused) / (1 - svc.c.ReentryThreshold); s < 1 {
			ks = int64(s * float64(steps))
		}
	}
	k := max(1, min(kt, ks))
	if k == steps {
		in.rampDone = true
	}
	return float64(k) / float64(steps)
}

// due is when the instance must next be evaluated without new evidence.
func (e *Engine) due(in *instance, svc *service, a *assessment, now int64) int64 {
	d := now + svc.interval
	for _, cl := range [...]Class{Self, Passive} {
		if a.speaking[cl] {
			d = min(d, svc.heard(in.cls[cl].lastSample)+svc.window+1)
		}
	}
	if a.slotSpeaking != 0 {
		win := e.windowFor(svc, Probe, a.passivePrimary)
		for k := range in.probe {
			if a.slotSpeaking&(1<<k) != 0 {
				d = min(d, svc.heard(in.probe[k].t.last)+win+1)
			}
		}
	}
	if a.speaking[Passive] {
		for k := range in.rep {
			if l := in.rep[k].last; l != 0 && now-svc.heard(l) <= svc.window {
				d = min(d, svc.heard(l)+svc.window+1)
			}
		}
	}
	if in.state == Ineligible && in.admitted {
		if in.qUntil > now {
			d = min(d, in.qUntil)
		}
		if t := in.inelSince + svc.dwell; t > now {
			d = min(d, t)
		}
	}
	if in.state != Ineligible && !in.rampDone && svc.c.SlowStart > 0 {
		ss, steps := int64(svc.c.SlowStart), int64(e.opt.SlowStartSteps)
		kt := max(0, now-in.tIn) * steps / ss
		next := in.tIn + ((kt+1)*ss+steps-1)/steps
		d = min(d, max(next, now+1))
	}
	return d
}

// flapExceeds reports whether one more eligibility change now would exceed
// the flap threshold within the window.
func (e *Engine) flapExceeds(in *instance, now int64) bool {
	return e.changesInWindow(in, now)+1 > e.opt.FlapThreshold
}

func (e *Engine) changesInWindow(in *instance, now int64) int {
	n := 0
	for _, f := range in.ring[:in.ringN] {
		if now-f.at < int64(e.opt.FlapWindow) {
			n++
		}
	}
	return n
}

func (e *Engine) recordFlap(in *instance, svc *service, from, to State, code reasonCode, now int64, countService bool) {
	if int(in.ringN) == maxFlapRing {
		copy(in.ring[:], in.ring[1:])
		in.ringN--
	}
	in.ring[in.ringN] = flapEntry{at: now, from: from, to: to, code: code}
	in.ringN++
	if countService {
		width := int64(e.opt.FlapWindow) / flapBuckets
		slot := now / width
		b := &svc.flap[slot%flapBuckets]
		if b.slot != slot {
			*b = flapBucket{slot: slot}
		}
		b.n++
	}
}

// quarantine holds the instance out (ADR-09) and attaches the history to tr.
func (e *Engine) quarantine(in *instance, svc *service, now int64, tr *Transition) {
	n := e.changesInWindow(in, now)
	if in.qEnd != 0 && now-in.qEnd >= int64(e.opt.QuarantineForgive) {
		in.qLevel = 0
	}
	d := e.opt.QuarantineBase
	for i := uint8(0); i < in.qLevel && d < e.opt.QuarantineCap; i++ {
		d *= 2
	}
	d = min(d, e.opt.QuarantineCap)
	if in.qLevel < math.MaxUint8 {
		in.qLevel++
	}
	in.qUntil = now + int64(d)
	in.qEnd = in.qUntil
	for _, f := range in.ring[:in.ringN] {
		if now-f.at < int64(e.opt.FlapWindow) {
			tr.History = append(tr.History, Transition{Instance: in.id, Service: svc.name,
				From: f.from, To: f.to, At: tm(f.at), Reason: codeText[f.code]})
		}
	}
	in.ringN = 0
	svc.quarant++
	in.reason, in.reasonVal = rQuarantine, float64(n)
	tr.QuarantinedUntil = tm(in.qUntil)
	tr.QuarantineStep = int(in.qLevel)
	tr.Reason = fmt.Sprintf("quarantined for %v: %d changes in %v; %s", d, n, e.opt.FlapWindow, tr.Reason)
}

var codeText = [...]string{
	rNone:           "",
	rAwaiting:       "awaiting first success",
	rNoReadiness:    "no readiness signal: eligible with health unknown",
	rAdmitted:       "first success: entering rotation",
	rHard:           "hard failure",
	rUnready:        "dependency unready",
	rSoft:           "failure rate at or above removal",
	rUncorroborated: "failure from one class only: unknown needs a second class to corroborate",
	rSilent:         "all classes silent",
	rDepWeight:      "dependency degraded: weight reduced",
	rHealthy:        "evidence healthy",
	rReentry:        "failure rate below re-entry after dwell",
	rQuarantine:     "quarantined",
	rRestored:       "out of rotation before the restart",

	rContradicted:       "failure from one class contradicted by another: degraded",
	rContradictionEnded: "failure no longer contradicted: removal awaits fresh failure evidence",
}

func (e *Engine) reasonText(in *instance, svc *service, code reasonCode, val float64) string {
	c := &svc.c
	switch code {
	case rHard:
		if in.hardExternal && in.hardReason != "" {
			return "hard failure: " + in.hardReason
		}
	case rUnready:
		return "dependency " + in.dep + " unready"
	case rSoft:
		return fmt.Sprintf("failure rate %.2f (primary %s) >= removal %g", val, in.primary, c.RemovalThreshold)
	case rUncorroborated:
		return fmt.Sprintf("failure rate %.2f >= removal %g from one class only: unknown needs a second class to corroborate", val, c.RemovalThreshold)
	case rDepWeight:
		return fmt.Sprintf("dependency %s degraded: weight x%g", in.dep, e.opt.DependencyWeight)
	case rReentry:
		return fmt.Sprintf("failure rate %.2f < re-entry %g after dwell %v", val, c.ReentryThreshold, time.Duration(svc.dwell))
	case rContradicted, rContradictionEnded:
		return e.contradictionText(in, code)
	}
	return codeText[code]
}

// contradictionText names the failing class, its reporter and what
// contradicts it: "probe failing (prober prober-az1) contradicted by self
// and passive: degraded".
func (e *Engine) contradictionText(in *instance, code reasonCode) string {
	ct := &in.ctr
	var b strings.Builder
	b.WriteString(ct.fail.String())
	if ct.hard {
		b.WriteString(" hard failure")
	} else {
		b.WriteString(" failing")
	}
	switch ct.fail {
	case Probe:
		if names := e.slotNames(in, ct.failing); len(names) > 0 {
			if len(names) == 1 {
				b.WriteString(" (prober ")
			} else {
				b.WriteString(" (probers ")
			}
			b.WriteString(joinAnd(names))
			b.WriteString(")")
		}
	case Passive:
		fmt.Fprintf(&b, " (%d reporters)", ct.nfail)
	}
	if code == rContradictionEnded {
		b.WriteString(", no longer contradicted: removal awaits fresh failure evidence")
		return b.String()
	}
	var by []string
	for cl := range Class(numClasses) {
		if ct.by&(1<<cl) != 0 {
			by = append(by, cl.String())
		}
	}
	for _, n := range e.slotNames(in, ct.peers) {
		by = append(by, "prober "+n)
	}
	b.WriteString(" contradicted by ")
	b.WriteString(joinAnd(by))
	b.WriteString(": degraded")
	return b.String()
}

// slotNames names the probers of the probe slots in mask.
func (e *Engine) slotNames(in *instance, mask uint8) []string {
	var out []string
	for k := range in.probe {
		if mask&(1<<k) != 0 {
			out = append(out, e.reporterName(in.probeID[k]))
		}
	}
	return out
}

// joinAnd joins "a", "a and b", "a, b and c".
func joinAnd(s []string) string {
	switch len(s) {
	case 0:
		return ""
	case 1:
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
