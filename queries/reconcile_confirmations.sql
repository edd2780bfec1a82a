-- Table reconcile_confirmations, owned by internal/registry (the reconciliation source confirmations operators give).

-- name: ReconcileConfirmationInsert :one
INSERT INTO reconcile_confirmations (source, confirmed_at, confirmed_by, reason, instances, seal, seal_key)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING *;

-- name: ReconcileConfirmationsSince :many
-- The confirmations of a source given at or after a moment (the start of
-- the hold they may release), newest first.
SELECT * FROM reconcile_confirmations
WHERE source = sqlc.arg(source) AND confirmed_at >= sqlc.arg(since)::timestamptz
ORDER BY confirmed_at DESC, id DESC
LIMIT sqlc.arg(max);
