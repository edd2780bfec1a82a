// Package forward mirrors the health evidence a replica accepts to every
// other live replica of its region.
//
// Several replicas share one PostgreSQL, and each service has one owner
// replica, which alone publishes its views. Registrations and lease
// renewals already reach every replica through PostgreSQL; health reports
// do not: they are in-memory evidence, and they land on whichever replica
// the reporter's connection hits. So the replica that receives a batch
// authenticates, rate-limits and ingests it as before, and then offers the
// items it accepted (never those it refused) to the Forwarder, which sends
// them to every other live replica with POST /v1/peer/reports, signed as
// this replica with the region's key (internal/peer). Every replica's
// evaluator thus holds the region's evidence: the owner decides on all of
// it, and a replica that becomes an owner after a failover already holds
// current windows instead of starting cold.
//
// Mirroring to every peer rather than to the owner alone costs N-1 sends
// per batch (a region runs a handful of replicas), and buys two things: no
// routing on ownership that may be changing under the sender (a batch sent
// to the old owner during a move would be lost to the new one), and warm
// standbys.
//
// What travels is the actor (the principal the receiving replica
// authenticated, without its token or addresses) and the reports, each
// stamped with the time it was received when it carried none, so a peer
// reached late places it when it happened. The proofs only the receiving
// replica could make (the TCP source address of a self-report and the
// instance credential it presented) are not repeated by the peer
// (evaluator.IngestForwarded); bearer tokens and instance credentials are
// never forwarded.
//
// Offer never blocks the request that accepted the evidence: it appends to
// one bounded queue per peer (QueueLimit items, 100,000 by default; beyond
// it the oldest are dropped and counted in
// muster_evidence_forward_dropped_total) and wakes the peer's sender. A
// sender coalesces for up to BatchWait (50 ms) or MaxBatch items, sends,
// and on failure puts the batch back at the head of its queue and retries
// with capped exponential backoff, so a peer that was down receives the
// queue when it is back (evidence older than the evaluator's five minutes
// is then refused there as stale, which is right). A peer no longer listed
// as live is forgotten with its queue. At Stop each sender makes one last
// attempt, within FlushTimeout, to deliver what it holds. A request a peer
// refuses whole (400, 413, 415, 422: a peer of another release, say) is
// sent again when that can help, and what cannot go is counted by reason
// and alarmed, never dropped silently (refused.go).
//
// Times travel on the sender's clock and are moved onto the receiver's by
// the request's signing time (ToLocalClock), so skew between replicas
// neither refuses evidence as "in the future" nor ages it. The receiver
// answers which items it refused and why (Result.Refusals): those a retry
// may fix (evaluator.Retryable) are sent again RetryRefused times; the
// rest, and whole bodies refused, are counted by peer and reason in
// muster_evidence_forward_refused_total, never as forwarded, and raise
// evidence_refused (Alarms) while they occur.
//
// Evidence is lossy by contract (ADR-02): a dropped or undelivered item
// costs the peer confidence, not correctness, and the receiving replica's
// observed windows in PostgreSQL still carry it for any rebuild.
package forward
