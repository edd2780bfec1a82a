// Package forward takes the health evidence a replica accepts to the
// replica of its region that evaluates it: each service's owner.
//
// Several replicas share one PostgreSQL, and each service has one owner
// replica, which alone publishes its views. Registrations and lease
// renewals already reach every replica through PostgreSQL; health reports
// do not: they are in-memory evidence, and they land on whichever replica
// the reporter's connection hits. So the replica that receives a batch
// authenticates, rate-limits and attributes it as before (the reporter's
// answer says what was accepted), keeps in its own evaluator only what is
// about services it owns (evaluator.Config.Evaluates),
// and offers every item it accepted (never one it refused) to the
// Forwarder with its service. The Forwarder sends each item, with POST
// /v1/peer/reports signed as this replica with the region's key
// (internal/peer), to the replicas its shard routes to other than this
// one (Config.Route, ownership.Manager.EvidenceRoute):
//
//   - the shard's owner, and the replica the shard is offered to while a
//     move is under way. So each sample is sent at most once (twice during
//     a move) whatever the number of replicas, and evaluated by one; every
//     other replica keeps its state of the service warm from the windows
//     the owner writes to PostgreSQL (evaluator.Config.FollowEvery). A
//     region's evidence capacity grows with its replicas instead of every
//     replica paying for all of it.
//   - a shard with no live owner (free, or held by a replica that
//     stopped heartbeating) routes to every live replica until one takes
//     it: any of them may be dealt it.
//
// Routing follows a reading that may be a round (2 s) old while ownership
// moves. The rule that keeps a move from losing evidence: a move is an
// offer first, and the replica offered a shard is a destination, so from
// the offer until the sender reads the new owner, evidence goes to both
// the old owner and the new one. A replica that becomes a shard's
// destination (offered it, or every replica when the owner
// died; this replica itself included, through Config.Local) is sent the
// evidence of that shard accepted here within Config.Replay (30 s, and at
// most QueueLimit items), so a new owner decides on current windows, not
// only on those the old owner wrote to PostgreSQL. What was queued for a
// replica that stops being live is not dropped when those replays carry
// it, and is otherwise sent to the shard's current destinations that did
// not have it (muster_evidence_forward_rerouted_total).
//
// The body is compact (BinaryContentType, binary.go) for peers that take
// it, JSON for one that answers it 415 (the release before). What
// travels is the actor (the principal the receiving replica
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
// it the oldest are dropped, counted in
// muster_evidence_forward_dropped_total and alarmed, evidence_dropped) and
// wakes the peer's sender. Hard failures go to a queue of their own, sent
// at once and ahead of everything else (behind at most the one request in
// flight), so a withdrawal never waits behind bulk successes. A sender
// coalesces for up to BatchWait (50 ms) or MaxBatch items, sends,
// and on failure puts the batch back at the head of its queue and retries
// with capped exponential backoff, so a peer that was down receives the
// queue when it is back (evidence older than the evaluator's five minutes
// is then refused there as stale, which is right). A peer no longer listed
// as live is forgotten; its queue goes elsewhere as above. At Stop each sender makes one last
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
// costs the peer confidence, not correctness; the owner's observed
// windows in PostgreSQL carry what reached it for any rebuild.
package forward
