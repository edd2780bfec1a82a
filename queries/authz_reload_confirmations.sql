-- Table authz_reload_confirmations, owned by internal/registry (the authorisation copy).

-- name: AuthzReloadConfirmationInsert :one
INSERT INTO authz_reload_confirmations (confirmed_at, confirmed_by, reason)
VALUES ($1, $2, $3)
RETURNING *;

-- name: AuthzReloadConfirmationLatest :one
SELECT * FROM authz_reload_confirmations ORDER BY confirmed_at DESC, id DESC LIMIT 1;
