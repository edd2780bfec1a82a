-- Table lease_expiry_confirmations, owned by internal/registry (the lease reaper).

-- name: LeaseExpiryConfirmationInsert :one
INSERT INTO lease_expiry_confirmations (scope, confirmed_at, confirmed_by, reason)
VALUES ($1, $2, $3, $4)
RETURNING *;

-- name: LeaseExpiryConfirmationsSince :many
-- The newest confirmation per scope ('' = region) since a moment.
SELECT DISTINCT ON (scope) * FROM lease_expiry_confirmations
WHERE confirmed_at > sqlc.arg(since)::timestamptz
ORDER BY scope, confirmed_at DESC;
