package assembler

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/eligibility"
)

// Assembler turns verdicts into versioned views and deltas. It is not safe
// for concurrent use: the caller serialises every call.
type Assembler struct {
	opts  Options
	load  loadMeter
	svcs  map[string]*service
	dirty map[string]*service // services with queued changes
	// alarms are keyed by kind, service and zone.
	alarms map[alarmKey]Alarm
	// ramping holds the services with an endpoint in a slow start the
	// assembler runs (see ServiceInput.SlowStart).
	ramping   map[string]*service
	lastVer   uint64
	published uint64
	scratch   []byte
}

type alarmKey struct{ kind, service, zone string }

// service is one service's state: what was last published, what the guard
// wants published now, and the queued difference.
type service struct {
	name string
	frac float64
	// slowStart is the contract's ramp for endpoints the assembler puts
	// into rotation; rampDue is the next step of any of them (zero: none
	// ramping).
	slowStart time.Duration
	rampDue   time.Time
	caps      []string // shared by the endpoints; replaced, never modified
	// rawCaps is the input the caps were made from.
	rawCaps []string
	counts  map[string]zoneCount
	gen     uint64
	cur     map[uuid.UUID]*cand // every instance of the last Update
	zones   map[string]ZoneStatus
	spare   map[string]ZoneStatus // recycled for the next Update's zones

	view     *View // last published; nil before the first version
	pub      map[uuid.UUID]Endpoint
	pubJSON  map[uuid.UUID][]byte  // each published endpoint's encoding
	pubZones map[string]ZoneStatus // shared with view; replaced, never modified

	pend       map[uuid.UUID]pending
	zonesSince time.Time // zone statuses differ from pubZones since then
	// drainSince: a published zone's traffic weight is lower in zones than
	// in pubZones since then; it travels on the withdrawal window.
	drainSince time.Time
	nW, nA     int
	wSince     time.Time // oldest queued withdrawal
	aSince     time.Time // oldest queued addition
	// wLast is when a version carrying the service's withdrawals was last
	// published (zero: never in this process); the withdrawal queue is
	// idle from wLast + WithdrawalWindow on (see wDue).
	wLast time.Time

	routable    int
	hadRoutable bool
	removed     bool
	// restated: the published view was restored from an earlier process
	// and this process has not published the service yet; its first
	// version goes out even if nothing changed.
	restated bool
}

// cand is one instance as the last Update gave it and the guard decided.
type cand struct {
	idx       int
	gen       uint64
	inTgt     bool     // the guard publishes it
	tgt       Endpoint // as published (weight adjusted under a tripped guard)
	firstFail time.Time
	// rampFrom: the assembler put the endpoint into rotation at this time
	// (a tripped guard or a mark_eligible override) and its slow start is
	// not over; zero otherwise.
	rampFrom time.Time
	// served: the input says the instance awaits its first success, but
	// clients route to it in the published view (see serving).
	served bool
}

// serving reports whether clients route to instance id in the published
// view (a weight above zero). Such an instance has been in rotation, so
// it is capacity whatever the input says: the evaluator's word that an
// instance "awaits its first success" is state it can lose (a replica
// dealt a service it never evaluated, a restart whose record of
// admissions could not be read), and taking that word would drop what
// clients route to without the guard counting it, which is exactly the
// withdrawal of a whole service the guard exists to stop.
func (sv *service) serving(id uuid.UUID) bool {
	p, ok := sv.pub[id]
	return ok && p.Weight > 0
}

// pending is one queued endpoint change.
type pending struct {
	since      time.Time
	withdrawal bool
	zone       string
	firstFail  time.Time
}

// New returns an Assembler. Zero or negative options take the defaults; a
// MaxAdditionWindow below AdditionWindow is raised to it.
func New(opts Options) *Assembler {
	if opts.WithdrawalWindow <= 0 {
		opts.WithdrawalWindow = DefaultWithdrawalWindow
	}
	if opts.AdditionWindow <= 0 {
		opts.AdditionWindow = DefaultAdditionWindow
	}
	if opts.MaxAdditionWindow <= 0 {
		opts.MaxAdditionWindow = DefaultMaxAdditionWindow
	}
	opts.MaxAdditionWindow = max(opts.MaxAdditionWindow, opts.AdditionWindow)
	if opts.ChangeBudgetPerSecond <= 0 {
		opts.ChangeBudgetPerSecond = DefaultChangeBudgetPerSecond
	}
	return &Assembler{
		opts: opts,
		load: loadMeter{
			base: opts.AdditionWindow, max: opts.MaxAdditionWindow, win: opts.AdditionWindow,
			budget: float64(opts.ChangeBudgetPerSecond),
		},
		svcs:    map[string]*service{},
		dirty:   map[string]*service{},
		alarms:  map[alarmKey]Alarm{},
		ramping: map[string]*service{},
	}
}

