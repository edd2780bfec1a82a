// Package registry holds muster's desired state (ADR-02, 03, 16): services
// with their owners and capability profiles, health contracts, and instances
// with their leases. It owns the business rules over those tables: who may
// change what, what a valid contract is, and that every change and every
// refused attempt is written to the audit log in the same transaction as the
// change itself.
//
// Instances are never deleted. Deregistration, lease expiry and replacement
// by a new registration of the same endpoint end an instance and keep its row,
// so an id is never reused and a stale cached endpoint is detectably stale.
//
// The package knows nothing of HTTP. Errors are *Error values wrapping one of
// the sentinels (ErrNotFound, ErrForbidden, ...), which the server maps to
// status codes in one place.
package registry
