-- Table audit_events, owned by internal/audit.

-- name: AuditLock :exec
-- Serialises appends to the hash chain. Taken in its own statement before
-- AuditHead so that the head is read with a snapshot that sees every append
-- committed while this transaction waited for the lock.
SELECT pg_advisory_xact_lock(7150305420616001);

-- name: AuditHead :one
SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1;

-- name: AuditInsert :one
-- The hash column is filled by the audit_events_seal trigger.
INSERT INTO audit_events (seq, at, actor_kind, actor, action, target_kind, target,
                          outcome, reason, before, after, prev_hash, hash)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, ''::bytea)
RETURNING *;

-- name: AuditList :many
-- Newest first, keyset pagination on seq (pass 0 for the first page).
SELECT * FROM audit_events
WHERE (sqlc.arg(before_seq)::bigint = 0 OR seq < sqlc.arg(before_seq)::bigint)
  AND (sqlc.narg(actor)::text IS NULL OR actor = sqlc.narg(actor)::text)
  AND (sqlc.narg(action)::text IS NULL OR action = sqlc.narg(action)::text)
  AND (sqlc.narg(target_kind)::text IS NULL OR target_kind = sqlc.narg(target_kind)::text)
  AND (sqlc.narg(target)::text IS NULL OR target = sqlc.narg(target)::text)
  AND (sqlc.narg(outcome)::text IS NULL OR outcome = sqlc.narg(outcome)::text)
  -- A service's events: those aimed at the service itself and those aimed
  -- at one of its instances (instance rows are never deleted).
  AND (sqlc.narg(service)::text IS NULL
       OR (target_kind = 'service' AND target = sqlc.narg(service)::text)
       OR (target_kind = 'instance' AND target IN (
             SELECT id::text FROM instances WHERE service = sqlc.narg(service)::text)))
ORDER BY seq DESC
LIMIT sqlc.arg(lim);

-- name: AuditPage :many
-- Oldest first from after_seq: the rows Verify rehashes in Go. It never
-- asks the database to hash (a replaced audit_event_digest could lie).
SELECT * FROM audit_events
WHERE seq > sqlc.arg(after_seq)::bigint
ORDER BY seq
LIMIT sqlc.arg(lim);

-- name: AuditRowGet :one
SELECT * FROM audit_events WHERE seq = $1;

-- name: AuditSeqRange :one
-- The seqs an export from since to until covers: the first row at or after
-- since and the last row before until (0 when there is none). Rows are
-- exported as the contiguous seq range between, because only a contiguous
-- range can be verified.
SELECT coalesce(min(seq) FILTER (WHERE at >= sqlc.arg(since)::timestamptz), 0)::bigint AS first_seq,
       coalesce(max(seq) FILTER (WHERE at < sqlc.arg(until)::timestamptz), 0)::bigint AS last_seq
FROM audit_events;

-- name: AuditCheckpointLock :one
-- One replica writes checkpoints at a time: the others find this taken and
-- skip their tick. Held until the transaction ends, which is after the
-- checkpoint reached its sink.
SELECT pg_try_advisory_xact_lock(7150305420616002);

-- name: AuditEndRecords :many
-- The records of ends (end.record rows, audit.RecordEnd) naming any of ids
-- as a target of target_kind: the readers that put rows in force ask for
-- the ids they are about to apply (audit_events_target_idx answers).
SELECT target, after FROM audit_events
WHERE target_kind = sqlc.arg(target_kind)::text
  AND target = ANY(sqlc.arg(ids)::text[])
  AND action = 'end.record' AND outcome = 'accepted';