func newService(name string) *service {
	return &service{
		name: name, cur: map[uuid.UUID]*cand{}, zones: map[string]ZoneStatus{},
		spare: map[string]ZoneStatus{}, counts: map[string]zoneCount{}, pub: map[uuid.UUID]Endpoint{},
		pubJSON:  map[uuid.UUID][]byte{},
		pubZones: map[string]ZoneStatus{}, pend: map[uuid.UUID]pending{},
	}
}

func normWeight(w float64) float64 {
	if !(w > 0) || math.IsInf(w, 0) {
		return 0
	}
	return w
}

// trafficWeight reads a zone's traffic weight, clamped to [0,1]; NaN or no
// function reads as 1.
func trafficWeight(tw TrafficWeights, zone string) float64 {
	if tw == nil {
		return 1
	}
	switch w := tw(zone); {
	case w != w || w > 1:
		return 1
	case w < 0:
		return 0
	default:
		return w
	}
}

// normState maps a value outside the known states to Unknown: an
// unreadable verdict is no evidence of failure (ADR-05).
func normState(s eligibility.State) eligibility.State {
	if s > eligibility.Ineligible {
		return eligibility.Unknown
	}
	return s
}

// zoneCount is a zone's count: the guard's (Capacity) and what the view
// reports beside it.
type zoneCount struct {
	Capacity
	registered, awaiting int
}

// Update recomputes the service's endpoint set from s through the guard and
// queues the difference against what was last published. s lists every
// instance of the service; one left out is gone. If an id appears twice the
// last entry wins.
func (a *Assembler) Update(s ServiceInput, now time.Time) {
	sv := a.svcs[s.Name]
	if sv == nil {
		sv = newService(s.Name)
		a.svcs[s.Name] = sv
	}
	sv.removed = false
	sv.frac = normFraction(s.MinHealthyFraction)
	sv.slowStart = max(s.SlowStart, 0)
	if sv.caps == nil || !slices.Equal(sv.rawCaps, s.Capabilities) {
		sv.rawCaps = slices.Clone(s.Capabilities)
		caps := append([]string{}, s.Capabilities...)
		slices.Sort(caps)
		sv.caps = slices.Compact(caps)
	}
	sv.gen++

	// Index the input; the last entry of an id wins.
	for i := range s.Instances {
		id := s.Instances[i].ID
		c := sv.cur[id]
		if c == nil {
			c = &cand{}
			sv.cur[id] = c
		}
		c.idx, c.gen = i, sv.gen
	}

	// The guard: per zone, routable of total against the fraction.
	counts := sv.counts
	clear(counts)
	routableAll := 0
	for i := range s.Instances {
		x := &s.Instances[i]
		c := sv.cur[x.ID]
		if c.idx != i {
			continue
		}
		c.served = x.Awaiting && sv.serving(x.ID)
		zc := counts[x.Zone]
		if !x.LeaseExpired {
			zc.registered++
		}
		if !counted(x) && !c.served {
			zc.awaiting++
		}
		if routable(x) {
			routableAll++
		}
		zc.add(x, c.served)
		counts[x.Zone] = zc
	}
	old := sv.zones
	zones := sv.spare
	clear(zones)
	for z, zc := range counts {
		st := ZoneStatus{Guard: GuardOK, Eligible: zc.Routable, Total: zc.Counted, Registered: zc.registered,
			MinHealthyFraction: sv.frac, TrafficWeight: trafficWeight(s.Traffic, z)}
		if zc.Tripped(sv.frac) {
			st.Guard = GuardTripped
		}
		zones[z] = st
	}
	sv.zones, sv.spare = zones, old

	// The candidate endpoints, and the changes against the published set.
	changes := 0
	for i := range s.Instances {
		x := &s.Instances[i]
		c := sv.cur[x.ID]
		if c.idx != i {
			continue
		}
		st := normState(x.State)
		ep := Endpoint{
			InstanceID: x.ID, Address: x.Address, Port: x.Port, Zone: x.Zone,
			State: st.String(), Weight: normWeight(x.Weight), Health: HealthUnknown,
			Capabilities: sv.caps, Quarantined: x.Quarantined,
		}
		if x.HealthKnown {
			ep.Health = HealthKnown
		}
		in := true
		// ours: the assembler, not the instance's verdict, puts the
		// endpoint into rotation, so it runs the slow start.
		ours := false
		// A tripped guard publishes the zone's capacity: never an
		// instance that has not yet been in rotation.
		guardKeeps := zones[x.Zone].Guard == GuardTripped && (!x.Awaiting || c.served)
		switch {
		case x.LeaseExpired:
			// Gone from the registry: kept only as far as the guard needs.
			ep.State, ep.Weight, ep.Quarantined, ep.LeaseExpired = eligibility.Ineligible.String(), TrippedWeight, false, true
			in, ours = guardKeeps, true
		case x.Override != nil && x.Override.Action == OverrideIneligible:
			// Forced out: published with its reason at weight 0, which no
			// client routes to, and never restored by a tripped guard.
			ep.State, ep.Weight, ep.Override = eligibility.Ineligible.String(), 0, x.Override
		case x.Override != nil && x.Override.Action == OverrideEligible:
			// Forced in: a check known to be wrong.
			ep.State, ep.Quarantined, ep.Override = eligibility.Eligible.String(), false, x.Override
			if !st.InRotation() || x.Quarantined || ep.Weight == 0 {
				ep.Weight, ours = TrippedWeight, true
			}
		case x.Quarantined || !st.InRotation():
			ep.State = eligibility.Ineligible.String()
			in, ours = guardKeeps, true
			ep.Weight = TrippedWeight
		}
		sv.ramp(c, &ep, in && ours, now)
		if c.inTgt != in || (in && !sameEndpoint(&c.tgt, &ep)) {
			changes++
		}
		c.inTgt, c.tgt, c.firstFail = in, ep, x.FirstFailureAt
		sv.requeue(x.ID, now)
	}
	for id, c := range sv.cur {
		if c.gen == sv.gen {
			continue
		}
		if c.inTgt {
			changes++
		}
		ff := c.firstFail
		delete(sv.cur, id)
		sv.requeueGone(id, ff, now)
	}
	sv.requeueZones(now)
	sv.recount()
	a.noteRamps(sv, now)
	if sv.view == nil {
		// A service's initial population is not load: nobody
		// subscribes to it yet, and a rebuild must not shed.
		changes = 0
	}
	a.load.add(now, changes)
	a.markDirty(sv)
	a.raiseAlarms(sv, old, routableAll, now)
}

