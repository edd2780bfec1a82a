package eligibility

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// prober is an assigned prober: its targets, its outage and its
// suspicion.
type prober struct {
	targets                []InstanceID // sorted
	assignedAt             int64
	lastSeen, lastObserved int64
	out                    bool
	since                  int64
	outages                uint64
	// gone: forgotten by AssignProber; slots may still point here until
	// their reporter's next sample.
	gone bool

	suspect      bool
	suspectSince int64
	suspicions   uint64
	// counts are over the probe slots pointing here (probeSlot.in), as of
	// their last evaluation, in total and per service index.
	counts proberCounts
	bySvc  map[int32]proberCounts
}

type proberCounts struct {
	reported, failing, contradicted int
}

func (c *proberCounts) add(f slotFlags, d int) {
	if f&slotReported != 0 {
		c.reported += d
	}
	if f&slotFailing != 0 {
		c.failing += d
	}
	if f&slotContradicted != 0 {
		c.contradicted += d
	}
}

func (p *prober) add(svc int32, f slotFlags, d int) {
	if f == 0 {
		return
	}
	p.counts.add(f, d)
	if p.bySvc == nil {
		p.bySvc = map[int32]proberCounts{}
	}
	c := p.bySvc[svc]
	c.add(f, d)
	if c == (proberCounts{}) {
		delete(p.bySvc, svc)
		return
	}
	p.bySvc[svc] = c
}

// uncount takes the slot's flags out of the prober that holds them.
func (sl *probeSlot) uncount(svc int32) {
	if sl.in != nil {
		sl.in.add(svc, sl.cnt, -1)
	}
	sl.in, sl.cnt = nil, 0
}

// countProbers brings the instance's probe slots' contributions to their
// probers' counts up to date with the assessment: reported (a sample
// inside the silence window), failing (rate at or above removal) and
// contradicted (failing, no other class failing, and another class or a
// peer prober healthy). They are kept whether or not the prober is
// suspect, so a suspect prober stays suspect while it keeps failing.
func (e *Engine) countProbers(in *instance, a *assessment) {
	othersFail := a.failMask&^(1<<Probe) != 0
	othersHealthy := a.healthy&^(1<<Probe) != 0
	peers := a.slotHealthy &^ a.slotSuspect
	for k := range in.probe {
		sl := &in.probe[k]
		if sl.p == nil && sl.in == nil {
			continue
		}
		bit := uint8(1) << k
		var f slotFlags
		if a.slotSpeaking&bit != 0 {
			f = slotReported
			if a.slotFailing&bit != 0 {
				f |= slotFailing
				if !othersFail && (othersHealthy || peers&^bit != 0) {
					f |= slotContradicted
				}
			}
		}
		if sl.p == sl.in && f == sl.cnt {
			continue
		}
		sl.uncount(in.svc)
		if sl.p != nil && !sl.p.gone {
			sl.in, sl.cnt = sl.p, f
			sl.p.add(in.svc, f, 1)
		}
	}
}

// AssignProber declares which instances prober is expected to report, for
// outage detection and suspicion; it replaces the prober's earlier
// assignment. An empty targets list forgets the prober.
func (e *Engine) AssignProber(p ReporterID, targets []InstanceID) {
	if len(targets) == 0 {
		if pr, ok := e.probers[p]; ok {
			pr.gone = true
			if pr.suspect {
				pr.suspect = false
				e.dirtyTargets(pr)
			}
			delete(e.probers, p)
		}
		return
	}
	ts := slices.Clone(targets)
	slices.SortFunc(ts, func(a, b InstanceID) int { return bytes.Compare(a[:], b[:]) })
	ts = slices.Compact(ts)
	if pr, ok := e.probers[p]; ok {
		pr.targets = ts
		return
	}
	e.probers[p] = &prober{targets: ts}
}

// NameReporter gives a reporter the name reasons use for it (the prober's
// subject, say); an empty name forgets it. Unnamed reporters appear by
// number.
func (e *Engine) NameReporter(id ReporterID, name string) {
	if name == "" {
		delete(e.names, id)
		return
	}
	e.names[id] = name
}

func (e *Engine) reporterName(id ReporterID) string {
	if n, ok := e.names[id]; ok {
		return n
	}
	return fmt.Sprint(uint64(id))
}

func (p *prober) covers(id InstanceID) bool {
	_, ok := slices.BinarySearchFunc(p.targets, id, func(a, b InstanceID) int { return bytes.Compare(a[:], b[:]) })
	return ok
}

// dirtyTargets has the prober's targets evaluated at the next Tick (its
// suspicion changed what their probe evidence is).
func (e *Engine) dirtyTargets(p *prober) {
	for _, id := range p.targets {
		if i, ok := e.idx.get(id, e.inst); ok {
			e.inst[i].dirty = true
		}
	}
}

