// Package tgsync keeps load-balancer target groups (AWS ELBv2 target
// groups, and HAProxy backends through their Runtime API) in step with
// muster's views: `muster tgsync`.
//
// # Design notes
//
// The desired set of a binding is exactly what the resolver routes to:
// resolver.Snapshot.Targets of the snapshot a resolver.Client routes on
// (eligible, degraded and health-unknown endpoints, every endpoint of a
// zone whose guard tripped, drained zones out unless every zone is
// drained). tgsync never restates those rules, so a target group and a Go
// client of the same service cannot disagree. The snapshot is the one the
// client guards chose: while the resolver holds back an empty or >50%
// shrink (Result.Hold), tgsync keeps the larger set too, meters it
// (muster_tgsync_held) and logs it; it follows the smaller set when the
// resolver does (after the confirm time, Config.Muster.ConfirmAfter).
//
// On top of the resolver's guard, the reconcile core (Plan, pure, no I/O)
// adds the target group's own:
//   - it never empties a group: an empty desired set deregisters nothing;
//   - deregistrations are capped per interval (default 10% of the group,
//     at least 1), so a bad view that got past the client guards drains a
//     group gradually while muster_tgsync_pending_deregistrations says so.
//     Targets whose instances the registry no longer lists (the view no
//     longer carries them, and the view's registered counts are that much
//     lower than the group) are not capped: a scale-down from 10 to 4 is
//     followed at once, as the resolver follows it;
//   - additions honour slow start: HAProxy gets muster's published weight
//     (which ramps, ADR-12) times the zone's traffic weight; an ELBv2
//     group with slow_start.duration_seconds ramps by itself, and one
//     without gets additions in steps (default a quarter of the group per
//     interval, at least 1; an empty group takes them all);
//   - targets in the group that are not muster's (not an endpoint of the
//     view, never registered by tgsync) are reported
//     (muster_tgsync_unmanaged_targets, a log line) and left alone, unless
//     the binding owns the group (own_group, --own-group).
//
// Reconciliation is level-triggered: on every view change the resolver
// reports and every interval (default 30 s), each binding takes the
// group's state from the backend (`show servers state` every cycle;
// DescribeTargetHealth at most once per interval, Bound.ReadEvery, with
// the cycles in between planning against the state last read plus
// tgsync's own changes), plans, and applies the difference. A failed call loses
// nothing: the desired set is recomputed from the view each cycle, and a
// failed cycle is tried again after a jittered backoff. AWS throttling and
// transient errors are retried by the SDK's standard retryer (jittered
// exponential backoff).
//
// The ELBv2 stand-in used by the tests (package tgsync/elbv2standin) is
// a stand-in for AWS, which cannot run here; the SDK, its retryer and its
// SigV4 signing are the real ones. HAProxy tests run Debian's haproxy.
package tgsync
