package evaluator

import (
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/registry"
)

// ReasonLeaseExpired is the reason on the last transition of an instance
// the registry ended because its lease ran out.
const ReasonLeaseExpired = "lease expired"

// ExpiredHorizon is how long after its expiry an instance may still be
// kept for the guard across a restart: the rebuild reloads instances that
// expired within it, so a zone tripped before the restart keeps them.
const ExpiredHorizon = time.Hour

// expiredInstance is an instance whose lease expired, kept (outside the
// engine: no evidence about it matters any more) while its zone's guard
// needs it.
type expiredInstance struct {
	info instanceInfo
	at   time.Time
	// awaiting: it never was in rotation (it expired before its first
	// success), so it was never capacity and the guard does not keep it.
	awaiting bool
}

// keepExpired records an instance the registry ended by lease expiry.
// Called with e.mu held.
func (e *Evaluator) keepExpired(in registry.Instance, info instanceInfo, awaiting bool, now time.Time) {
	at := now
	if in.EndedAt != nil {
		at = *in.EndedAt
	}
	if now.Sub(at) > ExpiredHorizon {
		return
	}
	m := e.expired[in.Service]
	if m == nil {
		m = map[uuid.UUID]expiredInstance{}
		e.expired[in.Service] = m
	}
	m[in.ID] = expiredInstance{info: info, at: at, awaiting: awaiting}
	e.changed[in.Service] = struct{}{}
}

// pruneExpired forgets the expired instances their zone's guard no longer
// needs: the zone keeps its minimum healthy fraction counting them as out
// of rotation, so the assembler does not publish them, or they never were
// capacity (expired awaiting their first success). The rule is the
// assembler's own (Capacity). Called with e.mu held.
func (e *Evaluator) pruneExpired(now time.Time) {
	for service, kept := range e.expired {
		si := e.services[service]
		if si == nil || len(kept) == 0 {
			delete(e.expired, service)
			if len(kept) > 0 {
				e.changed[service] = struct{}{}
			}
			continue
		}
		zones := map[string]*assembler.Capacity{}
		for _, x := range kept {
			c := zones[x.info.zone]
			if c == nil {
				c = &assembler.Capacity{}
				zones[x.info.zone] = c
			}
			in := x.input()
			c.Add(&in)
		}
		for id := range e.byService[service] {
			c := zones[e.instances[id].zone]
			if c == nil {
				continue // a zone without expired instances needs no count
			}
			r, ok := e.engine.Routing(eligibility.InstanceID(id), now)
			if !ok {
				continue
			}
			in := assembler.InstanceInput{State: r.State, Quarantined: r.Quarantined, Awaiting: r.Awaiting}
			if o := e.override(id, now); o != nil {
				in.Override = &assembler.Override{Action: o.Action}
			}
			c.Add(&in)
		}
		for id, x := range kept {
			if x.awaiting || !zones[x.info.zone].Tripped(si.minFraction) {
				delete(kept, id)
				e.changed[service] = struct{}{}
			}
		}
		if len(kept) == 0 {
			delete(e.expired, service)
		}
	}
}

// LeaseExpiriesCorroborated says, for each instance whose lease lapsed,
// whether health evidence this process has heard confirms that it is gone,
// and why (the ids not in the result are not corroborated): it is
// ineligible by its own evidence (failing on a class), or it is silent on
// every class while a sibling of its service is heard. muster's own
// deafness (a restart, an ingest outage) silences the siblings too, so it
// is never corroboration. The lease reaper asks once per sweep and expires
// a corroborated lease even while a disbelief threshold holds the others.
// Whether a service has a heard instance is worked out once per service,
// so a mass lapse costs one pass over each service, not one per lapse.
func (e *Evaluator) LeaseExpiriesCorroborated(ids []uuid.UUID) map[uuid.UUID]string {
	out := map[uuid.UUID]string{}
	if !e.ready.Load() || len(ids) == 0 {
		return out
	}
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	heard := map[string]bool{} // by service, computed on first need
	for _, id := range ids {
		info, ok := e.instances[id]
		if !ok {
			continue
		}
		r, ok := e.engine.Routing(eligibility.InstanceID(id), now)
		switch {
		case !ok:
			continue
		case r.State == eligibility.Ineligible:
			out[id] = "corroborated: ineligible by its own health evidence"
			continue
		case r.HealthKnown:
			continue
		}
		h, done := heard[info.service]
		if !done {
			// The instance itself is silent, so "a sibling is heard" is
			// "any instance of the service is heard".
			for sib := range e.byService[info.service] {
				if s, ok := e.engine.Routing(eligibility.InstanceID(sib), now); ok && s.HealthKnown {
					h = true
					break
				}
			}
			heard[info.service] = h
		}
		if h {
			out[id] = "corroborated: silent on every evidence class while its siblings are heard"
		}
	}
	return out
}

// LeaseExpiryCorroborated is LeaseExpiriesCorroborated for one instance.
func (e *Evaluator) LeaseExpiryCorroborated(id uuid.UUID) (string, bool) {
	why, ok := e.LeaseExpiriesCorroborated([]uuid.UUID{id})[id]
	return why, ok
}

// input is the expired instance as the assembler's guard counts it.
func (x expiredInstance) input() assembler.InstanceInput {
	return assembler.InstanceInput{State: eligibility.Ineligible, LeaseExpired: true, Awaiting: x.awaiting}
}
