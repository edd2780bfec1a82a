-- Table shifts, owned by internal/shift.

-- name: ShiftInsert :one
INSERT INTO shifts (id, scope, target, reason, manual, state, step, weight,
                    started_by, started_at, last_step_at, last_step_by, updated_at)
VALUES ($1, $2, $3, $4, $5, 'draining', 0, 0,
        sqlc.arg(actor), sqlc.arg(now), sqlc.arg(now), sqlc.arg(actor), sqlc.arg(now))
RETURNING *;

-- name: ShiftGet :one
SELECT * FROM shifts WHERE id = $1;

-- name: ShiftGetForUpdate :one
SELECT * FROM shifts WHERE id = $1 FOR UPDATE;

-- name: ShiftUpdate :one
-- Moves a shift on; every write takes a fresh revision.
UPDATE shifts
SET state = $2, step = $3, weight = $4, last_step_at = $5, last_step_by = $6,
    pending_since = $7, confirmed_by = $8, confirmed_at = $9, ended_at = $10,
    updated_at = sqlc.arg(now), revision = nextval('shift_revisions')
WHERE id = $1
RETURNING *;

-- name: ShiftList :many
-- Keyset pagination by id (UUIDv7: creation order), optionally by state.
SELECT * FROM shifts
WHERE id > sqlc.arg(after)::uuid
  AND (sqlc.narg(state)::text IS NULL OR state = sqlc.narg(state)::text)
ORDER BY id
LIMIT sqlc.arg(lim);

-- name: ShiftListActive :many
SELECT * FROM shifts
WHERE state IN ('draining', 'returning', 'pending_confirmation')
ORDER BY id;

-- name: ShiftRevision :one
-- The newest revision: a replica reloads its shifts when this moves.
SELECT coalesce(max(revision), 0)::bigint AS revision FROM shifts;

-- name: ShiftListDue :many
-- Automatic shifts on their way back whose dwell has elapsed, locked so
-- that replicas never take the same step twice.
SELECT * FROM shifts
WHERE state = 'returning' AND NOT manual AND last_step_at <= sqlc.arg(cutoff)::timestamptz
ORDER BY last_step_at
FOR UPDATE SKIP LOCKED;

-- name: ShiftSeal :one
-- Seals a shift as muster just wrote it, in the transaction that did; the
-- revision stays the write's own.
UPDATE shifts SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key)
WHERE id = sqlc.arg(id)
RETURNING *;

-- name: ShiftSealCensus :many
-- How many shifts in force each key sealed (seal_key NULL: unsealed).
SELECT seal_key, count(*)::bigint AS rows FROM shifts
WHERE state IN ('draining', 'returning', 'pending_confirmation') GROUP BY seal_key;

-- name: ShiftResealBatch :many
-- muster seal rotate: the next shifts in force, by id, sealed by a key
-- other than the new one, locked until their re-seal commits.
SELECT * FROM shifts
WHERE state IN ('draining', 'returning', 'pending_confirmation')
  AND seal IS NOT NULL AND seal_key IS DISTINCT FROM sqlc.arg(key_id)::text
  AND id > sqlc.arg(after)::uuid
ORDER BY id
LIMIT sqlc.arg(lim)
FOR UPDATE;

-- name: ShiftReseal :execrows
-- Replaces a shift's seal with one by the new key, only if the row still
-- carries the seal that was verified. The revision stays: what the shift
-- does has not changed, so replicas need not reload it.
UPDATE shifts SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key)
WHERE id = sqlc.arg(id) AND seal = sqlc.arg(old_seal);
