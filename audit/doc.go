// Package audit is muster's append-only, hash-chained audit log (ADR-02, 15).
//
// Every policy change and every refused privileged attempt becomes one row of
// audit_events. Rows are numbered by a gap-free seq and each carries
// prev_hash (the hash of the row before it, 32 zero bytes for the first) and
// hash, the SHA-256 of its own content and prev_hash. The digest is computed
// by one SQL function, audit_event_digest, which the insert trigger and
// Verify both call, so the canonical form is defined exactly once.
//
// Appends are serialised by a transaction-scoped advisory lock taken in its
// own statement before the head of the chain is read: in READ COMMITTED each
// statement takes a fresh snapshot, so the head read after the lock sees every
// append committed while this transaction waited. Because the lock is held
// until commit, an append made inside a business transaction (the normal case:
// the change and its audit row commit or roll back together) serialises policy
// writes; they are rare enough for that to be the right trade.
//
// UPDATE, DELETE and TRUNCATE are refused by triggers. Someone who can disable
// triggers can still rewrite rows, which Verify detects as a digest or link
// mismatch; rewriting the whole tail consistently is only detectable against
// a head hash kept elsewhere (Head returns it for export).
package audit
