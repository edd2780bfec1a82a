package registry

import (
	"errors"
	"fmt"
)

// Sentinels for the kinds of refusal. Use errors.Is.
var (
	ErrNotFound  = errors.New("not found")
	ErrForbidden = errors.New("forbidden")
	ErrConflict  = errors.New("conflict")
	ErrInvalid   = errors.New("invalid")
	ErrGone      = errors.New("gone")
	// ErrPrecondition: a conditional write (If-Match) found another version.
	ErrPrecondition = errors.New("precondition failed")
)

// FieldError names one invalid field by its JSON path.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error is a refusal with a reason a person can act on.
type Error struct {
	Kind   error // one of the sentinels
	Detail string
	Fields []FieldError
}

func (e *Error) Error() string { return fmt.Sprintf("%v: %s", e.Kind, e.Detail) }

// Unwrap lets errors.Is match the sentinel.
func (e *Error) Unwrap() error { return e.Kind }

func refusal(kind error, format string, args ...any) *Error {
	return &Error{Kind: kind, Detail: fmt.Sprintf(format, args...)}
}

func invalid(detail string, fields []FieldError) *Error {
	return &Error{Kind: ErrInvalid, Detail: detail, Fields: fields}
}
