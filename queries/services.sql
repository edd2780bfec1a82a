-- Table services, owned by internal/registry.

-- name: ServiceGet :one
SELECT * FROM services WHERE name = $1;

-- name: ServiceListByNames :many
-- The services among names (a batch of lease renewals names instances of
-- a few).
SELECT * FROM services WHERE name = ANY(sqlc.arg(names)::text[]);

-- name: ServiceGetForUpdate :one
SELECT * FROM services WHERE name = $1 FOR UPDATE;

-- name: ServiceList :many
-- Keyset pagination by name: pass the last name of the previous page.
SELECT * FROM services
WHERE name > sqlc.arg(after)::text
  AND (sqlc.narg(owner)::text IS NULL OR owner = sqlc.narg(owner)::text)
ORDER BY name
LIMIT sqlc.arg(lim);

-- name: ServiceInsert :one
INSERT INTO services (name, owner, capabilities, created_at, updated_at)
VALUES ($1, $2, $3, sqlc.arg(now), sqlc.arg(now))
RETURNING *;

-- name: ServiceUpdate :one
UPDATE services SET owner = $2, capabilities = $3, updated_at = sqlc.arg(now)
WHERE name = $1
RETURNING *;

-- name: ServiceSeal :one
UPDATE services SET seal = $2, seal_key = $3 WHERE name = $1
RETURNING *;

-- name: ServiceListUnsealed :many
SELECT * FROM services WHERE seal IS NULL ORDER BY name;

-- name: ServiceAnySealed :one
SELECT EXISTS (SELECT 1 FROM services WHERE seal IS NOT NULL);

-- name: ServiceSealCensus :many
-- How many services each key sealed (seal_key NULL: unsealed), for the
-- start-up key check and muster seal status.
SELECT seal_key, count(*)::bigint AS rows FROM services GROUP BY seal_key;

-- name: ServiceResealBatch :many
-- muster seal rotate: the next services, by name, sealed by a key other
-- than the new one, locked until their re-seal commits.
SELECT * FROM services
WHERE seal IS NOT NULL AND seal_key IS DISTINCT FROM sqlc.arg(key_id)::text
  AND name > sqlc.arg(after)::text
ORDER BY name
LIMIT sqlc.arg(lim)
FOR UPDATE;

-- name: ServiceReseal :execrows
UPDATE services SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key)
WHERE name = sqlc.arg(name) AND seal = sqlc.arg(old_seal);