func sameEndpoint(a, b *Endpoint) bool {
	return a.InstanceID == b.InstanceID && a.Address == b.Address && a.Port == b.Port &&
		a.Zone == b.Zone && a.State == b.State && a.Weight == b.Weight && a.Health == b.Health &&
		a.Quarantined == b.Quarantined && a.LeaseExpired == b.LeaseExpired && slices.Equal(a.Capabilities, b.Capabilities) &&
		(a.Override == b.Override || (a.Override != nil && b.Override != nil && *a.Override == *b.Override))
}

// requeue reconciles the queued change of an instance still in the input
// with the published set.
func (sv *service) requeue(id uuid.UUID, now time.Time) {
	c := sv.cur[id]
	p, inPub := sv.pub[id]
	var changed, withdrawal bool
	switch {
	case inPub && !c.inTgt:
		changed, withdrawal = true, true
	case !inPub && c.inTgt:
		changed = true
	case inPub && c.inTgt && !sameEndpoint(&p, &c.tgt):
		changed, withdrawal = true, p.Weight > 0 && c.tgt.Weight == 0
	}
	sv.setPending(id, changed, withdrawal, c.tgt.Zone, c.firstFail, now)
}

// requeueGone reconciles the queued change of an instance no longer in the
// input (or of a removed service).
func (sv *service) requeueGone(id uuid.UUID, firstFail time.Time, now time.Time) {
	p, inPub := sv.pub[id]
	sv.setPending(id, inPub, true, p.Zone, firstFail, now)
}

func (sv *service) setPending(id uuid.UUID, changed, withdrawal bool, zone string, firstFail, now time.Time) {
	old, had := sv.pend[id]
	switch {
	case !changed:
		if had {
			delete(sv.pend, id)
		}
	case had && old.withdrawal == withdrawal:
		// Same queue: the change keeps its place (its batching
		// window started when it was first queued).
		old.zone, old.firstFail = zone, firstFail
		sv.pend[id] = old
	default:
		sv.pend[id] = pending{since: now, withdrawal: withdrawal, zone: zone, firstFail: firstFail}
	}
}

