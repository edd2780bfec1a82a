-- Table service_grants, owned by internal/registry.

-- name: ServiceGrantsAll :many
-- Every service with its owner and each caller it granted (a NULL caller:
-- it granted none), read in one snapshot for the in-memory copy that watch
-- and resolve authorise from.
SELECT s.name, s.owner, g.caller
FROM services s LEFT JOIN service_grants g ON g.service = s.name
ORDER BY s.name, g.caller;

-- name: GrantsDelete :exec
DELETE FROM service_grants WHERE service = $1;

-- name: GrantInsert :exec
INSERT INTO service_grants (service, caller, granted_at, granted_by)
VALUES ($1, $2, sqlc.arg(now), sqlc.arg(granted_by));

-- name: GrantsGet :many
SELECT caller FROM service_grants WHERE service = $1 ORDER BY caller;

-- name: GrantsAll :many
SELECT service, caller FROM service_grants ORDER BY service, caller;
