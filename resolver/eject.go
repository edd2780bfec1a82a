package resolver

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"
)

// Defaults of EjectionPolicy.
const (
	DefaultConsecutiveFailures = 5
	DefaultEjectionTime        = 30 * time.Second
	DefaultMaxEjectionTime     = 5 * time.Minute
	DefaultMaxEjectedFraction  = 0.5
)

// ErrEjectionCapped: an endpoint met the ejection criterion but no other
// endpoint in rotation looks healthy and ejecting it would take out more
// than the policy's MaxFraction of the service (or its last endpoint in
// rotation), so it stays in rotation.
var ErrEjectionCapped = errors.New("resolver: ejection cap reached; endpoint stays in rotation")

// EjectionPolicy is local passive ejection: outlier detection on the
// caller's own outcomes (Record), in the manner of Envoy's consecutive
// failure detector. An endpoint with ConsecutiveFailures failures in a
// row is left out of Pick for n × BaseTime (n counts its ejections while
// it stays in the view), at most MaxTime.
//
// The cap is on healthy-looking capacity. While another routable endpoint
// that is not ejected looks healthy (its most recent outcome was a
// success, or it has none yet), the failures are the endpoint's and it is
// ejected, however many others already are: with six of ten endpoints
// dead, all six leave Pick. When nothing else looks healthy the caller
// itself may be the problem, and then no more than MaxFraction of the
// service's routable endpoints are ejected at once: a caller's bad day
// must not drain a service (ADR-01); ejections beyond it (made while
// something still looked healthy) end early, the soonest-ending first.
// The last routable endpoint not ejected is never ejected. Ejection is local: it changes this process's
// picks, not muster's view.
type EjectionPolicy struct {
	// ConsecutiveFailures: 0 takes the default (5); negative disables
	// ejection (outcomes are still counted and reported).
	ConsecutiveFailures int
	// BaseTime and MaxTime: defaults 30 s and 5 min.
	BaseTime, MaxTime time.Duration
	// MaxFraction of the routable endpoints that may be ejected at once
	// while no endpoint left in rotation looks healthy, in [0,1]: default
	// 0.5. It is rounded down (floor(MaxFraction × routable)).
	MaxFraction float64
}

func (p *EjectionPolicy) fill() error {
	if p.ConsecutiveFailures == 0 {
		p.ConsecutiveFailures = DefaultConsecutiveFailures
	}
	if p.BaseTime <= 0 {
		p.BaseTime = DefaultEjectionTime
	}
	if p.MaxTime <= 0 {
		p.MaxTime = DefaultMaxEjectionTime
	}
	if p.MaxFraction == 0 {
		p.MaxFraction = DefaultMaxEjectedFraction
	}
	if !(p.MaxFraction >= 0 && p.MaxFraction <= 1) {
		return fmt.Errorf("resolver: ejection MaxFraction %v outside [0,1]", p.MaxFraction)
	}
	return nil
}

// outcome is one endpoint's outcome counters (since the last report) and
// its ejection state.
type outcome struct {
	successes, failures atomic.Uint64
	consecutive         atomic.Uint32
	// lastFailed: the most recent outcome recorded was a failure. An
	// endpoint without it looks healthy to the ejection cap.
	lastFailed atomic.Bool
	// Guarded by the service's mu.
	ejections    int
	ejectedUntil time.Time // zero: in rotation
}

// Record notes the outcome of one call the caller made to an endpoint of
// service (success or not, by the caller's own definition). It takes no
// lock and does not allocate, except when the failure ejects the endpoint.
// The counts go back to muster as passive evidence (Client) and feed local
// ejection. Outcomes for endpoints the Cache does not hold are counted in
// Stats.OutcomesUnknown and dropped.
func (c *Cache) Record(service, instanceID string, success bool) {
	svc := c.services[service]
	if svc == nil {
		c.st.unknownOutcomes.Add(1)
		return
	}
	o := (*svc.outcomes.Load())[instanceID]
	if o == nil {
		c.st.unknownOutcomes.Add(1)
		return
	}
	// Load before Store: the flags rarely change, and a plain load keeps
	// the cache line shared between the cores recording outcomes.
	if success {
		o.successes.Add(1)
		if o.consecutive.Load() != 0 {
			o.consecutive.Store(0)
		}
		if o.lastFailed.Load() {
			o.lastFailed.Store(false)
		}
		return
	}
	o.failures.Add(1)
	if !o.lastFailed.Load() {
		o.lastFailed.Store(true)
	}
	if n := c.cfg.eject.ConsecutiveFailures; n > 0 && o.consecutive.Add(1) == uint32(n) {
		c.eject(svc, instanceID, o)
	}
}

