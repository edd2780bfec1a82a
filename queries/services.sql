-- Table services, owned by internal/registry.

-- name: ServiceGet :one
SELECT * FROM services WHERE name = $1;

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
