-- Table lease_expiry_confirmations, owned by internal/registry (the lease reaper).

-- name: LeaseExpiryConfirmationInsert :one
INSERT INTO lease_expiry_confirmations (scope, confirmed_at, confirmed_by, reason, seal, seal_key)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING *;

-- name: LeaseExpiryConfirmationsSince :many
-- The confirmations since a moment, newest first: the reaper takes the
-- newest per scope ('' = region) whose seal verifies, so a row written by
-- hand cannot hide a genuine one behind it.
SELECT * FROM lease_expiry_confirmations
WHERE confirmed_at > sqlc.arg(since)::timestamptz
ORDER BY confirmed_at DESC, id DESC
LIMIT 1000;
