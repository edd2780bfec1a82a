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

-- name: ShiftRestore :one
-- Writes back a held shift (one muster applied whose row was then deleted
-- or changed outside muster) exactly as muster last verified it, seal
-- included, before muster steps it: the step then moves muster's own row.
INSERT INTO shifts (id, scope, target, reason, manual, state, step, weight, started_by, started_at,
                    last_step_at, last_step_by, pending_since, confirmed_by, confirmed_at, ended_at,
                    updated_at, seal, seal_key)
VALUES (sqlc.arg(id), sqlc.arg(scope), sqlc.arg(target), sqlc.arg(reason), sqlc.arg(manual), sqlc.arg(state),
        sqlc.arg(step), sqlc.arg(weight), sqlc.arg(started_by), sqlc.arg(started_at), sqlc.arg(last_step_at),
        sqlc.arg(last_step_by), sqlc.arg(pending_since), sqlc.arg(confirmed_by), sqlc.arg(confirmed_at),
        sqlc.arg(ended_at), sqlc.arg(updated_at), sqlc.arg(seal), sqlc.arg(seal_key))
ON CONFLICT (id) DO UPDATE
SET scope = EXCLUDED.scope, target = EXCLUDED.target, reason = EXCLUDED.reason, manual = EXCLUDED.manual,
    state = EXCLUDED.state, step = EXCLUDED.step, weight = EXCLUDED.weight, started_by = EXCLUDED.started_by,
    started_at = EXCLUDED.started_at, last_step_at = EXCLUDED.last_step_at, last_step_by = EXCLUDED.last_step_by,
    pending_since = EXCLUDED.pending_since, confirmed_by = EXCLUDED.confirmed_by,
    confirmed_at = EXCLUDED.confirmed_at, ended_at = EXCLUDED.ended_at, updated_at = EXCLUDED.updated_at,
    seal = EXCLUDED.seal, seal_key = EXCLUDED.seal_key
RETURNING *;
