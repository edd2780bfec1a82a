package eligibility

import (
	"math"
	"time"
)

// Options tune the engine. The zero value of each field selects its
// documented default; NewEngine never fails.
type Options struct {
	// SilenceMultiple: a class is silent when it has had no sample (success
	// or failure) for SilenceMultiple × the contract interval. Default 3:
	// two consecutive lost or late samples (jitter, a GC pause, an ingest
	// batch) are tolerated, a third is not.
	SilenceMultiple float64
	// ConfirmationMultiple stretches the probe class's silence window while
	// passive evidence is primary, because probing then drops to a
	// confirmation cadence (ADR-04). Default 6 (probes every 30 s at the
	// default interval, silent after 90 s).
	ConfirmationMultiple float64
	// FlapWindow and FlapThreshold: more than FlapThreshold eligibility
	// changes within FlapWindow quarantine the instance (ADR-09). Defaults
	// 10 min and 4. FlapThreshold is at most 7.
	FlapWindow    time.Duration
	FlapThreshold int
	// QuarantineBase doubles per repeat up to QuarantineCap. Defaults 1 min
	// and 30 min.
	QuarantineBase, QuarantineCap time.Duration
	// QuarantineForgive: a quarantine starting this long after the previous
	// one ended starts again from QuarantineBase. Default 1 h.
	QuarantineForgive time.Duration
	// SlowStartSteps is how many steps the slow-start weight is published
	// in (ADR-12). Default 10; at least 2 (one step would be no ramp), at
	// most 1000.
	SlowStartSteps int
	// DependencyWeight multiplies the weight of an instance that names a
	// degraded dependency with weight authority (ADR-06). Default 0.5.
	DependencyWeight float64
	// MinReporterVolume: a passive reporter whose decayed request count is
	// below this contributes proportionally less, so one caller's single
	// failed request does not count as a 100% failure rate. Default 3.
	MinReporterVolume float64
	// ProberSilence: an assigned prober that has observed none of its
	// targets for this long is in outage (ADR-05). Default 15 s, the
	// silence window at the default interval.
	ProberSilence time.Duration
	// PrimaryHysteresis: passive stays primary until the instance's caller
	// traffic falls below PrimaryHysteresis × PassivePrimaryRPS, so traffic
	// hovering at the threshold does not flip the primary class. Default 0.8.
	PrimaryHysteresis float64
	// SuspectMinTargets and SuspectFraction: an assigned prober that
	// reports failure, contradicted, on at least SuspectMinTargets of its
	// targets and at least SuspectFraction of the targets it reports on is
	// suspect, and its failures stop counting (see doc.go). It stays
	// suspect while it reports failure on that many. Defaults 3 and 0.5.
	SuspectMinTargets int
	SuspectFraction   float64
}

func (o Options) withDefaults() Options {
	f := func(v *float64, d float64) {
		if !(*v > 0) || math.IsInf(*v, 0) {
			*v = d
		}
	}
	dur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	f(&o.SilenceMultiple, 3)
	f(&o.ConfirmationMultiple, 6)
	dur(&o.FlapWindow, 10*time.Minute)
	if o.FlapThreshold <= 0 {
		o.FlapThreshold = 4
	}
	o.FlapThreshold = min(o.FlapThreshold, maxFlapRing-1)
	dur(&o.QuarantineBase, time.Minute)
	dur(&o.QuarantineCap, 30*time.Minute)
	o.QuarantineCap = max(o.QuarantineCap, o.QuarantineBase)
	dur(&o.QuarantineForgive, time.Hour)
	if o.SlowStartSteps <= 0 {
		o.SlowStartSteps = 10
	}
	o.SlowStartSteps = min(max(o.SlowStartSteps, 2), 1000)
	if !(o.DependencyWeight > 0 && o.DependencyWeight < 1) {
		o.DependencyWeight = 0.5
	}
	f(&o.MinReporterVolume, 3)
	dur(&o.ProberSilence, 15*time.Second)
	if !(o.PrimaryHysteresis > 0 && o.PrimaryHysteresis <= 1) {
		o.PrimaryHysteresis = 0.8
	}
	if o.SuspectMinTargets <= 0 {
		o.SuspectMinTargets = 3
	}
	if !(o.SuspectFraction > 0 && o.SuspectFraction <= 1) {
		o.SuspectFraction = 0.5
	}
	return o
}