func (sv *service) requeueZones(now time.Time) {
	// A service never published is due on the addition window even with
	// no endpoints: a watcher must be able to tell "no instances" from
	// "no view yet". So is a restored one: this process has not published
	// it yet, and the streaming tier serves only what it publishes.
	if sv.view != nil && !sv.restated && zonesEqual(sv.zones, sv.pubZones) {
		sv.zonesSince = time.Time{}
	} else if sv.zonesSince.IsZero() {
		sv.zonesSince = now
	}
	drain := false
	for z, st := range sv.zones {
		if old, ok := sv.pubZones[z]; ok && st.TrafficWeight < old.TrafficWeight {
			drain = true
			break
		}
	}
	switch {
	case !drain:
		sv.drainSince = time.Time{}
	case sv.drainSince.IsZero():
		sv.drainSince = now
	}
}

func zonesEqual(a, b map[string]ZoneStatus) bool {
	if len(a) != len(b) {
		return false
	}
	for z, s := range a {
		if t, ok := b[z]; !ok || t != s {
			return false
		}
	}
	return true
}

// recount refreshes the queue counters and oldest times.
func (sv *service) recount() {
	sv.nW, sv.nA = 0, 0
	sv.wSince, sv.aSince = time.Time{}, time.Time{}
	for _, p := range sv.pend {
		if p.withdrawal {
			sv.nW++
			if sv.wSince.IsZero() || p.since.Before(sv.wSince) {
				sv.wSince = p.since
			}
		} else {
			sv.nA++
			if sv.aSince.IsZero() || p.since.Before(sv.aSince) {
				sv.aSince = p.since
			}
		}
	}
	if !sv.zonesSince.IsZero() && (sv.aSince.IsZero() || sv.zonesSince.Before(sv.aSince)) {
		// A zone-status change with no endpoint change travels on the
		// addition window.
		sv.aSince = sv.zonesSince
	}
}

// withdrawing reports whether the service has something queued on the
// withdrawal window: an endpoint withdrawal or a zone's traffic draining.
func (sv *service) withdrawing() bool { return sv.nW > 0 || !sv.drainSince.IsZero() }

func (sv *service) queued() bool { return sv.withdrawing() || !sv.aSince.IsZero() }

func (a *Assembler) markDirty(sv *service) {
	if sv.queued() {
		a.dirty[sv.name] = sv
	} else {
		delete(a.dirty, sv.name)
		if sv.removed {
			delete(a.svcs, sv.name)
		}
	}
}

// RemoveService withdraws every published endpoint of the service (on the
// withdrawal window), drops what was queued for it and clears its alarms.
// Once the emptied view is published the service is forgotten; a service
// never published is forgotten at once.
func (a *Assembler) RemoveService(name string, now time.Time) {
	sv := a.svcs[name]
	if sv == nil {
		return
	}
	a.clearAlarms(name)
	delete(a.ramping, name)
	changes := 0
	for id := range sv.pend {
		if _, ok := sv.pub[id]; !ok {
			delete(sv.pend, id)
		}
	}
	for id := range sv.pub {
		ff := sv.pend[id].firstFail
		if c := sv.cur[id]; c != nil {
			ff = c.firstFail
		}
		sv.requeueGone(id, ff, now)
	}
	for _, c := range sv.cur {
		if c.inTgt {
			changes++
		}
	}
	clear(sv.cur)
	clear(sv.zones)
	sv.removed, sv.hadRoutable, sv.routable = true, false, 0
	sv.requeueZones(now)
	sv.recount()
	if sv.view == nil {
		a.load.advance(now)
		delete(a.dirty, name)
		delete(a.svcs, name)
		return
	}
	a.load.add(now, changes)
	a.markDirty(sv)
}

// NextDue returns when Drain next has something to publish, given the
// current addition window (zero if nothing is queued). It may be in the
// past.
func (a *Assembler) NextDue() time.Time {
	var due time.Time
	for _, sv := range a.dirty {
		for _, t := range [2]time.Time{sv.wDue(a.opts.WithdrawalWindow), sv.aDue(a.load.win)} {
			if !t.IsZero() && (due.IsZero() || t.Before(due)) {
				due = t
			}
		}
	}
	for _, sv := range a.ramping {
		if due.IsZero() || sv.rampDue.Before(due) {
			due = sv.rampDue
		}
	}
	return due
}

