package evaluator

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Override is an operator's decision in force about one instance (the
// policy package admits them, ADR-15). The evaluator carries it beside the
// instance's own verdict, which it never changes; the assembler applies it
// before the guard.
type Override struct {
	ID         uuid.UUID `json:"id"`
	InstanceID uuid.UUID `json:"-"`
	Service    string    `json:"-"`
	// Action is "mark_ineligible" or "mark_eligible".
	Action        string    `json:"action"`
	Actor         string    `json:"actor"`
	Cosigner      string    `json:"cosigner,omitempty"`
	Justification string    `json:"justification"`
	ExpiresAt     time.Time `json:"expires_at"`
}

// Reason is the override as one line of an instance's reasons.
func (o Override) Reason() string {
	by := o.Actor
	if o.Cosigner != "" {
		by += " and " + o.Cosigner
	}
	return fmt.Sprintf("override %s: %s by %s until %s: %s", o.ID, o.Action, by, o.ExpiresAt.UTC().Format(time.RFC3339), o.Justification)
}

// OverrideSource lists the overrides in force (policy.InForce). It is
// read at rebuild and on every refresh, so every replica learns of
// overrides written by any other within RefreshEvery; Changed asks for an
// early refresh when this process changed them.
type OverrideSource interface {
	InForce(ctx context.Context) ([]Override, error)
	Changed() <-chan struct{}
}

// loadOverrides replaces the overrides held with those in force and marks
// the services whose overrides changed.
func (e *Evaluator) loadOverrides(ctx context.Context) error {
	if e.cfg.Overrides == nil {
		return nil
	}
	list, err := e.cfg.Overrides.InForce(ctx)
	if err != nil {
		return fmt.Errorf("load overrides: %w", err)
	}
	next := make(map[uuid.UUID]Override, len(list))
	for _, o := range list {
		next[o.InstanceID] = o
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, o := range e.overrides {
		if n, ok := next[id]; !ok || n != o {
			e.changed[o.Service] = struct{}{}
		}
	}
	for id, o := range next {
		if old, ok := e.overrides[id]; !ok || old != o {
			e.changed[o.Service] = struct{}{}
		}
	}
	e.overrides = next
	return nil
}

// expireOverrides drops overrides whose time is up, so their services are
// re-published on this tick even before the next refresh. Called with e.mu
// held.
func (e *Evaluator) expireOverrides(now time.Time) {
	for id, o := range e.overrides {
		if !now.Before(o.ExpiresAt) {
			delete(e.overrides, id)
			e.changed[o.Service] = struct{}{}
		}
	}
}

// override returns the override in force for an instance at now. Called
// with e.mu held.
func (e *Evaluator) override(id uuid.UUID, now time.Time) *Override {
	o, ok := e.overrides[id]
	if !ok || !now.Before(o.ExpiresAt) {
		return nil
	}
	return &o
}

// OverrideCounts returns, per service, how many instances an override in
// force marks ineligible (Out) and eligible (In). Verdicts and their
// counts stay the instances' own; these say how far the views differ.
func (e *Evaluator) OverrideCounts() map[string]OverrideCount {
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]OverrideCount{}
	for id, o := range e.overrides {
		if e.override(id, now) == nil {
			continue
		}
		c := out[o.Service]
		if o.Action == "mark_eligible" {
			c.In++
		} else {
			c.Out++
		}
		out[o.Service] = c
	}
	return out
}

// OverrideCount is how many of a service's instances overrides hold out of
// (Out) or force into (In) rotation.
type OverrideCount struct{ Out, In int }