const (
	// maxReporters bounds the passive reporters remembered per instance;
	// a new reporter evicts the one heard from least recently.
	maxReporters = 8
	// maxProbers bounds the probers remembered per instance, likewise. A
	// target has a prober or two (one per zone at most): three slots leave
	// room for a reassignment.
	maxProbers = 3
	// maxFlapRing bounds the eligibility changes remembered per instance.
	maxFlapRing = 8
	// minReentry is the lowest effective re-entry threshold: a failure
	// rate of 0.1%, about ten half-lives after the last failure.
	minReentry = 0.001
	// flapBuckets divides the flap window for the per-service flap rate.
	flapBuckets = 10
)

// Sample is one piece of evidence about one instance.
type Sample struct {
	Instance InstanceID
	Class    Class
	Outcome  Outcome
	At       time.Time
	// Reporter is who observed: the prober, the workload, the caller.
	// Passive samples are weighted per reporter, not per request.
	Reporter ReporterID
	// Dependency, on a self-report, names a degraded dependency; "" says
	// none is degraded (and clears an earlier one).
	Dependency string
	// Successes and Failures aggregate passive outcomes; when either is
	// non-zero, Outcome is ignored.
	Successes, Failures uint32
}

// track is a decaying failure rate: f and n are the failures and samples
// seen, each decayed by 2^(−age/half-life), as of last. f/n is unchanged by
// decay alone, so the rate moves only when evidence arrives.
type track struct {
	f, n float64
	last int64 // unix ns; 0: never
}

func (t *track) add(at int64, fail, total, invH float64) {
	if t.last != 0 && at > t.last {
		d := math.Exp2(-float64(at-t.last) * invH)
		t.f *= d
		t.n *= d
	}
	if at > t.last {
		t.last = at
	}
	t.f += fail
	t.n += total
}

func (t *track) rate() float64 {
	if t.n <= 0 {
		return 0
	}
	return t.f / t.n
}

// volume is n decayed to now.
func (t *track) volume(now int64, invH float64) float64 {
	if t.last == 0 || now <= t.last {
		return t.n
	}
	return t.n * math.Exp2(-float64(now-t.last)*invH)
}

// forceFail sets the rate to 1 without losing the track's weight, so a
// hard failure needs as much evidence to undo as a sustained soft one.
func (t *track) forceFail() {
	if t.n > 0 {
		t.f = t.n
	}
}

type classState struct {
	// t is the class's track for self; for passive, the volume-weighted
	// track used for the traffic estimate only. Probe evidence is kept per
	// prober (instance.probe).
	t          track
	lastSample int64 // newest success or failure
	lastUnobs  int64 // newest unobservable
	samples    uint32
	unobs      uint32
}

type flapEntry struct {
	at       int64
	from, to State
	code     reasonCode
}

// probeSlot is one prober's evidence about one instance (the prober's id
// is in instance.probeID, beside the others, so Observe finds it in one
// cache line). The prober's counts (prober.counts) include the slot's
// flags as of its last evaluation; in says which prober object holds
// them, so a prober reassigned or forgotten in between is never counted
// twice or negative.
type probeSlot struct {
	t track
	// p is the assigned prober id names, as of its newest sample (nil: a
	// reporter not assigned as a prober).
	p   *prober
	in  *prober
	cnt slotFlags
}

// slotFlags say what a probe slot contributes to its prober's counts.
type slotFlags uint8

const (
	slotReported     slotFlags = 1 << iota // a sample inside the silence window
	slotFailing                            // its rate at or above removal
	slotContradicted                       // failing, and contradicted
)