// eject takes an endpoint out of Pick unless the cap forbids it.
func (c *Cache) eject(svc *service, id string, o *outcome) {
	var ev *Event
	svc.mu.Lock()
	st := svc.state.Load()
	switch {
	case st == nil || !o.ejectedUntil.IsZero():
	case !st.routing.isRoutable(id):
		o.consecutive.Store(0)
	default:
		routable := st.routing.routable
		healthy := healthyOther(st.routing, *svc.outcomes.Load(), id)
		allowed := c.ejectionCap(routable, healthy)
		if st.ejected+1 > allowed {
			// Count afresh: the endpoint gets another chance to be ejected
			// after as many failures again, once the cap has room.
			o.consecutive.Store(0)
			c.st.ejectCapped.Add(1)
			ev = &Event{Service: svc.name, Version: st.routing.version, Routable: routable, Held: routable - st.ejected,
				Err: fmt.Errorf("eject %s of %s: no other endpoint in rotation looks healthy, %d of %d routable already ejected, cap %d: %w",
					id, svc.name, st.ejected, routable, allowed, ErrEjectionCapped)}
			if st.ejected > allowed {
				// Endpoints ejected while others still looked healthy
				// (or had not been tried): now that nothing does, the
				// cap holds for them too, the soonest-ending first.
				c.setState(svc, st.routing, st.latest, nil, st.hold)
			}
			break
		}
		o.ejections++
		d := min(c.cfg.eject.BaseTime*time.Duration(o.ejections), c.cfg.eject.MaxTime)
		o.ejectedUntil = c.cfg.clock().Add(d)
		svc.ejected++
		c.st.ejections.Add(1)
		c.setState(svc, st.routing, st.latest, nil, st.hold)
	}
	svc.mu.Unlock()
	if ev != nil {
		c.emit(*ev)
	}
}

// ejectionCap is how many of routable endpoints may be ejected at once:
// all but one while an endpoint left in rotation looks healthy, else also
// no more than MaxFraction of them.
func (c *Cache) ejectionCap(routable int, healthy bool) int {
	allowed := routable - 1
	if !healthy {
		allowed = min(allowed, int(c.cfg.eject.MaxFraction*float64(routable)))
	}
	return max(allowed, 0)
}

// healthyOther reports whether a routable endpoint of s other than id is
// in rotation (not ejected) and looks healthy: its most recent outcome was
// a success, or it has none. It stops at the first one.
func healthyOther(s *Snapshot, outs map[string]*outcome, id string) bool {
	for _, k := range s.routIdx {
		e := s.eps[k]
		if e.InstanceID == id {
			continue
		}
		if o := outs[e.InstanceID]; o == nil || o.ejectedUntil.IsZero() && !o.lastFailed.Load() {
			return true
		}
	}
	return false
}

// Sweep returns ejected endpoints whose ejection time has passed to
// rotation, switches routing to the newest update of a service whose hold
// has lasted the confirm time (so a quiet server is followed too; see
// Hold), and forgets outcome state of endpoints no longer in any held
// view. Client calls it every second; a Cache used on its own needs its
// owner to call it.
func (c *Cache) Sweep() { c.sweep() }

// sweep is Sweep; it reports whether routing switched for any service.
func (c *Cache) sweep() (switched bool) {
	now := c.cfg.clock()
	var evs []Event
	for _, svc := range c.services {
		svc.mu.Lock()
		outs := *svc.outcomes.Load()
		changed := false
		for _, o := range outs {
			if !o.ejectedUntil.IsZero() && !now.Before(o.ejectedUntil) {
				o.ejectedUntil = time.Time{}
				o.consecutive.Store(0)
				svc.ejected--
				c.st.unejections.Add(1)
				changed = true
			}
		}
		if fev, ok := c.followDue(svc, now); ok {
			evs = append(evs, fev...)
			switched = true
		} else if st := svc.state.Load(); st != nil {
			// Prune ids neither snapshot holds (their pending counts have
			// been reported or are dropped with them).
			if n := len(outs); n > len(st.routing.eps) || n > len(st.latest.eps) {
				changed = true
			}
			if changed {
				c.setState(svc, st.routing, st.latest, nil, st.hold)
			}
		}
		svc.mu.Unlock()
	}
	c.emit(evs...)
	return switched
}

