-- Table service_grants, owned by internal/registry.

-- name: ServicesAll :many
-- Every service with its seal, for the in-memory copy that watch and
-- resolve authorise from.
SELECT * FROM services ORDER BY name;

-- name: GrantsAllRows :many
-- Every grant row, revoked ones (sealed tombstones) included, for the
-- in-memory copy.
SELECT * FROM service_grants ORDER BY service, caller;

-- name: GrantsOf :many
-- Every grant row of one service, revoked ones included.
SELECT * FROM service_grants WHERE service = $1 ORDER BY caller;

-- name: GrantUpsert :one
-- Grants (again): a tombstone of the same caller becomes a grant. The
-- version passes both the row's and floor (what the writer's copy holds,
-- for a row deleted by hand).
INSERT INTO service_grants (service, caller, granted_at, granted_by, version)
VALUES ($1, $2, sqlc.arg(now), sqlc.arg(granted_by), sqlc.arg(floor)::bigint + 1)
ON CONFLICT (service, caller) DO UPDATE
SET granted_at = EXCLUDED.granted_at, granted_by = EXCLUDED.granted_by,
    version = GREATEST(service_grants.version, sqlc.arg(floor)::bigint) + 1,
    revoked_at = NULL, revoked_by = NULL, seal = NULL, seal_key = NULL
RETURNING *;

-- name: GrantRevoke :one
-- A revocation is a tombstone, sealed by the caller: the row stays (or is
-- written, when the grant's row was deleted by hand and only the copy
-- still holds it).
INSERT INTO service_grants (service, caller, granted_at, granted_by, revoked_at, revoked_by, version)
VALUES ($1, $2, sqlc.arg(now)::timestamptz, sqlc.arg(revoked_by)::text, sqlc.arg(now)::timestamptz, sqlc.arg(revoked_by)::text, sqlc.arg(floor)::bigint + 1)
ON CONFLICT (service, caller) DO UPDATE
SET revoked_at = EXCLUDED.revoked_at, revoked_by = EXCLUDED.revoked_by,
    version = GREATEST(service_grants.version, sqlc.arg(floor)::bigint) + 1,
    seal = NULL, seal_key = NULL
RETURNING *;

-- name: GrantSeal :one
UPDATE service_grants SET seal = $3, seal_key = $4
WHERE service = $1 AND caller = $2
RETURNING *;

-- name: GrantListUnsealed :many
SELECT * FROM service_grants WHERE seal IS NULL ORDER BY service, caller;

-- name: GrantAnySealed :one
SELECT EXISTS (SELECT 1 FROM service_grants WHERE seal IS NOT NULL);

-- name: GrantSealCensus :many
-- How many grant rows (grants and their sealed tombstones) each key
-- sealed (seal_key NULL: unsealed).
SELECT seal_key, count(*)::bigint AS rows FROM service_grants GROUP BY seal_key;

-- name: GrantResealBatch :many
-- muster seal rotate: the next grant rows, by (service, caller), sealed by
-- a key other than the new one, locked until their re-seal commits.
SELECT * FROM service_grants
WHERE seal IS NOT NULL AND seal_key IS DISTINCT FROM sqlc.arg(key_id)::text
  AND (service, caller) > (sqlc.arg(after_service)::text, sqlc.arg(after_caller)::text)
ORDER BY service, caller
LIMIT sqlc.arg(lim)
FOR UPDATE;

-- name: GrantReseal :execrows
UPDATE service_grants SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key)
WHERE service = sqlc.arg(service) AND caller = sqlc.arg(caller) AND version = sqlc.arg(version) AND seal = sqlc.arg(old_seal);