// contradiction records why a single-class failure was not allowed to
// remove (see evalIn): the failing class, the classes contradicting it and,
// for probe, the probe slots failing and those of peers reporting success.
type contradiction struct {
	fail    Class
	hard    bool
	by      uint8 // contradicting classes, one bit per class
	failing uint8 // probe slots failing (probe failures)
	peers   uint8 // probe slots contradicting (peer probers healthy)
	nfail   int   // passive reporters failing (passive failures)
}

func (c contradiction) ok() bool { return c.by != 0 || c.peers != 0 }

// oob indexes instance.firstFail for out-of-band hard failures (HardFail).
const oob = numClasses

// instance is laid out hot-first: Observe touches the flags, the class
// states and the reporter ids, which share the first few cache lines.
type instance struct {
	// id first: the index confirms a hash match against it, and svc is
	// read next, so a lookup and the Observe that follows share one line.
	id    InstanceID
	svc   int32
	state State
	// admitted: has been in rotation at least once. A new instance of a
	// service with a readiness signal starts out, awaiting its first success.
	admitted  bool
	readySeen bool // a success that admits has arrived
	everKnown bool // some class has spoken since the instance was added
	// shownKnown and shownQuarantined are HealthKnown and Quarantined as
	// Routing showed them after the last evaluation: a change of either
	// without a transition is reported by Changed.
	shownKnown, shownQuarantined bool
	// hard: a hard failure is latched until a later success; hardClass
	// and hardRep say whose (unless hardExternal).
	hard, hardExternal bool
	hardClass          Class
	passivePrimary     bool
	primary            Class
	dirty, pendFail    bool
	rampDone           bool
	qLevel             uint8
	ringN              uint8
	reason             reasonCode
	hardAt             int64
	hardRep            ReporterID
	// firstFail is the first failed sample of the episode per class (and
	// oob for HardFail): a class's clean success ends its part only.
	firstFail [numClasses + 1]int64
	cls       [numClasses]classState
	probeID   [maxProbers]ReporterID
	probe     [maxProbers]probeSlot
	repID     [maxReporters]ReporterID
	rep       [maxReporters]track
	ctr       contradiction

	weight, reasonVal                     float64
	tIn, inelSince, qUntil, qEnd, nextDue int64
	// knownUntil: an instance RestoreAdmission restated from a recorded
	// eligible or degraded state is judged as that state, for removal,
	// until this time (one silence window after the restore): it is
	// Unknown only because this engine has not heard it yet.
	knownUntil int64
	dep        string
	hardReason string
	ring       [maxFlapRing]flapEntry
}

type flapBucket struct {
	slot int64
	n    uint32
}

type service struct {
	name     string
	c        Contract
	invH     float64 // 1 / half-life in ns
	interval int64
	window   int64   // silence window
	dwell    int64   // effective minimum dwell
	reentry  float64 // effective re-entry threshold
	flap     [flapBuckets]flapBucket
	quarant  uint64
	// contradictions counts single-class failures held in rotation
	// (Degraded) by contradicting evidence.
	contradictions uint64
	// changed: named in Engine.changed (cleared by Tick).
	changed bool
	// silenceFrom: silence is measured from no earlier than this
	// (HoldSilence); 0: from each class's last sample.
	silenceFrom int64
}

// heard is when a class last heard at last counts as heard for silence:
// never earlier than the service's silenceFrom.
func (s *service) heard(last int64) int64 { return max(last, s.silenceFrom) }

// HoldSilence makes silence of service's instances count from no earlier
// than at: a class heard at all before at is speaking until a silence
// window after at. The evaluator holds it, every tick, for each service
// another replica evaluates: this replica hears of those only through
// the windows their owner writes, a flush and a follow late, so the
// gaps between them are the region's own observation path lagging, not
// the instances falling silent (ADR-05: silence of the observation path
// says nothing of an instance). Once the service is evaluated here the
// hold stops advancing, and a class that stays silent a window past it
// is silent. Unknown services are ignored.
func (e *Engine) HoldSilence(service string, at time.Time) {
	if i, ok := e.svcIdx[service]; ok {
		s := e.svcs[i]
		s.silenceFrom = max(s.silenceFrom, at.UnixNano())
	}
}

