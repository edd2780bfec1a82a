package registry

import (
	"fmt"

	"github.com/musterhq/muster/internal/refusal"
)

// The kinds of refusal the registry returns, as *refusal.Error values. Use
// errors.Is.
var (
	ErrNotFound  = refusal.NotFound
	ErrForbidden = refusal.Forbidden
	ErrConflict  = refusal.Conflict
	ErrInvalid   = refusal.Invalid
	ErrGone      = refusal.Gone
	// ErrPrecondition: a conditional write (If-Match) found another version.
	ErrPrecondition = refusal.Precondition
)

// FieldError names one invalid field by its JSON path (refusal.Field).
type FieldError = refusal.Field

func newRefusal(kind *refusal.Kind, format string, args ...any) *refusal.Error {
	return &refusal.Error{Kind: kind, Detail: fmt.Sprintf(format, args...)}
}

func invalid(detail string, fields []FieldError) *refusal.Error {
	return &refusal.Error{Kind: ErrInvalid, Detail: detail, Fields: fields}
}