// Ejected returns the ids of service's endpoints that are locally ejected
// now, sorted.
func (c *Cache) Ejected(service string) []string {
	svc := c.services[service]
	if svc == nil {
		return nil
	}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	var ids []string
	for id, o := range *svc.outcomes.Load() {
		if !o.ejectedUntil.IsZero() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// setState stores routing and latest (and the hold between them, nil
// when they are the same) with routing's pick table minus the ejected
// endpoints. added lists endpoints that may be new to the service's
// outcome map; nil with a changed set of snapshots prunes and rebuilds
// the map. Called with svc.mu held.
func (c *Cache) setState(svc *service, routing, latest *Snapshot, added []*Endpoint, hold *Hold) {
	outs := *svc.outcomes.Load()
	var grown map[string]*outcome
	for _, e := range added {
		if _, ok := outs[e.InstanceID]; ok {
			continue
		}
		if grown == nil {
			grown = maps.Clone(outs)
		}
		grown[e.InstanceID] = &outcome{}
	}
	if added == nil && (len(outs) > len(routing.eps) || len(outs) > len(latest.eps) || len(outs) == 0) {
		// Rebuild from the two snapshots, keeping live counters.
		grown = make(map[string]*outcome, max(len(routing.eps), len(latest.eps)))
		for _, s := range []*Snapshot{routing, latest} {
			for _, e := range s.eps {
				if o := outs[e.InstanceID]; o != nil {
					grown[e.InstanceID] = o
				} else if grown[e.InstanceID] == nil {
					grown[e.InstanceID] = &outcome{}
				}
			}
		}
		svc.ejected = 0
		for _, o := range grown {
			if !o.ejectedUntil.IsZero() {
				svc.ejected++
			}
		}
	}
	if grown != nil {
		outs = grown
		svc.outcomes.Store(&grown)
	}
	st := &state{routing: routing, latest: latest, hold: hold, table: &routing.table}
	if svc.ejected > 0 {
		st.table, st.ejected = c.ejectedTable(svc, routing, outs)
	}
	if routing.routable > 0 && !svc.routed.Load() {
		svc.routed.Store(true)
	}
	svc.state.Store(st)
}

// ejectedTable is routing's pick table without the ejected endpoints. If
// a new view left more ejected than the cap allows (ejectionCap: nothing
// left in rotation looks healthy, or nothing is left in rotation), the
// ejections that end soonest are ended early.
func (c *Cache) ejectedTable(svc *service, routing *Snapshot, outs map[string]*outcome) (*pickTable, int) {
	var ejected []*outcome
	healthy := false
	for _, k := range routing.routIdx {
		o := outs[routing.eps[k].InstanceID]
		switch {
		case o != nil && !o.ejectedUntil.IsZero():
			ejected = append(ejected, o)
		case o == nil || !o.lastFailed.Load():
			healthy = true
		}
	}
	if allowed := c.ejectionCap(routing.routable, healthy); len(ejected) > allowed {
		slices.SortFunc(ejected, func(a, b *outcome) int { return a.ejectedUntil.Compare(b.ejectedUntil) })
		for _, o := range ejected[:len(ejected)-allowed] {
			o.ejectedUntil = time.Time{}
			o.consecutive.Store(0)
			svc.ejected--
			c.st.unejections.Add(1)
		}
		ejected = ejected[len(ejected)-allowed:]
	}
	if len(ejected) == 0 {
		return &routing.table, 0
	}
	t := routing.buildTable(routing.routIdx, func(e *Endpoint) bool {
		o := outs[e.InstanceID]
		return o != nil && !o.ejectedUntil.IsZero()
	})
	return &t, len(ejected)
}

// drainOutcomes hands each endpoint's outcome counts since the last drain
// to fn and zeroes them.
func (c *Cache) drainOutcomes(fn func(service, instanceID string, successes, failures uint64)) {
	for name, svc := range c.services {
		for id, o := range *svc.outcomes.Load() {
			s, f := o.successes.Swap(0), o.failures.Swap(0)
			if s != 0 || f != 0 {
				fn(name, id, s, f)
			}
		}
	}
}

// isRoutable reports whether id is among the endpoints Pick may choose.
func (s *Snapshot) isRoutable(id string) bool {
	k, ok := slices.BinarySearchFunc(s.eps, id, func(e *Endpoint, id string) int { return cmpString(e.InstanceID, id) })
	if !ok {
		return false
	}
	_, ok = slices.BinarySearch(s.routIdx, int32(k))
	return ok
}
