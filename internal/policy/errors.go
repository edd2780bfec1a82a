package policy

import (
	"github.com/musterhq/muster/internal/refusal"
)

// The kinds of refusal policy and the shift-backs return, as
// *refusal.Error values. Use errors.Is. Each maps to one problem type in
// server/ (refusal.Kind.ProblemType).
var (
	ErrInvalid       = refusal.Invalid
	ErrNotFound      = refusal.NotFound
	ErrForbidden     = refusal.Forbidden
	ErrRateLimited   = refusal.RateLimited
	ErrJustification = refusal.Invalid.Sub("justification required", "justification-required")
	ErrExpiry        = refusal.Invalid.Sub("invalid expiry", "invalid-expiry")
	ErrBudget        = refusal.Conflict.Sub("budget exceeded", "budget-exceeded")
	ErrLastInstance  = refusal.Conflict.Sub("last eligible instance", "last-instance")
	ErrConflict      = refusal.Conflict
	ErrSelfCosign    = refusal.Forbidden.Sub("self co-sign", "self-cosign")
	ErrCosignExpired = refusal.Gone.Sub("co-sign window closed", "cosign-expired")
)

// The checks an attempt passes through, as the audit log names the one
// that decided.
const (
	CheckRequest       = "request"
	CheckInstance      = "instance"
	CheckAuthorization = "authorization"
	CheckRateLimit     = "rate_limit"
	CheckJustification = "justification"
	CheckExpiry        = "expiry"
	CheckState         = "state"
	CheckBudget        = "budget"
	CheckLastInstance  = "last_instance"
	CheckCosign        = "cosign"
)

// PendingOverride returns the attempt a budget refusal stored as
// pending_cosign, if err is such a refusal.
func PendingOverride(err *refusal.Error) (*Override, bool) {
	o, ok := err.Subject.(*Override)
	return o, ok && o != nil
}
