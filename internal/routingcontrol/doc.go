// Package routingcontrol reads the out-of-band region routing controls of
// ADR-14: for each region, On or Off, in the style of Route 53
// Application Recovery Controller's routing controls. The signal that
// declares a region unhealthy is never derived from muster's registry or
// from a peer's reachability: an operator (or a separately deployed
// readiness system) writes it somewhere muster can only read, and muster
// reads it.
//
// A Source (a file, an HTTPS endpoint or a DNS TXT record) returns the
// controls it holds; Controls, a worker, reads it every interval and
// keeps the last good reading. The rules:
//
//   - Fail static. A source that cannot be read, answers malformed
//     controls or is slow leaves the last good controls in force; after
//     StaleAfter without a good read the state is stale
//     (muster_routing_control_stale, alarm routing_control_stale). A
//     missing signal never turns a region off.
//   - A region the source does not name is On.
//   - Safety rule (ARC's "at least one routing control On"): a reading in
//     which no known region would be On (the regions it names and those
//     configured, this muster's own among them) is taken for a mistake:
//     the previous controls stay in force and routing_control_all_off is
//     raised until a reading leaves a region On.
//   - Every change of a region's control is logged, counted and written to
//     the audit log as a system action (actor system:routing-control).
//
// This slice only reads and exposes the controls (On, OnChange, Status,
// GET /v1/routing-controls). Moving clients to fallback regions, and the
// capped return through the shift-backs of ADR-13, come next.
package routingcontrol