// Engine holds evidence and verdicts for every instance. It is not safe for
// concurrent use: the evaluator serialises calls.
type Engine struct {
	opt     Options
	svcIdx  map[string]int32
	svcs    []*service
	idx     index
	inst    []instance
	probers map[ReporterID]*prober
	// names are what the evaluator calls reporters (NameReporter), for
	// reasons that mention a prober.
	names map[ReporterID]string
	// history is the reporter a rebuild's replayed windows are recorded
	// under (SetHistoryReporter), when hasHistory.
	history    ReporterID
	hasHistory bool
	buf        []Transition
	// changed names the services, once each, with an instance whose
	// Routing changed in the last Tick without a transition saying so.
	changed []string
}

// NewEngine returns an empty engine.
func NewEngine(opts Options) *Engine {
	return &Engine{
		opt:     opts.withDefaults(),
		svcIdx:  map[string]int32{},
		probers: map[ReporterID]*prober{},
		names:   map[ReporterID]string{},
	}
}

// SetService adds a service or changes its contract. Instances keep their
// evidence and state and are re-evaluated at the next Tick. The contract
// should have passed Validate; values that would break the arithmetic are
// replaced by platform defaults rather than refused.
func (e *Engine) SetService(name string, c Contract) {
	c = c.sanitized()
	s := &service{name: name}
	if i, ok := e.svcIdx[name]; ok {
		s = e.svcs[i]
		for k := range e.inst {
			if e.inst[k].svc == i {
				e.inst[k].dirty = true
			}
		}
	} else {
		e.svcIdx[name] = int32(len(e.svcs))
		e.svcs = append(e.svcs, s)
	}
	s.c = c
	s.invH = 1 / float64(c.HalfLife)
	s.interval = int64(c.Interval)
	s.window = int64(float64(c.Interval) * e.opt.SilenceMultiple)
	// Re-entry is never faster than removal: the dwell is at least the
	// soft detection time.
	s.dwell = max(int64(c.MinDwell), int64(c.SoftDetection()))
	// A decayed rate approaches 0 but never reaches it while any failure
	// is remembered, so "below 0" would never re-admit.
	s.reentry = max(c.ReentryThreshold, minReentry)
}

// AddInstance starts tracking an instance of service. An instance of a
// service with a readiness signal (readiness or probe capability) starts
// Ineligible and enters rotation on its first success; one without starts
// Eligible with health unknown (ADR-16). No transition is emitted for the
// initial state: read it with Verdict.
func (e *Engine) AddInstance(id InstanceID, service string, now time.Time) error {
	si, ok := e.svcIdx[service]
	if !ok {
		return ErrUnknownService
	}
	if _, dup := e.idx.get(id, e.inst); dup {
		return ErrDuplicateInstance
	}
	t := now.UnixNano()
	in := instance{id: id, svc: si, dirty: true}
	if e.svcs[si].c.Capabilities.readinessSignal() {
		in.state, in.inelSince, in.reason = Ineligible, t, rAwaiting
	} else {
		in.state, in.admitted, in.tIn, in.reason = Eligible, true, t, rNoReadiness
		in.weight = e.ramp(&in, e.svcs[si], &assessment{}, t)
	}
	e.inst = append(e.inst, in)
	e.idx.set(id, int32(len(e.inst)-1), e.inst)
	return nil
}

// RemoveInstance forgets an instance. Unknown ids are ignored.
func (e *Engine) RemoveInstance(id InstanceID) {
	i, ok := e.idx.get(id, e.inst)
	if !ok {
		return
	}
	for k := range e.inst[i].probe {
		e.inst[i].probe[k].uncount(e.inst[i].svc)
	}
	// The index confirms hashes against e.inst, so each step runs while
	// the slots it reads still hold the ids it expects.
	e.idx.delete(id, e.inst)
	last := int32(len(e.inst) - 1)
	if i != last {
		e.inst[i] = e.inst[last]
		e.idx.set(e.inst[i].id, i, e.inst) // found via inst[last], still a copy
	}
	e.inst[last] = instance{}
	e.inst = e.inst[:last]
}

