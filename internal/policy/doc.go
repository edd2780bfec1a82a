// Package policy admits operators' overrides and deregistrations and
// rate-limits policy writes per actor (ADR-15, ADR-08).
// Marking an instance ineligible by hand, or ending it, is an authorised
// denial-of-service mechanism, so it is treated as one: every attempt is
// authorised, counted, justified, budget-checked and audited, and every
// override expires.
//
// # Checks, in order
//
// Service.Create runs, and the first refusal wins:
//
//  1. authentication (the HTTP layer; nothing is audited before it);
//  2. authorisation: the owning team's operator role (operator or tool
//     identity), or admin;
//  3. the per-actor, per-service rate limit (default 5 per 10 minutes):
//     every attempt that passed authorisation counts, whether a later
//     check accepts or refuses it;
//  4. a justification of real length (at least MinJustificationLength
//     characters that are not spaces, at least three distinct characters,
//     at most MaxJustificationLength) and an expiry no longer than
//     MaxExpiry (default 24 h; omitted: DefaultExpiry, 1 h);
//  5. for mark_ineligible only, the disruption budget (below).
//
// A request that names no instance or no known action is refused first
// (check "request"), an unknown instance next ("instance"), and an
// instance that already has an override in force, or has ended, after
// check 4 ("state"). Every attempt after authentication, accepted or
// refused, is one audit row (action override.create, override.cosign,
// override.lift; override.expire for the sweep) whose after holds the
// deciding check, the checks passed, the check's figures, the request and
// the override. A refusal's audit row, the counted attempt and, for a
// budget refusal, the pending override commit in one transaction; an
// acceptance's row commits with the override. An error that is no
// decision (the database gone, the evaluator still rebuilding: 503)
// changes and audits nothing.
//
// # The rate limiter
//
// The counters live in PostgreSQL so that several replicas share them: a
// sliding log (rate_limit_attempts, one row per counted attempt, keyed by
// actor and scope) read and written inside the transaction that makes the
// decision, serialised per key with pg_advisory_xact_lock on a hash of the
// key. A sliding log is exact (no fixed-window boundary burst), and the
// quotas are small, so its size is no concern; rows are pruned per key on
// use and globally by the sweep. An attempt refused by the limit is not
// counted, so a client that keeps retrying does not push its own reset
// away. Scopes: "override:<service>" for overrides and co-signatures, and
// "policy:contracts", "policy:grants", "policy:probers", "policy:leases",
// "policy:lifts" (lifting overrides) and "policy:shifts" (shift-back
// operations) for the policy writes (LimitWrite, default 60 per minute per actor and family, counted
// for every authenticated write attempt before the registry decides:
// that limit is there to stop a runaway script churning the estate). The
// server sends RateLimit-Limit, -Remaining, -Reset and -Policy ("5;w=600")
// and, on 429, Retry-After.
//
// The hot paths (reports, registrations, lease renewals, failed
// authentication) are limited in process instead, with Buckets: token
// buckets per key whose Decisions the server sends the same way. A
// PostgreSQL round trip per report batch would cost more than the work it
// guards, and those limits need not hold exactly across replicas.
//
// # The disruption budget
//
// The budget is computed from the evaluator's current verdicts on this
// replica with the overrides in force (read from the database under a
// per-service advisory lock, so two replicas cannot spend the same
// headroom at once) applied, and with the registry's own state of those
// instances read under the same lock: one deregistered or replaced a
// moment ago, which the evaluator still holds until its next refresh, is
// gone, and one whose lease the reaper just ended is out of rotation. An instance counts as eligible when its own
// verdict is eligible or degraded and it is not quarantined, unless an
// override says otherwise. Unknown does not count: silence is not failure
// (ADR-05), so unknown instances stay in rotation, but it is no evidence
// of health either, and the budget must not spend capacity nobody has seen
// serve. Removing an instance that does not count spends no budget.
//
// Applied now, the override must leave the target's zone at least
// required(total) eligible instances, the fewest n with n/total >=
// min_healthy_fraction: ceil(min × total), decided with the same
// comparison as the assembler's guard so the two never disagree. The
// refusal states the numbers: "would leave 2 of 6 eligible in zone az1;
// the contract requires 3". And it must never remove the last eligible
// instance of the service in the region (ADR-08's incident-grade case).
//
// # Co-signed break-glass
//
// A budget refusal stores the attempt as pending_cosign for CosignWindow
// (default 5 min). Service.Cosign by a different identity with the same
// authority applies it: the asker cannot co-sign (self-cosign), the
// co-signer passes authorisation, its own rate limit (same scope) and its
// own justification, and both identities and justifications are audited.
// This is ADR-15's "overridable with a second authoriser rather than
// removed". The last-instance rule is not part of what a co-signer may
// exceed: "never" is kept literally, and such a refusal is not stored for
// co-signing (restore capacity, or deregister the instance, instead).
//
// # Deregistration
//
// Deregistering an instance removes its capacity for good, so anyone but
// the instance itself doing it is an override: Service.Deregister runs
// Create's checks in Create's order (authorisation: the owning team's
// operator role or admin, so a sibling workload is refused; the same
// per-actor rate limit scope "override:<service>"; a justification; the
// disruption budget) and audits every attempt as instance.deregister. The
// budget is mark_ineligible's (overrideBudget): the target counts as
// leaving rotation in its zone as the zone stands. Counting it as leaving
// the zone's capacity too (what the guard sees once it is gone) would
// never refuse anything in a fully healthy zone, n-1 of n-1 being still
// all of it, and an operator could drain a zone one instance at a time.
// Within budget the instance is ended and the decision kept as an
// override (action deregister, state applied); a budget refusal waits as
// pending_cosign and Cosign ends the instance; the last instance in
// rotation is refused outright. A deregistration is never active, so the
// evaluator and the assembler never see one.
//
// The instance itself shutting down is not an override and stays
// immediate: a workload of the instance's service proved to hold the
// instance's address, by the proof registration asks
// (registry.HoldsAddress: the request's TCP source, or the token's
// muster_addresses). Its deregistration is audited as the registry always
// audited it. Address proof is by IP: another process on the same host
// with the same service identity is, to muster, the instance.
//
// # Overrides and the fraction guard (ADR-08, ADR-15)
//
// An override is applied by the assembler before the guard, as its input
// (assembler.InstanceInput.Override); the evaluator's own verdict is never
// changed and stays visible. Decision: the guard disregards health, and an
// override is not health but an authorised, audited human decision, so
//
//   - a mark_ineligible instance counts as out of rotation in its zone's
//     fraction (the zone status and the fraction_guard alarm tell the
//     truth), and is published at weight 0, state ineligible, with the
//     override's reason: no client routes to it, and a tripped guard never
//     restores it. The guard still restores instances removed by health;
//   - a mark_eligible instance counts as in rotation and is published as
//     eligible (weight 1 when its own verdict had it out).
//
// So a co-signed override that takes a zone below its fraction does what
// two people decided: the instance stays out, the zone is reported
// tripped and the fraction_guard alarm opens (a declared breach, never a
// silent one), and the guard republishes the zone's health-removed
// instances as it would for any breach. A single operator cannot get
// there: the budget refuses, and the guard only ever sees overrides that
// were within budget when admitted or that a second identity co-signed.
//
// # Propagation and expiry
//
// Every replica holds one copy of the overrides in force (InForce), and
// the rest of muster reads them only there: the views take them from it
// directly (Applied: the evaluator's verdicts with the overrides applied
// is the assembler's input, for the publisher and the drain budget), and
// the evaluator reads it for the eligibility it shows. InForce re-reads
// policy's table every second by default (so each replica learns of
// overrides written by any other) and tells the publisher which services'
// overrides changed. On the replica that wrote one, the Service refreshes
// the copy after the commit and before it answers, so the next view there
// carries it. While PostgreSQL is away the copy stands. Overrides always
// expire: expiry is evaluated at the time of use with the injected clock
// (InForce drops an override at its expires_at on its next tick, or when
// the publisher next asks what changed, and the service is re-published;
// reads report it expired), and the Sweeper
// writes expirations down and audits them as system:policy.
package policy
