-- Table reconcile_confirmations, owned by internal/registry (the reconciliation source confirmations operators give).

-- name: ReconcileConfirmationInsert :one
INSERT INTO reconcile_confirmations (source, confirmed_at, confirmed_by, reason, instances)
VALUES ($1, $2, $3, $4, $5)
RETURNING *;

-- name: ReconcileConfirmationLatest :one
-- The newest confirmation of a source.
SELECT * FROM reconcile_confirmations
WHERE source = $1
ORDER BY confirmed_at DESC
LIMIT 1;
