-- name: GrantsDelete :exec
DELETE FROM service_grants WHERE service = $1;

-- name: GrantInsert :exec
INSERT INTO service_grants (service, caller, granted_at, granted_by)
VALUES ($1, $2, sqlc.arg(now), sqlc.arg(granted_by));

-- name: GrantsGet :many
SELECT caller FROM service_grants WHERE service = $1 ORDER BY caller;

-- name: GrantsAll :many
SELECT service, caller FROM service_grants ORDER BY service, caller;
