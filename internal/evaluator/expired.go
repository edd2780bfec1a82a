package evaluator

import (
	"fmt"
	"strings"
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

// LeaseExpiryEvidence says what health evidence this process has heard
// of instances whose leases lapsed: which of them it
// corroborates as gone, and which share an observation path muster cannot
// hear (a prober in outage covering them, or a zone none of whose
// instances is heard while another zone is).
//
// An instance's silence corroborates its death only where something
// sharing its path is heard: a sibling of its service in its own zone,
// with no prober covering it in outage. muster's own deafness (a restart,
// an ingest outage, a zone or a prober cut off from it) silences the
// siblings that share the path too, so it is never corroboration. An
// instance failing on a class is corroborated by that evidence while it
// is current and its observer is heard (no covering prober in outage).
// The lease reaper asks once per sweep and expires a corroborated lease
// even while a disbelief threshold holds the others. What is heard is
// worked out once per service and zone, so a mass lapse costs one pass
// over each, not one per lapse.
func (e *Evaluator) LeaseExpiryEvidence(ids []uuid.UUID) registry.ExpiryEvidence {
	out := registry.ExpiryEvidence{Corroborated: map[uuid.UUID]string{}, Partitioned: map[uuid.UUID]registry.Partition{}, Unheard: map[string]string{}}
	if !e.ready.Load() || len(ids) == 0 {
		return out
	}
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()

	// The probers in outage, by name.
	var down []*proberAssignment
	var downNames []string
	for _, o := range e.engine.ProberOutages() {
		for name, pa := range e.probers {
			if pa.id == o.Prober {
				down = append(down, pa)
				downNames = append(downNames, name)
			}
		}
	}
	type key struct{ service, zone string }
	heardIn := map[key]bool{}      // a sibling heard in the service's zone
	zoneHeard := map[string]bool{} // any instance heard in the zone
	zonesDone := false
	heard := func(id uuid.UUID) bool {
		r, ok := e.engine.Routing(eligibility.InstanceID(id), now)
		return ok && r.HealthKnown
	}
	for _, id := range ids {
		info, ok := e.instances[id]
		if !ok {
			continue
		}
		for i, pa := range down {
			if pa.covers(id, info.svc, info.service) {
				out.Partitioned[id] = registry.Partition{Prober: downNames[i],
					Why: fmt.Sprintf("prober %s, which covers it, is in outage (prober_outage): its silence is the prober's", downNames[i])}
				break
			}
		}
		r, ok := e.engine.Routing(eligibility.InstanceID(id), now)
		if !ok {
			continue
		}
		_, cut := out.Partitioned[id]
		if r.State == eligibility.Ineligible && r.HealthKnown && !cut {
			out.Corroborated[id] = "corroborated: ineligible by its own current health evidence"
			continue
		}
		if r.HealthKnown {
			continue
		}
		k := key{info.service, info.zone}
		h, done := heardIn[k]
		if !done {
			// The instance itself is silent, so "a sibling is heard" is
			// "any instance of the service in the zone is heard".
			for sib := range e.byService[info.service] {
				if e.instances[sib].zone == info.zone && heard(sib) {
					h = true
					break
				}
			}
			heardIn[k] = h
		}
		if h && !cut {
			out.Corroborated[id] = "corroborated: silent on every evidence class while its siblings in zone " + info.zone + " are heard"
			continue
		}
		if h {
			continue
		}
		if !zonesDone {
			// Which zones are heard at all: one pass over the instances.
			zonesDone = true
			for iid, in := range e.instances {
				if !zoneHeard[in.zone] && heard(iid) {
					zoneHeard[in.zone] = true
				}
			}
		}
		if !zoneHeard[info.zone] && len(zoneHeard) > 0 {
			why := "no instance in zone " + info.zone + " is heard on any evidence class while other zones are"
			if len(downNames) > 0 {
				why += "; probers in outage: " + strings.Join(downNames, ", ")
			}
			out.Unheard[info.zone] = why
		}
	}
	return out
}

// LeaseExpiriesCorroborated is LeaseExpiryEvidence's corroborated ids.
func (e *Evaluator) LeaseExpiriesCorroborated(ids []uuid.UUID) map[uuid.UUID]string {
	return e.LeaseExpiryEvidence(ids).Corroborated
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