// HardFail records an out-of-band hard failure (lease expired, process
// gone). The next Tick makes the instance Ineligible whatever its state,
// bypassing the decay and the corroboration rule, with the transition
// stamped at now. It stays out until a later success and the normal
// re-entry rules let it back. Unknown ids are ignored.
func (e *Engine) HardFail(id InstanceID, reason string, now time.Time) {
	i, ok := e.idx.get(id, e.inst)
	if !ok {
		return
	}
	in := &e.inst[i]
	t := now.UnixNano()
	in.hard, in.hardExternal, in.hardAt, in.hardReason = true, true, t, reason
	for c := range in.cls {
		in.cls[c].t.forceFail()
	}
	for r := range in.rep {
		in.rep[r].forceFail()
	}
	for k := range in.probe {
		in.probe[k].t.forceFail()
	}
	if in.firstFail[oob] == 0 {
		in.firstFail[oob] = t
	}
	in.dirty = true
}

// Quarantine is what a restarted engine needs of an instance's last
// quarantine (ADR-09) to carry it on: the engine's state is computed and
// lives only in memory (ADR-02), so the evaluator keeps these fields of
// each quarantine transition and hands the newest back after a restart.
type Quarantine struct {
	// Start is when the quarantine began (the transition's At).
	Start time.Time
	// Until is when it ends (the transition's QuarantinedUntil).
	Until time.Time
	// Step is the transition's QuarantineStep: 1 for a first quarantine.
	Step int
}

// RestoreQuarantine carries an instance's last quarantine over a restart.
// Until q.Until the instance is held Ineligible exactly as a live
// quarantine holds it (Verdict.QuarantinedUntil and its reason,
// Routing.Quarantined, ServiceStats.Quarantined; re-entry after it ends
// follows the normal rules, the dwell counted from q.Start), and its next
// quarantine escalates from q.Step: twice q's duration, up to the cap,
// unless it starts QuarantineForgive or more after q.Until. A quarantine
// that ended before now restores only the escalation. Nothing is emitted:
// the state is restated, not changed. A quarantine that ends no later than
// one the engine already holds for the instance is ignored.
//
// Call it after AddInstance and after replaying evidence, before the Tick
// that restates the rebuilt state.
func (e *Engine) RestoreQuarantine(id InstanceID, q Quarantine, now time.Time) error {
	if q.Step < 1 || q.Until.Before(q.Start) {
		return ErrInvalidQuarantine
	}
	i, ok := e.idx.get(id, e.inst)
	if !ok {
		return ErrUnknownInstance
	}
	in := &e.inst[i]
	until := q.Until.UnixNano()
	if until <= in.qEnd {
		return nil
	}
	in.qLevel = uint8(min(q.Step, math.MaxUint8))
	in.qUntil, in.qEnd = until, until
	t := now.UnixNano()
	if until <= t {
		return nil
	}
	if in.state != Ineligible || !in.admitted {
		in.inelSince = min(q.Start.UnixNano(), t)
	}
	// Only an admitted instance flaps, so the one quarantined before the
	// restart had been in rotation: it re-enters by the re-entry rules,
	// not as a new instance on its first success.
	in.state, in.weight, in.admitted = Ineligible, 0, true
	in.reason, in.reasonVal = rQuarantine, 0
	in.ringN = 0
	in.dirty = true
	return nil
}

