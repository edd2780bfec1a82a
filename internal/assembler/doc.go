// Package assembler is muster's pure view-assembly core (ADR-08, 11, 16):
// it turns each service's instance verdicts into a versioned routing view,
// applies the minimum-healthy-fraction guard per zone, raises the guard and
// last-instance alarms, and queues the difference against what was last
// published as deltas on two queues with different batching windows. It
// imports nothing from muster but eligibility's State, does no I/O, starts
// no goroutines and never reads the clock: every time is passed in, and
// versions come from an injected VersionSource. It is not safe for
// concurrent use; the caller serialises.
//
// # Flow
//
// Update(service input, now) computes the service's candidate set through
// the guard and queues, per endpoint, the difference against the published
// set. Drain(now, versions) publishes what is due, reserving one version
// per published service at that moment, so versions are assigned when a
// delta is sent, never when a change was queued. NextDue says when to call
// Drain next. Alarms are raised and cleared by Update (and RemoveService),
// on the candidate set, not on what has been published yet.
//
// # The guard (ADR-08)
//
// Routable means in rotation by the instance's own verdict: eligible,
// degraded or unknown, and not quarantined (silence is not failure, so
// unknown stays in rotation and keeps its weight); an override decides
// outright. The guard counts capacity that was there: its denominator
// (Counted) is every instance except those awaiting their first success
// (InstanceInput.Awaiting: a new instance of a service with a readiness
// signal that has never been in rotation). For each zone of a service, if
// routable/counted < the service's MinHealthyFraction the zone is
// tripped: every counted instance of the zone is published, out-of-rotation
// and quarantined ones included (quarantine never drains a service), the
// zone status says "tripped" and a fraction_guard alarm is open for
// (service, zone) until the zone untrips or disappears. An instance
// awaiting its first success is never published by a tripped guard: it
// never served, so publishing it would send traffic to something that may
// not even listen yet. So a surge deploy (2 ready + 3 new) trips nothing,
// and a brand-new service or zone (nothing admitted) is published with
// nothing routable and raises no alarm. Zones are independent. Capacity,
// Routable, Counted and Tripped export the rule; the override budget and
// the drain budget (package policy) count through them, so the three never
// disagree. Decisions:
//
//   - An endpoint always shows its own verdict: a published instance out of
//     rotation has state "ineligible" (a quarantined one also carries
//     quarantined: true), whatever weight it is published at.
//   - Out-of-rotation endpoints in a tripped zone are published at weight
//     TrippedWeight (1), after a slow start (see below). The guard
//     disregards health, so each gets the share of a fully ramped instance; this keeps the view a pure function of the
//     input (no memory of a last in-rotation weight, which a never-admitted
//     instance would not have) and spreads load evenly instead of piling it
//     on the few routable instances.
//   - A fraction outside (0,1] (0, negative, NaN) is replaced by 0.5 and one
//     above 1 is clamped to 1: the guard cannot be switched off by input,
//     mirroring the registry's validation.
//   - The comparison is a correctly rounded division, so a fraction met
//     exactly (5 of 10 at 0.5) does not trip.
//   - ZoneStatus.Eligible counts routable instances; Total counts the
//     zone's capacity (Counted); Registered counts the instances the
//     registry lists in the zone (every input but lease-expired ones), so
//     a client can tell a set the registry shrank (scale-down,
//     decommission: Registered falls with it) from one verdicts shrank.
//   - A verdict State outside the known values is read as unknown (no
//     evidence of failure); a weight that is negative, NaN or infinite is
//     published as 0. Weights are otherwise passed through.
//
// # Slow start for what the assembler puts into rotation (ADR-12)
//
// The evaluation core ramps an instance that enters rotation by its own
// verdict. Two ways into rotation bypass it: a tripped guard publishing an
// out-of-rotation instance, and a mark_eligible override forcing one in.
// For those the assembler runs the same ramp from the contract's
// ServiceInput.SlowStart: TrippedWeight × max(1, ⌊10·t/SlowStart⌋)/10,
// starting when the endpoint enters rotation (it was not served at a
// positive weight by the previous Update), full weight at SlowStart. An
// endpoint already serving when its zone trips keeps its weight. The
// steps are time-driven: NextDue includes the next step of any ramp, and
// Drain advances due ramps (queued as additions) before publishing. A
// restored view's endpoints count as serving, so a restart does not
// restart their ramps.
//
// # Traffic weight (ADR-13)
//
// Each zone status carries the zone's traffic weight from
// ServiceInput.Traffic: 1 normally, 0 while a shift drains the zone, a
// capped step while traffic returns. It is topology preference, not health:
// endpoints are published unchanged and the guard ignores it. A change
// travels as a zone-status change; a decrease of a published zone's weight
// (a drain, which takes capacity away) travels on the withdrawal queue and
// marks the delta Withdrawal, so a drain is never held back by shedding; an
// increase (traffic returning) travels on the addition window.
//
// # Overrides (ADR-15)
//
// An InstanceInput may carry an operator's Override, applied before the
// guard (see package policy for the decision and its reasons). With
// mark_ineligible the instance is not routable: it counts in its zone's
// total but not as routable, and it is published at weight 0, state
// "ineligible", with Endpoint.Override giving the reason; a tripped guard
// never restores it (the guard disregards health, and an override is an
// audited decision, not health). With mark_eligible it is routable and
// published as "eligible" (weight TrippedWeight when its own verdict had
// it out). The override is not part of the checksum.
//
// # Lease expiry
//
// An instance whose lease ran out (InstanceInput.LeaseExpired) goes through
// the same guard as a verdict: it is never routable (not even under a
// mark_eligible override: there is nothing there to force in), counts in
// its zone's total, and is published only while the zone is tripped, at
// TrippedWeight with state "ineligible" and Endpoint.LeaseExpired set. So
// an expiry leaves the view only as far as the zone's minimum healthy
// fraction allows; the rest stay, marked, until the guard clears (the
// evaluator then stops listing them; see its package documentation).
// Deregistration is not held: a deregistered instance is simply absent
// from the input. Routable and Tripped export the guard's rule for callers
// that must ask whether the guard would still need an instance.
//
// # Last instance
//
// A last_instance alarm opens when a service that had a routable instance
// (since it was first seen or the alarm last cleared) has none left in the
// region, all zones together, whether by verdicts or because the instances
// left the registry. It clears when the service has a routable instance
// again, or on RemoveService. A service that never had a routable instance
// (a new deploy whose instances await readiness) raises none. A restored
// service (see Restart) had one if the view clients hold shows an endpoint
// in rotation, so a restart does not forget that clients had capacity; an
// assembler started without a restored view while a service is fully down
// raises none until it recovers and falls again, though every zone's guard
// alarm does. The
// last instance is kept published: with no routable instance every zone is
// tripped (0 < fraction), so the full set stays in the view. Only instances
// the registry no longer lists leave the view; the alarm still fires.
//
// # Queues (ADR-11)
//
// Each endpoint change is queued on one of two queues per service:
//
//   - withdrawal: the endpoint leaves the published set, or its weight
//     goes from above 0 to 0;
//   - addition: a new endpoint, a re-entry, a weight increase, and every
//     other change (a weight decrease above 0, a state or health change, a
//     tripped zone's endpoints showing ineligible).
//
// A zone-status change without an endpoint change travels on the addition
// queue; zone statuses are carried by every version of the service, so
// they also ride along with withdrawals. A change keeps its place while it
// is replaced by a newer change of the same class and restarts its window
// when it moves between queues; a change undone before it was sent is
// dropped.
//
// The withdrawal window (WithdrawalWindow, 50 ms) batches withdrawals under
// load; it does not delay the first one. Per service: a withdrawal that
// finds the service's withdrawal queue idle (no version carrying its
// withdrawals was published in the window before it was queued) is due at
// once, the leading edge, and Drain publishes it; withdrawals queued within
// the window after a withdrawal version are due at that window's end and
// go out together. So a service gets at most one withdrawal version per
// window, and no withdrawal waits longer than the window: a lone failure
// costs no batching delay, and an evacuation still batches (1,000
// withdrawals of a service in a second are about 20 versions, not 1,000).
// The unit is the service because a delta and its version are per
// service; a region-wide idle test would almost never pass (steady-state
// churn, 2,500 changes a minute, is one every 24 ms, inside the window) and
// would make one service's failure wait on another's. Its additions are published together once the oldest
// has waited the current addition window. A withdrawal-only version never
// waits for, or carries, the service's queued additions, with one
// exception: if publishing the withdrawals alone would leave a zone the
// view already shows short (fewer endpoints at weight > 0 than the guard's
// set for the zone, and either none at all or below the minimum healthy
// fraction of the zone), that zone's queued additions go with them. Without
// it a rolling replacement under a grown addition window would publish an
// empty zone for up to 30 s, which is the outage the guard exists to
// prevent. A service's first version (and a zone the view does not show
// yet) travels on the addition window.
//
// Within one Drain, services carrying a withdrawal get the lower versions
// and come first in the result.
//
// # Shedding
//
// Every endpoint change entering the queues (both kinds; including changes
// that undo a queued one) counts toward the region's change rate, except a
// service's initial population before its first version: nobody can be
// subscribed to it yet, and a rebuild of the whole region must not start
// by shedding. At the
// end of each epoch (one current addition window long) the count is
// compared with ChangeBudgetPerSecond × window: above it the addition
// window doubles, up to MaxAdditionWindow; at or below half of it the window
// halves back towards AdditionWindow; in between it holds. Leaving the base
// window starts a shed episode (Stats.ShedEpisodes, Shedding()), returning
// to it ends the episode. Queued additions are due by the current window,
// so a grown window also delays those already queued. NextDue reads the
// window as it stands; Drain first closes any finished epoch, which may grow
// the window and postpone an addition NextDue reported as due. Withdrawals are never
// shed: their window is fixed and no addition is ever published ahead of,
// or instead of, a due withdrawal.
//
// # Versions and deltas
//
// Drain reserves all the versions it needs with one VersionSource.Next call
// after deciding what to publish and before changing anything. If Next
// fails, or returns a version not above the last one published or restored
// (ErrVersionNotFresh), Drain returns the error, publishes nothing and
// leaves every change queued; the reserved versions, if any, are simply
// never used. Versions are therefore strictly increasing per service and
// across services.
//
// The source muster publishes with is Versions: version = epoch<<32 |
// counter. The epoch is taken from PostgreSQL (the publisher_epochs
// sequence, migration 000008) once, before a publisher publishes anything;
// the counter is local, so taking a version is an increment under the
// publisher's lock, with no I/O, and publication goes on for as long as
// PostgreSQL is away. The rules that keep versions increasing per service:
//
//   - Restart: a restarted process takes a fresh epoch, and sequence values
//     are never handed out twice, so its first version (new epoch << 32) is
//     above every version of every earlier epoch, whatever those processes
//     published. Nothing is read back to find "the last version": a
//     crash that lost the tail of what was persisted cannot make versions
//     go back.
//   - Clock: no clock is read. A wall clock stepped backwards (NTP, a VM
//     restored from a snapshot) changes nothing, unlike a scheme seeded
//     from timestamps.
//   - Ownership: when (in a later step) one replica at a time publishes a
//     service and ownership moves, the new owner takes a fresh epoch when
//     it acquires ownership. That epoch is above every epoch taken before,
//     the previous owner's current and prefetched ones included, so a
//     client that follows the service from one replica to the other never
//     sees its version go back. (Fencing the old owner, so it stops
//     publishing once it has lost ownership, is that step's business; today
//     every replica publishes every service under its own epoch, and a
//     client that switches replicas may get a full view at a lower version.)
//   - Counter overflow: a 32-bit counter is 4.3 billion versions, 70 days
//     at a sustained 700 versions a second. When more than half of it is
//     used (Versions.WantEpoch) the publisher takes the next epoch in the
//     background, off its lock, and hands it in (AddEpoch); Next moves to
//     it when the counter has no room left. Only if that prefetch has
//     failed for the whole second half of an epoch does Next fail
//     (ErrEpochUsedUp), and then the changes stay queued as above.
//   - Exactness: epochs stop at MaxEpoch (2^21-1, also the sequence's
//     MAXVALUE), so versions stay below 2^53 and every JSON client, in any
//     language, reads them exactly. Two million epochs is a restart a
//     minute for four years.
//   - Before epochs: migration 000008 sets the first epoch above the last
//     block the old view_versions sequence handed out, so views published
//     before the change compare below those after it.
//
// Versions are not dense: an unused tail of an epoch, or versions reserved
// by a failed Drain, are skipped. Clients compare versions; they never
// count them.
//
// A Delta carries the changed endpoints in full (Upserts), the ids that
// left (Removals), the zones whose status changed (Zones) or that
// disappeared (RemovedZones), the new checksum and FromVersion/Version.
// Applying it to the view at FromVersion yields exactly the view at
// Version. A service's first version has no Delta; a subscriber starts
// from the View. (A restored service's first version in a process has
// one, from the restored version; see Restart.)
//
// Views and deltas are immutable once published and carry their JSON
// encoding, computed once (View.Encoded, Delta.Encoded, and the same bytes
// in Published), so the streaming tier can share them across subscribers.
// Each endpoint's encoding is kept from the version that changed it and
// spliced into the next view's, byte-identical to encoding/json.
//
// # Restart
//
// Restore seeds a service with the view an earlier process published (the
// publisher persists each service's last view and restores them all before
// it publishes anything). The restored view is the published state: the
// first Update queues only the difference against it, last_instance fires
// if the view had an instance in rotation (an endpoint not showing
// ineligible) and the first Update has none, and the next Delta has
// FromVersion = the restored version, so a client resuming from it applies
// the delta. An instance of the restored view that the first Update does
// not list is withdrawn like any instance that left.
//
// The first Update after Restore always publishes a version, even when
// nothing changed: the streaming tier holds only what this process
// published, and a subscriber must get a view of every service. Its Delta
// then carries no endpoint, only the zone statuses that differ, and its
// checksum is the restored one; it travels on the addition window (or with
// a due withdrawal), like any service's first version in a process. The
// first Update's endpoint changes count toward the change rate (see
// Shedding): unlike a new service's initial population, clients see them.
//
// A restored service that is never updated (nor removed) is held, and View
// reports it, but nothing of it is published.
//
// A restored view may be older than what some clients hold (the last
// persist was lost in a crash) or come from another replica; such a client
// cannot apply the next Delta (its FromVersion is not the client's version)
// and takes the full View, which is above anything it holds (see Versions).
//
// # Checksum
//
// The checksum covers the endpoint set only (not zone statuses or
// versions): the sum modulo 2^256 of the SHA-256 digests of each
// endpoint's canonical, length-prefixed encoding (see Checksum). A sum is
// order-independent and incremental: a client checks a delta by adjusting
// the previous sum for the endpoints it touches, so a 10-endpoint delta
// costs ten hashes, not a pass over the view, and on a mismatch it asks
// for a full view.
//
// # Signature
//
// With Options.Sign (the region's key, as the publisher configures it) each
// version is signed once, as it is encoded, over the domain
// SignatureDomain and the service, the version, the checksum, ZonesDigest
// of the zone statuses (the guard's decisions and traffic weights, which
// steer traffic and are not in the checksum) and the signing replica's id
// (SignedMessage). The signature travels in the view and, unchanged, in
// the delta that produces it, so no subscriber or peer costs a signature
// and a delta verifies against the view it leads to. A verifier
// (VerifyView; the relay; the resolver with the region's keys) recomputes
// the checksum and the digest and never trusts the fields. Restore keeps
// the restored view's signature: it is its previous owner's.
//
// # Removing a service
//
// RemoveService drops the service's queued additions, queues the
// withdrawal of every published endpoint and clears its alarms; the
// emptied view is published on the withdrawal queue (at once if it is
// idle), after which the
// service is forgotten (View reports false). A service never published is
// forgotten at once. An Update of the same name revives it.
//
// # Inputs
//
// An Update lists every instance of the service; one left out is gone. If
// an id appears twice, the last entry wins. Capabilities are sorted and
// deduplicated, and shared by every endpoint of the service. Withdrawal lag
// (Published.WithdrawalLags) is the Drain time minus the FirstFailureAt the
// input last carried for a withdrawn endpoint.
package assembler
