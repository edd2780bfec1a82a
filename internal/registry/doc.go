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
// # Lease expiry (ADR-03, 05; issue 11)
//
// A lease is muster's claim that an instance renews; muster's own absence
// must never look like the instance's. The Reaper therefore:
//
//   - lets a lease's clock run only while a renewal could have landed: no
//     lease expires within one TTL of the reaper starting (serve calls
//     HearingFrom when the API starts serving), of its own sweeps reaching
//     the database again after failing, or of UpSince (the database
//     monitor). A lease that lapsed meanwhile is renewed under its id
//     (Renew accepts a lapsed lease whose instance is still active);
//   - waits ExpiryDelay (TTL/3) after a lease lapses before ending it, so
//     leases that stop renewing together (a client renewing three times a
//     lease lapses them within one renewal period) are counted together;
//   - applies a disbelief threshold per scope: if more than
//     RegionThreshold (15%) of the region's leases, or ServiceThreshold
//     (50%) of a service's, lapsed or were expired within one TTL, and at
//     least MinMassExpiry (3) of them, uncorroborated expiry in that scope
//     is held and Suppressions reports a lease_expiry_suppressed alarm with
//     the numbers. It resumes when renewals recover (the lapsed leases
//     renew and the fraction falls) or when an operator confirms
//     (ConfirmLeaseExpiry, audited as lease.expiry.confirm): the leases
//     lapsed by the confirmation may then expire; the region's covers every
//     service. Unlike Eureka's self-preservation, which freezes all expiry,
//     the hold is per scope and corroborated expiries go ahead;
//   - never holds an expiry corroborated by health evidence gathered while
//     muster could hear it (Corroborated, from the evaluator: the instance
//     failing on a class, or silent on every class while its siblings are
//     heard). muster's own deafness silences the siblings too, so it is
//     never corroboration.
//
// Counting recently expired leases in the fraction is deliberately
// conservative: for one TTL after a confirmation released a mass expiry,
// a further lapse in the same scope may be held again. Expired instances
// then go through the fraction guard (package assembler): they leave the
// view only as far as each zone's minimum healthy fraction allows.
// Deregistration (graceful shutdown) is never held.
//
// # Renewals at scale (issue 26)
//
// A renewal is never lost to a limit: the server's per-identity renewal
// limit grows with the live leases the identity registered
// (LeasesRegisteredBy), RenewBatch renews up to MaxRenewalBatch leases in
// one transaction, each decided as a single renewal is, and a renewal a
// rate limit refuses all the same is kept in memory
// (NoteRefusedRenewals) and applied later in one statement, checked as
// it would have been, as made when it was refused
// (FlushRefusedRenewals, called by the reaper before it sweeps). See
// renewal.go.
//
// The package knows nothing of HTTP. Refusals are *refusal.Error values of
// the kinds ErrNotFound, ErrForbidden, ... (refusal's), which the server maps to
// status codes in one place.
package registry
