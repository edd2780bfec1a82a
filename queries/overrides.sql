-- Table overrides, owned by internal/policy.

-- name: OverrideServiceLock :exec
-- Serialises budget decisions about one service across replicas, so two
-- overrides admitted at once cannot each spend the same headroom.
SELECT pg_advisory_xact_lock(7150307, hashtext(sqlc.arg(service)::text));

-- name: OverrideInsert :one
-- ended_at is set only for a deregistration applied at once.
INSERT INTO overrides (id, instance_id, service, zone, action, state, actor, justification,
                       cosign_by, budget_detail, created_at, expires_at, ended_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
RETURNING *;

-- name: OverrideGet :one
SELECT * FROM overrides WHERE id = $1;

-- name: OverrideGetForUpdate :one
SELECT * FROM overrides WHERE id = $1 FOR UPDATE;

-- name: OverrideListInForce :many
-- Every override in force at now, oldest first: what the evaluator applies.
SELECT * FROM overrides
WHERE state = 'active' AND expires_at > sqlc.arg(now)::timestamptz
ORDER BY id;

-- name: OverrideListInForceByService :many
SELECT * FROM overrides
WHERE service = sqlc.arg(service) AND state = 'active' AND expires_at > sqlc.arg(now)::timestamptz
ORDER BY id;

-- name: OverrideExpireDue :many
-- Writes down the expiry of overrides past their time: active ones past
-- expires_at and pending ones past cosign_by. Locked rows are skipped so
-- concurrent sweeps on several replicas never end (and audit) one twice.
UPDATE overrides SET state = 'expired', ended_at = sqlc.arg(now)::timestamptz
WHERE id IN (
    SELECT o.id FROM overrides o
    WHERE (o.state = 'active' AND o.expires_at <= sqlc.arg(now)::timestamptz)
       OR (o.state = 'pending_cosign' AND o.cosign_by <= sqlc.arg(now)::timestamptz)
    ORDER BY o.id
    LIMIT sqlc.arg(lim)
    FOR UPDATE SKIP LOCKED)
RETURNING *;

-- name: OverrideExpireDueForInstance :many
UPDATE overrides SET state = 'expired', ended_at = sqlc.arg(now)::timestamptz
WHERE instance_id = sqlc.arg(instance_id)
  AND ((state = 'active' AND expires_at <= sqlc.arg(now)::timestamptz)
    OR (state = 'pending_cosign' AND cosign_by <= sqlc.arg(now)::timestamptz))
RETURNING *;

-- name: OverrideActivate :one
UPDATE overrides
SET state = 'active', cosigner = sqlc.arg(cosigner), cosign_justification = sqlc.arg(cosign_justification),
    cosigned_at = sqlc.arg(now)::timestamptz
WHERE id = sqlc.arg(id) AND state = 'pending_cosign'
RETURNING *;

-- name: OverrideSeal :one
-- Seals an override put in force, in the transaction that did it.
UPDATE overrides SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key)
WHERE id = sqlc.arg(id) AND state = 'active'
RETURNING *;

-- name: OverrideCosignApply :one
-- A co-signed deregistration: applied once (the caller ends the instance in
-- the same transaction), never in force.
UPDATE overrides
SET state = 'applied', cosigner = sqlc.arg(cosigner), cosign_justification = sqlc.arg(cosign_justification),
    cosigned_at = sqlc.arg(now)::timestamptz, ended_at = sqlc.arg(now)::timestamptz
WHERE id = sqlc.arg(id) AND state = 'pending_cosign' AND action = 'deregister'
RETURNING *;

-- name: OverrideLift :one
UPDATE overrides
SET state = 'lifted', lifted_at = sqlc.arg(now)::timestamptz, lifted_by = sqlc.arg(lifted_by),
    ended_at = sqlc.arg(now)::timestamptz
WHERE id = sqlc.arg(id) AND state IN ('active', 'pending_cosign')
RETURNING *;

-- name: OverrideList :many
-- Newest first, keyset pagination on id (uuid.Nil for the first page).
-- state filters on the state as of now: an active row past its expiry
-- (or a pending one past its co-sign deadline) is expired.
SELECT * FROM overrides
WHERE (sqlc.arg(before_id)::uuid = '00000000-0000-0000-0000-000000000000'::uuid OR id < sqlc.arg(before_id)::uuid)
  AND (sqlc.narg(service)::text IS NULL OR service = sqlc.narg(service)::text)
  AND (sqlc.narg(instance_id)::uuid IS NULL OR instance_id = sqlc.narg(instance_id)::uuid)
  AND (sqlc.narg(actor)::text IS NULL OR actor = sqlc.narg(actor)::text OR cosigner = sqlc.narg(actor)::text)
  AND (sqlc.narg(state)::text IS NULL OR sqlc.narg(state)::text = CASE
        WHEN state = 'active' AND expires_at <= sqlc.arg(now)::timestamptz THEN 'expired'
        WHEN state = 'pending_cosign' AND cosign_by <= sqlc.arg(now)::timestamptz THEN 'expired'
        ELSE state END)
ORDER BY id DESC
LIMIT sqlc.arg(lim);

-- name: OverrideSealCensus :many
-- How many overrides in force each key sealed (seal_key NULL: unsealed).
SELECT seal_key, count(*)::bigint AS rows FROM overrides
WHERE state = 'active' AND expires_at > sqlc.arg(now)::timestamptz GROUP BY seal_key;

-- name: OverrideResealBatch :many
-- muster seal rotate: the next overrides in force, by id, sealed by a key
-- other than the new one, locked until their re-seal commits.
SELECT * FROM overrides
WHERE state = 'active' AND expires_at > sqlc.arg(now)::timestamptz
  AND seal IS NOT NULL AND seal_key IS DISTINCT FROM sqlc.arg(key_id)::text
  AND id > sqlc.arg(after)::uuid
ORDER BY id
LIMIT sqlc.arg(lim)
FOR UPDATE;

-- name: OverrideReseal :execrows
-- Replaces an override's seal with one by the new key, only if the row
-- is still in force with the seal that was verified.
UPDATE overrides SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key)
WHERE id = sqlc.arg(id) AND seal = sqlc.arg(old_seal) AND state = 'active';
