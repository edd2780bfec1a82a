package policy

import (
	"errors"
	"fmt"

	"github.com/musterhq/muster/registry"
)

// Sentinels for the kinds of refusal. Use errors.Is. Each maps to one
// problem type in server/.
var (
	ErrInvalid       = errors.New("invalid")
	ErrNotFound      = errors.New("not found")
	ErrForbidden     = errors.New("forbidden")
	ErrRateLimited   = errors.New("rate limited")
	ErrJustification = errors.New("justification required")
	ErrExpiry        = errors.New("invalid expiry")
	ErrBudget        = errors.New("budget exceeded")
	ErrLastInstance  = errors.New("last eligible instance")
	ErrConflict      = errors.New("conflict")
	ErrSelfCosign    = errors.New("self co-sign")
	ErrCosignExpired = errors.New("co-sign window closed")
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

// Error is a refusal with a reason a tired operator can act on.
type Error struct {
	Kind   error // one of the sentinels
	Check  string
	Detail string
	Fields []registry.FieldError
	// Figures are the numbers the deciding check used (budget counts,
	// rate-limit state); the server also sends them as problem extension
	// members.
	Figures map[string]any
	// RateLimit is set on ErrRateLimited (and on any refusal after the
	// rate limit, for the RateLimit-* headers).
	RateLimit *Decision
	// Override is the attempt stored as pending_cosign when the budget
	// refused it.
	Override *Override
}

func (e *Error) Error() string { return fmt.Sprintf("%v: %s", e.Kind, e.Detail) }

// Unwrap lets errors.Is match the sentinel.
func (e *Error) Unwrap() error { return e.Kind }

func refusal(kind error, check, format string, args ...any) *Error {
	return &Error{Kind: kind, Check: check, Detail: fmt.Sprintf(format, args...)}
}