// RestoreAdmission carries over a restart the fact that an instance had
// been in rotation: a new instance of a service with a readiness signal
// starts out awaiting its first success, which is right for a new
// registration and wrong for one that served before the restart (the
// guard does not count capacity that never was, so forgetting admissions
// would take it out of every count). last is the state of its newest
// recorded transition and at when it happened. In rotation (eligible,
// degraded, unknown) it is restated as in rotation at full weight, its
// health unknown until evidence speaks (silence is not failure, ADR-05);
// Ineligible restates it as out of rotation since at, to re-enter by the
// re-entry rules (dwell counted from at). An instance already admitted
// (one without a readiness signal, or restored twice) is left alone.
// Nothing is emitted.
//
// Restated from eligible or degraded, it is Unknown only because this
// engine has not heard it yet, not because it fell silent: for one
// silence window after now, fresh failure evidence removes it as it
// would the state on record, so a single class's hard failure withdraws
// it (a replica dealt a service whose owner died, with the owner's
// verdicts only on record, must withdraw what the owner would have).
// Restated from unknown, or unheard for that window, it needs a second
// class, as any Unknown instance does (ADR-05).
//
// Call it after AddInstance and before replaying evidence, so replayed
// samples are judged against the restated state.
func (e *Engine) RestoreAdmission(id InstanceID, last State, at, now time.Time) error {
	i, ok := e.idx.get(id, e.inst)
	if !ok {
		return ErrUnknownInstance
	}
	in := &e.inst[i]
	if in.admitted {
		return nil
	}
	t := now.UnixNano()
	in.admitted, in.dirty = true, true
	if last > Ineligible || last.InRotation() {
		in.state, in.weight, in.tIn, in.rampDone = Unknown, 1, min(at.UnixNano(), t), true
		in.everKnown = true // silent, not "no readiness signal"
		in.reason, in.reasonVal = rSilent, 0
		in.inelSince = 0
		if last == Eligible || last == Degraded {
			in.knownUntil = t + e.svcs[in.svc].window
		}
		return nil
	}
	in.state, in.weight, in.inelSince = Ineligible, 0, min(at.UnixNano(), t)
	in.reason, in.reasonVal = rRestored, 0
	return nil
}

// Options returns the options in effect, defaults filled in.
func (e *Engine) Options() Options { return e.opt }

// Observe records one sample. It is the hot path: O(1) and free of
// allocations for a known instance. The verdict changes at the next Tick.
func (e *Engine) Observe(s Sample) error {
	i, ok := e.idx.get(s.Instance, e.inst)
	if !ok {
		return ErrUnknownInstance
	}
	if s.Class >= numClasses || s.At.IsZero() {
		return ErrInvalidSample
	}
	at := s.At.UnixNano()
	in := &e.inst[i]
	cs := &in.cls[s.Class]
	var p *prober
	if s.Class == Probe {
		if p = e.probers[s.Reporter]; p != nil {
			p.lastSeen = max(p.lastSeen, at)
		}
	}
	var fail, total float64
	switch {
	case s.Successes != 0 || s.Failures != 0:
		fail, total = float64(s.Failures), float64(s.Successes)+float64(s.Failures)
	case s.Outcome == Success:
		total = 1
	case s.Outcome == Failure || s.Outcome == HardFailure:
		fail, total = 1, 1
	case s.Outcome == Unobservable:
		cs.lastUnobs = max(cs.lastUnobs, at)
		cs.unobs++
		return nil
	default:
		return ErrInvalidSample
	}
	svc := e.svcs[in.svc]
	var t *track
	switch s.Class {
	case Probe:
		if p != nil {
			p.lastObserved = max(p.lastObserved, at)
		}
		// A live prober's sample supersedes the history a rebuild
		// replayed for this instance: the history is no peer prober, and
		// must not contradict (or dilute) what probers say now.
		if e.hasHistory && s.Reporter != e.history {
			if h := in.probeSlotOf(e.history); h != nil {
				h.uncount(in.svc)
				*h = probeSlot{}
			}
		}
		sl := in.slotFor(s.Reporter)
		sl.p = p
		t = &sl.t
	case Self:
		t = &cs.t
	default:
		cs.t.add(at, fail, total, svc.invH) // caller traffic
		t = in.reporter(s.Reporter)
	}
	if in.hard && !in.hardExternal && s.Class == in.hardClass && s.Reporter == in.hardRep && at < in.hardAt {
		// Superseded: the hard failure this reporter reported after it
		// is its latest word. A batch can deliver a hard failure ahead
		// of the reporter's older samples (hard failures are forwarded
		// first; a replica taking a service is replayed what its
		// owner was sent), and older successes must not dilute it.
		return nil
	}
	t.add(at, fail, total, svc.invH)
	cs.lastSample = max(cs.lastSample, at)
	cs.samples++
	in.dirty = true
	if s.Class == Self {
		in.dep = s.Dependency
	}
	// A suspect prober's failures do not count (see doc.go): recorded on
	// its own slot, they are neither fresh failure evidence nor a latch.
	suspect := p != nil && p.suspect
	if s.Outcome == HardFailure && s.Successes == 0 && s.Failures == 0 {
		t.forceFail()
		switch {
		case s.Class == Passive:
			// One caller's refused connection is that caller's full
			// vote, never the fast path: passive weighs callers by
			// population, and any identity may report passive evidence.
			if v := e.opt.MinReporterVolume; t.n < v {
				t.f, t.n = v, v
			}
		case !suspect:
			in.hard, in.hardAt, in.hardClass, in.hardRep = true, at, s.Class, s.Reporter
		}
	}
	if fail > 0 && !suspect {
		in.pendFail = true
		if in.firstFail[s.Class] == 0 {
			in.firstFail[s.Class] = at
		}
	}
	if fail < total {
		if in.hard && at > in.hardAt {
			in.hard, in.hardExternal = false, false
		}
		if !svc.c.RequireReadiness || s.Class == Self {
			in.readySeen = true
		}
		if t.rate() < svc.reentry {
			// Clean again: the class's next failure starts a new
			// episode for the damping-cost measurement.
			in.firstFail[s.Class] = 0
		}
	}
	return nil
}