// wDue is when the service's queued withdrawals are due (zero: none
// queued). The window is a rate bound, not a delay: a withdrawal that
// finds the queue idle (no withdrawal version published in the window
// before it was queued) is due at once, the leading edge; one queued
// within the window after a withdrawal version waits for the window's end
// and goes out with every other withdrawal queued by then. So a service
// gets at most one withdrawal version per window and none waits longer
// than the window after it was queued (the min below; it only matters if
// the caller's clock went backwards).
func (sv *service) wDue(w time.Duration) time.Time {
	if !sv.withdrawing() {
		return time.Time{}
	}
	since := sv.wSince
	if since.IsZero() || (!sv.drainSince.IsZero() && sv.drainSince.Before(since)) {
		since = sv.drainSince
	}
	due := since
	if !sv.wLast.IsZero() {
		if idle := sv.wLast.Add(w); idle.After(due) {
			due = idle
		}
	}
	if latest := since.Add(w); due.After(latest) {
		due = latest
	}
	return due
}

func (sv *service) aDue(w time.Duration) time.Time {
	if sv.aSince.IsZero() {
		return time.Time{}
	}
	return sv.aSince.Add(w)
}

// Holds reports whether the assembler holds a service (assembled or
// restored, and not forgotten).
func (a *Assembler) Holds(name string) bool {
	_, ok := a.svcs[name]
	return ok
}

// Services lists the services held, in no order.
func (a *Assembler) Services() []string {
	out := make([]string, 0, len(a.svcs))
	for name := range a.svcs {
		out = append(out, name)
	}
	return out
}

// Forget drops a service without publishing anything: this replica no
// longer owns its publication, and the next owner publishes
// from the view it restores. Its queued changes, alarms and slow starts go
// with it; a later Restore or Update starts it afresh. Unknown services
// are ignored.
func (a *Assembler) Forget(name string) {
	if _, ok := a.svcs[name]; !ok {
		return
	}
	delete(a.svcs, name)
	delete(a.dirty, name)
	delete(a.ramping, name)
	a.clearAlarms(name)
}

// View returns the service's last published view (or the one restored, see
// Restore), shared and immutable.
func (a *Assembler) View(service string) (*View, bool) {
	sv := a.svcs[service]
	if sv == nil || sv.view == nil {
		return nil, false
	}
	return sv.view, true
}

// Alarms returns the open alarms ordered by kind, service and zone.
func (a *Assembler) Alarms() []Alarm {
	out := make([]Alarm, 0, len(a.alarms))
	for _, al := range a.alarms {
		out = append(out, al)
	}
	slices.SortFunc(out, func(x, y Alarm) int {
		return cmp.Or(cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Service, y.Service), cmp.Compare(x.Zone, y.Zone))
	})
	return out
}

// Shedding reports whether the addition window is grown (a shed episode is
// under way).
func (a *Assembler) Shedding() bool { return a.load.shedding }

// Stats returns the queues' state.
func (a *Assembler) Stats() Stats {
	st := Stats{
		Services: len(a.svcs), ShedEpisodes: a.load.episodes, Shedding: a.load.shedding,
		AdditionWindow: a.load.win, Published: a.published,
	}
	for _, sv := range a.dirty {
		st.QueuedWithdrawals += sv.nW
		st.QueuedAdditions += sv.nA
	}
	return st
}

func (a *Assembler) raiseAlarms(sv *service, old map[string]ZoneStatus, routable int, now time.Time) {
	for z := range old {
		if _, ok := sv.zones[z]; !ok {
			delete(a.alarms, alarmKey{AlarmFractionGuard, sv.name, z})
		}
	}
	for z, st := range sv.zones {
		k := alarmKey{AlarmFractionGuard, sv.name, z}
		if st.Guard != GuardTripped {
			delete(a.alarms, k)
			continue
		}
		al, open := a.alarms[k]
		if !open {
			al = Alarm{Kind: AlarmFractionGuard, Service: sv.name, Zone: z, Since: now}
		}
		if !open || old[z] != st {
			al.Detail = fmt.Sprintf("%d of %d instances in rotation (%.0f%%), below the minimum healthy fraction %g: publishing all %d",
				st.Eligible, st.Total, 100*float64(st.Eligible)/float64(st.Total), st.MinHealthyFraction, st.Total)
			if n := sv.counts[z].awaiting; n > 0 {
				al.Detail += fmt.Sprintf(" (%d more awaiting their first success are not capacity and stay out)", n)
			}
		}
		a.alarms[k] = al
	}

	k := alarmKey{AlarmLastInstance, sv.name, ""}
	total := 0
	for _, st := range sv.zones {
		total += st.Total
	}
	switch {
	case routable > 0:
		sv.hadRoutable = true
		delete(a.alarms, k)
	case sv.hadRoutable:
		al, open := a.alarms[k]
		if !open {
			al = Alarm{Kind: AlarmLastInstance, Service: sv.name, Since: now}
		}
		if total == 0 {
			al.Detail = "no instance in rotation in the region: the last instances were removed from the registry"
		} else {
			al.Detail = fmt.Sprintf("no instance in rotation in the region: 0 of %d instances, all ineligible or quarantined; the guard keeps all %d published", total, total)
		}
		a.alarms[k] = al
	}
	sv.routable = routable
}

