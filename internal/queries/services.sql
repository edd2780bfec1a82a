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

-- name: ServiceGrantsAll :many
-- Every service with its owner and each caller it granted (a NULL caller:
-- it granted none), read in one snapshot for the in-memory copy that watch
-- and resolve authorise from.
SELECT s.name, s.owner, g.caller
FROM services s LEFT JOIN service_grants g ON g.service = s.name
ORDER BY s.name, g.caller;
