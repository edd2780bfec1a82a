package evaluator

import (
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/assembler"
	"github.com/musterhq/muster/eligibility"
)

// ClassEvidence summarises one evidence class of one instance.
type ClassEvidence struct {
	Present              bool       `json:"present"`
	Silent               bool       `json:"silent"`
	FailureRate          float64    `json:"failure_rate"`
	LastSampleAt         *time.Time `json:"last_sample_at,omitempty"`
	LastSampleAgeSeconds *float64   `json:"last_sample_age_seconds,omitempty"`
}

// InstanceVerdict is what GET /v1/services/{name}/eligibility shows per
// instance.
type InstanceVerdict struct {
	InstanceID      uuid.UUID  `json:"instance_id"`
	Zone            string     `json:"zone"`
	State           string     `json:"state"`
	Weight          float64    `json:"weight"`
	Health          string     `json:"health"` // known | unknown
	SingleClass     bool       `json:"single_class"`
	Primary         string     `json:"primary"`
	QuarantineUntil *time.Time `json:"quarantine_until,omitempty"`
	// Override is the operator's override in force, if any. State stays the
	// instance's own verdict; the override is applied in the views.
	Override *Override                `json:"override,omitempty"`
	Evidence map[string]ClassEvidence `json:"evidence"`
	Reasons  []string                 `json:"reasons"`
}

// ServiceEligibility is the evaluator's view of one service.
type ServiceEligibility struct {
	Service     string            `json:"service"`
	GeneratedAt time.Time         `json:"generated_at"`
	Counts      map[string]int    `json:"counts"`
	Instances   []InstanceVerdict `json:"instances"`
}

// AllServiceStats returns every service's counts by state, quarantines,
// flap rate and evidence classes in one pass over the instances (cheap
// next to ServiceEligibility for each service), with the time they were
// taken.
func (e *Evaluator) AllServiceStats() ([]eligibility.ServiceStats, time.Time, error) {
	if !e.ready.Load() {
		return nil, time.Time{}, ErrNotReady
	}
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.engine.AllServiceStats(now), now, nil
}

// ServiceEligibility returns the current verdicts of a service's instances,
// ordered by instance id. The caller has checked the service exists and may
// be read.
func (e *Evaluator) ServiceEligibility(service string) (ServiceEligibility, error) {
	if !e.ready.Load() {
		return ServiceEligibility{}, ErrNotReady
	}
	now := e.cfg.Now()
	out := ServiceEligibility{
		Service: service, GeneratedAt: now, Instances: []InstanceVerdict{},
		Counts: map[string]int{"eligible": 0, "degraded": 0, "ineligible": 0, "unknown": 0},
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for id := range e.byService[service] {
		v, ok := e.engine.Verdict(eligibility.InstanceID(id), now)
		if !ok {
			continue
		}
		iv := InstanceVerdict{
			InstanceID: id, Zone: e.instances[id].zone, State: v.State.String(), Weight: v.Weight,
			Health: "unknown", SingleClass: v.SingleClass, Primary: v.Primary.String(),
			Evidence: map[string]ClassEvidence{}, Reasons: slices.Clone(v.Reasons),
		}
		if iv.Reasons == nil {
			iv.Reasons = []string{}
		}
		if v.HealthKnown {
			iv.Health = "known"
		}
		if o := e.override(id, now); o != nil {
			iv.Override = o
			iv.Reasons = append(iv.Reasons, o.Reason())
		}
		if !v.QuarantinedUntil.IsZero() && v.QuarantinedUntil.After(now) {
			q := v.QuarantinedUntil
			iv.QuarantineUntil = &q
		}
		for c, cs := range v.Classes {
			ev := ClassEvidence{Present: cs.Present, Silent: cs.Silent, FailureRate: cs.FailureRate}
			if !cs.LastSample.IsZero() {
				at := cs.LastSample
				age := now.Sub(at).Seconds()
				ev.LastSampleAt, ev.LastSampleAgeSeconds = &at, &age
			}
			iv.Evidence[eligibility.Class(c).String()] = ev
		}
		out.Counts[iv.State]++
		out.Instances = append(out.Instances, iv)
	}
	slices.SortFunc(out.Instances, func(a, b InstanceVerdict) int { return slices.Compare(a.InstanceID[:], b.InstanceID[:]) })
	return out, nil
}

// EndpointVerdict is one instance's endpoint and verdict, for the assembler.
type EndpointVerdict struct {
	ID          uuid.UUID
	Address     string
	Port        int
	Zone        string
	State       eligibility.State
	Weight      float64
	HealthKnown bool
	Quarantined bool
	// Override is the override in force, if any; State is still the
	// instance's own verdict.
	Override *Override
	// LeaseExpired: the registry ended the instance by lease expiry; it is
	// listed (State Ineligible) only while its zone's guard needs it.
	LeaseExpired bool
	// Awaiting: never in rotation since it registered (see
	// assembler.InstanceInput.Awaiting).
	Awaiting bool
}

// Input is v as the assembler's guard takes it (without FirstFailureAt,
// which the publisher tracks). The override budget and the drain budget
// count through it too, so the three cannot disagree.
func (v EndpointVerdict) Input() assembler.InstanceInput {
	in := assembler.InstanceInput{
		ID: v.ID, Address: v.Address, Port: v.Port, Zone: v.Zone, State: v.State, Weight: v.Weight,
		HealthKnown: v.HealthKnown, Quarantined: v.Quarantined, LeaseExpired: v.LeaseExpired, Awaiting: v.Awaiting,
	}
	if o := v.Override; o != nil {
		in.Override = &assembler.Override{ID: o.ID, Action: o.Action, Reason: o.Reason()}
	}
	return in
}

// ServiceSnapshot is what the assembler needs of one service.
type ServiceSnapshot struct {
	Name               string
	MinHealthyFraction float64
	Capabilities       []string
	// SlowStart is the contract's ramp, for endpoints the assembler puts
	// into rotation itself (a tripped guard, a mark_eligible override).
	SlowStart time.Duration
	Instances []EndpointVerdict
}

// Snapshot returns a service's endpoints with their current verdicts, or
// false when the evaluator does not know the service (or is not ready).
func (e *Evaluator) Snapshot(service string) (ServiceSnapshot, bool) {
	if !e.ready.Load() {
		return ServiceSnapshot{}, false
	}
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	si := e.services[service]
	if si == nil {
		return ServiceSnapshot{}, false
	}
	out := ServiceSnapshot{Name: service, MinHealthyFraction: si.minFraction, Capabilities: si.capabilities, SlowStart: si.slowStart,
		Instances: make([]EndpointVerdict, 0, len(e.byService[service]))}
	for id := range e.byService[service] {
		v, ok := e.engine.Routing(eligibility.InstanceID(id), now)
		if !ok {
			continue
		}
		info := e.instances[id]
		out.Instances = append(out.Instances, EndpointVerdict{
			ID: id, Address: info.address, Port: info.port, Zone: info.zone,
			State: v.State, Weight: v.Weight, HealthKnown: v.HealthKnown, Quarantined: v.Quarantined,
			Override: e.override(id, now), Awaiting: v.Awaiting,
		})
	}
	for id, x := range e.expired[service] {
		out.Instances = append(out.Instances, EndpointVerdict{
			ID: id, Address: x.info.address, Port: x.info.port, Zone: x.info.zone,
			State: eligibility.Ineligible, LeaseExpired: true, Awaiting: x.awaiting,
		})
	}
	return out, true
}