func (a *Assembler) clearAlarms(service string) {
	for k := range a.alarms {
		if k.service == service {
			delete(a.alarms, k)
		}
	}
}

// ramp applies the slow start (ADR-12) to an endpoint the assembler puts
// into rotation itself (active: a tripped guard publishes it, or a
// mark_eligible override forces it in while its own verdict has it out).
// The ramp starts when such an endpoint enters rotation, i.e. was not
// already served at a positive weight by the previous Update, and scales
// ep.Weight by the ramp's current step. An endpoint already served keeps
// its weight: the guard tripping around a serving instance does not take
// capacity away. c still holds the previous Update's decision.
func (sv *service) ramp(c *cand, ep *Endpoint, active bool, now time.Time) {
	if !active || sv.slowStart <= 0 || !(ep.Weight > 0) {
		c.rampFrom = time.Time{}
		return
	}
	if c.rampFrom.IsZero() {
		if c.inTgt && c.tgt.Weight > 0 {
			return
		}
		c.rampFrom = now
	}
	w, done := rampWeight(now.Sub(c.rampFrom), sv.slowStart)
	if done {
		c.rampFrom = time.Time{}
		return
	}
	ep.Weight *= w
}

// rampWeight is the slow-start fraction after t of a ramp lasting ss:
// max(1, ⌊steps·t/ss⌋)/steps, and done once t ≥ ss.
func rampWeight(t, ss time.Duration) (float64, bool) {
	if t >= ss {
		return 1, true
	}
	k := max(rampStep(t, ss), 1)
	return float64(k) / SlowStartSteps, false
}

func rampStep(t, ss time.Duration) int64 {
	if t <= 0 {
		return 0
	}
	return int64(t) / (int64(ss) / SlowStartSteps)
}

// rampNext returns when the ramp that started at from next changes the
// weight.
func rampNext(from time.Time, ss time.Duration) func(now time.Time) time.Time {
	return func(now time.Time) time.Time {
		k := max(rampStep(now.Sub(from), ss), 1) + 1
		if k >= SlowStartSteps {
			return from.Add(ss)
		}
		return from.Add(time.Duration(k * (int64(ss) / SlowStartSteps)))
	}
}

// noteRamps records when the service's next ramp step is due and whether
// it has any ramp running.
func (a *Assembler) noteRamps(sv *service, now time.Time) {
	sv.rampDue = time.Time{}
	for _, c := range sv.cur {
		if c.rampFrom.IsZero() || !c.inTgt {
			continue
		}
		if t := rampNext(c.rampFrom, sv.slowStart)(now); sv.rampDue.IsZero() || t.Before(sv.rampDue) {
			sv.rampDue = t
		}
	}
	if sv.rampDue.IsZero() {
		delete(a.ramping, sv.name)
	} else {
		a.ramping[sv.name] = sv
	}
}

// advanceRamps moves every ramp whose step is due at now and queues the
// new weights (on the addition window: a weight going up).
func (a *Assembler) advanceRamps(now time.Time) {
	for _, sv := range a.ramping {
		if now.Before(sv.rampDue) {
			continue
		}
		changes := 0
		for id, c := range sv.cur {
			if c.rampFrom.IsZero() || !c.inTgt {
				continue
			}
			w, done := rampWeight(now.Sub(c.rampFrom), sv.slowStart)
			if done {
				c.rampFrom = time.Time{}
			}
			if nw := TrippedWeight * w; nw != c.tgt.Weight {
				c.tgt.Weight = nw
				sv.requeue(id, now)
				changes++
			}
		}
		sv.recount()
		a.noteRamps(sv, now)
		a.load.add(now, changes)
		a.markDirty(sv)
	}
}