// episodeStart is the first failed sample of the current episode, over
// every class; 0 if none.
func (in *instance) episodeStart() int64 {
	first := int64(0)
	for _, f := range in.firstFail {
		if f != 0 && (first == 0 || f < first) {
			first = f
		}
	}
	return first
}

// reporter finds id's track, or evicts the least recently heard reporter.
func (in *instance) reporter(id ReporterID) *track {
	for k, r := range in.repID {
		if r == id && in.rep[k].last != 0 {
			return &in.rep[k]
		}
	}
	victim, oldest := 0, int64(math.MaxInt64)
	for k := range in.rep {
		if l := in.rep[k].last; l < oldest {
			victim, oldest = k, l
		}
	}
	in.repID[victim] = id
	in.rep[victim] = track{}
	return &in.rep[victim]
}

// SetHistoryReporter names the reporter under which a rebuild replays
// observed windows. Its probe evidence stands for the instance's history,
// not for a prober: the first live probe sample for an instance drops it,
// so it never contradicts nor dilutes a prober that speaks now.
func (e *Engine) SetHistoryReporter(id ReporterID) { e.history, e.hasHistory = id, true }

// slotFor finds id's probe slot, or evicts the least recently heard prober,
// taking its flags out of its prober's counts.
func (in *instance) slotFor(id ReporterID) *probeSlot {
	for k, r := range in.probeID {
		if r == id && in.probe[k].t.last != 0 {
			return &in.probe[k]
		}
	}
	victim, oldest := 0, int64(math.MaxInt64)
	for k := range in.probe {
		if l := in.probe[k].t.last; l < oldest {
			victim, oldest = k, l
		}
	}
	sl := &in.probe[victim]
	sl.uncount(in.svc)
	*sl = probeSlot{}
	in.probeID[victim] = id
	return sl
}

// probeSlotOf returns id's probe slot, or nil.
func (in *instance) probeSlotOf(id ReporterID) *probeSlot {
	for k, r := range in.probeID {
		if r == id && in.probe[k].t.last != 0 {
			return &in.probe[k]
		}
	}
	return nil
}
