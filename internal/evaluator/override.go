package evaluator

import (
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

// OverrideSource is where the evaluator reads the overrides in force
// (policy.InForce, which follows policy's table): for what it shows beside
// a verdict and for the capacity it counts around lease-expired
// instances. It never changes a verdict.
type OverrideSource interface {
	For(id uuid.UUID, now time.Time) (Override, bool)
}

// override returns the override in force for an instance at now, or nil.
func (e *Evaluator) override(id uuid.UUID, now time.Time) *Override {
	if e.cfg.Overrides == nil {
		return nil
	}
	o, ok := e.cfg.Overrides.For(id, now)
	if !ok {
		return nil
	}
	return &o
}
