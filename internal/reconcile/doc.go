// Package reconcile derives instance existence from the authorities that
// already know it (ADR-03): Kubernetes EndpointSlices and
// inventory snapshots. Self-registration stays for runtimes nothing
// watches.
//
// Every source has one shape (Source): a full desired set on each Read.
// KubernetesSource reads client-go shared informers' caches over
// EndpointSlices and Services; SnapshotSource reads a JSON or CSV file or
// an HTTPS URL. One Worker per source runs passes (every Every, and on the
// source's Changed): Read, Decide, apply through the registry
// (registry.ApplyReconcile: instances with source k8s/<cluster> or
// snapshot/<name>, ids derived from the pod UID or snapshot id with
// registry.ReconciledID, no lease, every change audited), and hand the
// endpoints' conditions to the evaluator as readiness evidence
// (evaluator.ObserveReadiness).
//
// Membership is authorised where it enters: before Decide, a
// pass keeps only the endpoints their services take from where they came
// (Authorise: a service's sealed member sources, registry.MemberAuthorities,
// or, for a service naming none, what the source's configuration vouches
// for, Endpoint.Vouched). An unauthorised endpoint adds nothing and
// replaces nothing; one already an instance is kept (authorisation never
// ends capacity); each claim is alarmed (reconcile_unauthorised) and
// counted (muster_reconcile_unauthorised). A created endpoint at a live
// instance's address ends it only within the disruption budget
// (registry.ReplaceGate, policy.Service.MayReplace); over budget it waits,
// audited once and alarmed (reconcile_replace_refused).
//
// Decide and DiffOf are the pure core: functions of (reading, registry,
// hold, confirmation, now), no I/O. An endpoint becomes an instance when it
// is first ready or serving; it stays one while the source reports it
// (readiness is evidence, not existence); it ends when the source reports
// it terminating and not serving (KEP-1669: serving while terminating
// stays routable), or stops reporting it. Absences pass the one removal rule
// (package disbelief; Disbelief: more than 20% of the source's
// instances, or of one service's, at least 3, or a reading with no
// endpoints at all, are held until the source reports them again or an
// admin or the owning team's operator confirms them; no timer releases
// them; Reconciler.Holds, alarm removal_held). A confirmation is scoped
// (Reconciler.Confirm): one service's releases that service's held
// absences only, the source's every one; Decide releases a hold service
// by service, from every confirmation given since it began
// (VouchedSince), on every replica alike. A failed read changes
// nothing (fail-static), and a Kubernetes source whose watch is lost keeps
// its cache and says so (reconcile_stale).
//
// The Reconciler holds the workers and what spans them: the diff (missing,
// leak, mismatch, held), alarms and confirmations. FileConfig is the file
// `muster serve --reconcile-config` reads, sources and platform issuers
// (identity.ClaimMapping) together.
//
// Several replicas each run every source. Their passes of one source
// apply one at a time (registry.ApplyReconcile takes an advisory lock on
// the source for its transaction), and each reads what the one before
// wrote, so the second of two passes at once finds the instances made and
// skips them: an id is inserted and audited once, an end applies to an
// active row only. Leader election is not done: each replica still reads
// the source and decides.
package reconcile