// ProberOutage is an assigned prober that has observed none of its
// targets for Options.ProberSilence: the silence is attributed to the
// prober, and its targets' probe class goes silent rather than failed.
type ProberOutage struct {
	Prober ReporterID
	// Name is the prober's name (NameReporter), "" if it has none.
	Name string
	// Since is the prober's last observation (or its assignment, if it
	// never observed).
	Since   time.Time
	Targets int
	// Unobservable: the prober is still reporting, but only that it cannot
	// observe (a prober-side failure rather than a dead prober).
	Unobservable bool
	// Episodes counts this prober's outages since it was assigned.
	Episodes uint64
}

// ProberOutages returns the outages current at the last Tick, ordered by
// prober.
func (e *Engine) ProberOutages() []ProberOutage {
	var out []ProberOutage
	for id, p := range e.probers {
		if p.out {
			out = append(out, ProberOutage{
				Prober: id, Name: e.names[id], Since: time.Unix(0, p.since), Targets: len(p.targets),
				Unobservable: p.lastSeen > p.since, Episodes: p.outages,
			})
		}
	}
	slices.SortFunc(out, func(a, b ProberOutage) int { return cmp.Compare(a.Prober, b.Prober) })
	return out
}

// ProberServiceCounts is a prober's counts over one service's instances.
type ProberServiceCounts struct {
	Service string
	// Reported: instances it reported on inside the silence window;
	// Failing: of those, the ones it reports at or above removal;
	// Contradicted: of those, the ones where no other class fails and
	// another class or a peer prober is healthy.
	Reported, Failing, Contradicted int
}

// ProberStat is one assigned prober's standing at the last Tick.
type ProberStat struct {
	Prober ReporterID
	Name   string
	// Targets is the size of its assignment; Reported, Failing and
	// Contradicted are as in ProberServiceCounts, over all its targets.
	Targets                         int
	Reported, Failing, Contradicted int
	// Outage and Suspect: see ProberOutages and ProberSuspects.
	Outage, Suspect bool
	// SuspectSince is when the current suspicion began (zero if none);
	// Suspicions counts suspicions since it was assigned.
	SuspectSince time.Time
	Suspicions   uint64
	// Services breaks the counts down by service, ordered by name; only
	// services with a non-zero count are listed.
	Services []ProberServiceCounts
}

// ProberStats returns every assigned prober's counts, ordered by prober.
func (e *Engine) ProberStats() []ProberStat {
	out := make([]ProberStat, 0, len(e.probers))
	for id, p := range e.probers {
		out = append(out, e.proberStat(id, p))
	}
	slices.SortFunc(out, func(a, b ProberStat) int { return cmp.Compare(a.Prober, b.Prober) })
	return out
}

// ProberSuspects returns the probers suspect at the last Tick, ordered by
// prober: their failures are contradicted on at least SuspectMinTargets
// targets and SuspectFraction of those they report on, so they no longer
// count (see doc.go).
func (e *Engine) ProberSuspects() []ProberStat {
	var out []ProberStat
	for id, p := range e.probers {
		if p.suspect {
			out = append(out, e.proberStat(id, p))
		}
	}
	slices.SortFunc(out, func(a, b ProberStat) int { return cmp.Compare(a.Prober, b.Prober) })
	return out
}

func (e *Engine) proberStat(id ReporterID, p *prober) ProberStat {
	st := ProberStat{
		Prober: id, Name: e.names[id], Targets: len(p.targets),
		Reported: p.counts.reported, Failing: p.counts.failing, Contradicted: p.counts.contradicted,
		Outage: p.out, Suspect: p.suspect, Suspicions: p.suspicions,
	}
	if p.suspect {
		st.SuspectSince = time.Unix(0, p.suspectSince)
	}
	for si, c := range p.bySvc {
		st.Services = append(st.Services, ProberServiceCounts{Service: e.svcs[si].name,
			Reported: c.reported, Failing: c.failing, Contradicted: c.contradicted})
	}
	slices.SortFunc(st.Services, func(a, b ProberServiceCounts) int { return strings.Compare(a.Service, b.Service) })
	return st
}

// tickProbers updates outages and suspicions from the counts of the last
// evaluations, before this Tick evaluates: a changed suspicion has the
// prober's targets re-evaluated now.
func (e *Engine) tickProbers(now int64) {
	for _, p := range e.probers {
		if p.assignedAt == 0 {
			p.assignedAt = now
		}
		ref := max(p.lastObserved, p.assignedAt)
		out := now-ref > int64(e.opt.ProberSilence)
		if out && !p.out {
			p.since = ref
			p.outages++
		}
		p.out = out
		c := p.counts
		enough := func(n int) bool {
			return n >= e.opt.SuspectMinTargets && float64(n) >= e.opt.SuspectFraction*float64(c.reported)
		}
		switch {
		case !p.suspect && enough(c.contradicted):
			p.suspect, p.suspectSince = true, now
			p.suspicions++
			e.dirtyTargets(p)
		case p.suspect && !enough(c.failing):
			// Suspicion ends when the prober stops failing, not when the
			// evidence contradicting it falls silent: an ingest outage
			// must not hand the fleet back to a broken prober.
			p.suspect = false
			e.dirtyTargets(p)
		}
	}
}
