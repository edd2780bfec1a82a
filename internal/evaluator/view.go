package evaluator

import (
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
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

// Snapshot returns a service as the assembler takes it: its endpoints
// with their current verdicts, without the overrides in force (policy's
// InForce applies them: policy.Applied), FirstFailureAt (the publisher
// tracks it from the transitions) or Traffic (the shift-backs' weights).
// It is false when the evaluator does not know the service (or is not
// ready). The override budget and the drain budget count on the same
// input, so they and the guard cannot disagree.
func (e *Evaluator) Snapshot(service string) (assembler.ServiceInput, bool) {
	if !e.ready.Load() {
		return assembler.ServiceInput{}, false
	}
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	si := e.services[service]
	if si == nil {
		return assembler.ServiceInput{}, false
	}
	out := assembler.ServiceInput{Name: service, MinHealthyFraction: si.minFraction, Capabilities: si.capabilities, SlowStart: si.slowStart,
		Instances: make([]assembler.InstanceInput, 0, len(e.byService[service])+len(e.expired[service]))}
	for id := range e.byService[service] {
		v, ok := e.engine.Routing(eligibility.InstanceID(id), now)
		if !ok {
			continue
		}
		info := e.instances[id]
		in := assembler.InstanceInput{
			ID: id, Address: info.address, Port: info.port, Zone: info.zone,
			State: v.State, Weight: v.Weight, HealthKnown: v.HealthKnown, Quarantined: v.Quarantined, Awaiting: v.Awaiting,
		}
		out.Instances = append(out.Instances, in)
	}
	for id, x := range e.expired[service] {
		in := x.input()
		in.ID, in.Address, in.Port, in.Zone = id, x.info.address, x.info.port, x.info.zone
		out.Instances = append(out.Instances, in)
	}
	return out, true
}
