// Package audit is muster's append-only, hash-chained audit log (ADR-02, 15),
// anchored outside the database by signed checkpoints.
//
// # Rows and their hashes
//
// Every policy change and every refused privileged attempt becomes one row of
// audit_events. Rows are numbered by a gap-free seq and each carries
// prev_hash (the hash of the row before it, 32 zero bytes for the first) and
// hash, the SHA-256 of the row's canonical form:
//
//	[SEQ, MICROS, ACTOR_KIND, ACTOR, ACTION, TARGET_KIND, TARGET, OUTCOME, REASON, BEFORE, AFTER, PREV]
//
// written as JSON exactly the way PostgreSQL writes the text of a jsonb
// array: elements separated by ", " (comma, space); SEQ and MICROS (at as
// microseconds since the Unix epoch, UTC; negative before 1970) as decimal
// integers; the seven text columns as JSON strings escaped as PostgreSQL's
// escape_json does (\" and \\, \b \f \n \r \t, \u00xx in lower-case hex for
// the other bytes below 0x20, everything else, non-ASCII included, as is);
// BEFORE and AFTER as PostgreSQL's own text of the stored jsonb (keys in
// jsonb's order, ": " and ", " separators), or null; PREV as a JSON string of
// prev_hash in lower-case hex. The form is UTF-8; there is no trailing
// newline.
//
// It is written down twice, on purpose: the insert trigger seals each row
// with the SQL function audit_event_digest (000001), and Row.Canonical
// rebuilds the same bytes in Go from the row's columns. Verification uses
// only the Go one and never calls a function stored in the database: a
// superuser can replace audit_event_digest with one that returns whatever a
// tampered row needs. TestGoDigestAgreesWithTheInsertPath keeps the two in
// step. BEFORE and AFTER are hashed as the text PostgreSQL hands back, so a
// verifier carries them byte for byte (an export keeps them as strings).
//
// # Appends
//
// Appends are serialised by a transaction-scoped advisory lock taken in its
// own statement before the head of the chain is read: in READ COMMITTED each
// statement takes a fresh snapshot, so the head read after the lock sees every
// append committed while this transaction waited. Because the lock is held
// until commit, an append made inside a business transaction (the normal case:
// the change and its audit row commit or roll back together) serialises policy
// writes; they are rare enough for that to be the right trade.
//
// UPDATE, DELETE and TRUNCATE are refused by triggers, on audit_events and
// (TRUNCATE since 000013) on transitions. Whoever can disable triggers can
// still rewrite rows. A row rewritten without re-hashing is found by Verify;
// a rewrite re-chained through every later row, rows cut from the tail, or a
// database restored to an earlier point are consistent in themselves and
// only found against something outside the database: the checkpoints.
//
// # Checkpoints
//
// A Checkpointer (one per region: replicas take turns through an advisory
// lock) writes every minute, and when muster stops, a checkpoint
//
//	{"v":1,"n":N,"seq":SEQ,"head":HEX,"at":RFC3339,"prev":HEX,"key_id":ID}
//
// saying that row SEQ hashed HEAD at AT; PREV is the SHA-256 of checkpoint
// N-1's payload (empty for the first), so checkpoints form a chain of their
// own and a missing one shows. The payload is signed with Ed25519 over
// "muster audit checkpoint v1\x00" followed by the payload's exact bytes, by
// a Signer whose key PostgreSQL never holds (a key file readable by its
// owner only, or a KMS behind the Signer interface), and the file
// {"payload":…,"signature":BASE64} is put in a Sink: a local directory in
// dev, an S3 bucket with Object Lock in production (package s3sink), as
// object %016d.json. An unchanged head writes nothing until an hour has
// passed (a heartbeat). Before it signs, the Checkpointer verifies in Go
// that the row the previous checkpoint named still hashes to its head and
// that every row since is sound; it never signs over a rewritten or
// rolled-back chain, it logs the place and counts the failure. The chain of
// checkpoints lives in the sink, so it survives restarts and database
// restores.
//
// VerifyCheckpoints checks the table against every checkpoint: each named
// row must still hash to the recorded head ("rewritten" otherwise, naming
// the checkpoint and bounding the rewritten seqs), and the table must reach
// the newest checkpoint's seq ("rollback" otherwise, with the seqs lost).
//
// What this does not prove: that events were written at all (an action
// muster never recorded leaves no row to check); anything after the newest
// checkpoint (up to a minute of rows, or more if the writer was stopped
// without its last checkpoint); that the newest checkpoints were not
// deleted from a sink without Object Lock; anything, once the signing key
// is stolen (the thief can sign a rewritten chain).
//
// # Export
//
// Export writes a time range as JSON Lines: a header, the rows of one
// contiguous seq range (columns, prev_hash, hash), and the checkpoints that
// cover them, byte for byte; VerifyExport checks such a file offline.
//
// # Records of ends
//
// Each end of an instance, an override or a shift is recorded by an
// "end.record" row naming the row's id, sealed (RecordEnd, ends.go), and
// the readers that put rows in force leave out the rows Ends finds: a
// row written back after muster ended it is not applied.
//
// # Refused evidence
//
// Report items refused for want of authority (a workload reporting about
// another service's instance, a prober outside its assignment) are
// summarised per identity per minute into one refused "evidence.report" row
// (RefusalSummaries): counts by refusal code and the first few items.
//
// # Authentication failures
//
// Requests refused for a token presented and not accepted (forged,
// expired, from an unknown issuer, malformed) are summarised the same way,
// per source address per minute, into one refused "auth.refuse" row with
// the counts by failure code (NewAuthFailureSummaries).
package audit
