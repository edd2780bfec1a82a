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
// # Lease expiry (ADR-03, 05)
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
//   - applies the one removal rule (package disbelief) per scope: if more
//     than ZoneThreshold (50%) of a zone's leases, RegionThreshold (15%)
//     of the region's, or ServiceThreshold (50%) of a service's lapsed or
//     were expired within one TTL, and at least MinMassExpiry (3) of
//     them, uncorroborated expiry in that scope is held (the zone first:
//     a zone cut off from muster is one hold naming the zone); a lease a
//     prober in outage covers is held in the prober's scope whatever the
//     count. Holds reports them (disbelief.Hold, alarm removal_held).
//     A hold ends when renewals recover or when an operator confirms
//     (ConfirmLeaseExpiry, audited as lease.expiry.confirm): the leases
//     lapsed by the confirmation may then expire; the region's covers
//     every scope. No timer ends a hold. Unlike Eureka's
//     self-preservation, which freezes all expiry, the hold is per scope
//     and corroborated expiries go ahead;
//   - never holds an expiry corroborated by health evidence muster hears
//     (Evidence, from the evaluator: the instance failing on a class
//     while its observer is heard, or silent on every class while its
//     siblings in its own zone are heard and no prober covering it is in
//     outage). muster's own deafness (a restart, a zone or a prober cut
//     off) silences the instances that share the path too, so it is
//     never corroboration;
//   - applies, before each sweep, the renewals a rate limit refused on
//     this replica (FlushRefusedRenewals), as made when refused: a renewal
//     refused for load never expires a lease.
//
// Counting recently expired leases in the fraction is deliberately
// conservative: for one TTL after a confirmation released a mass expiry,
// a further lapse in the same scope may be held again. Expired instances
// then go through the fraction guard (package assembler): they leave the
// view only as far as each zone's minimum healthy fraction allows.
// Deregistration (graceful shutdown) is never held.
//
// # Renewals at scale
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
