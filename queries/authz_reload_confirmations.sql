-- Table authz_reload_confirmations, owned by internal/registry (the authorisation copy).

-- name: AuthzReloadConfirmationInsert :one
INSERT INTO authz_reload_confirmations (confirmed_at, confirmed_by, reason, seal, seal_key)
VALUES ($1, $2, $3, $4, $5)
RETURNING *;

-- name: AuthzReloadConfirmationsRecent :many
-- The newest confirmations, newest first: the copy believes the newest
-- whose seal verifies, so a row written by hand cannot hide a genuine one.
SELECT * FROM authz_reload_confirmations ORDER BY confirmed_at DESC, id DESC LIMIT 100;
