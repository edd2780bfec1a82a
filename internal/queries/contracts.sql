-- name: ContractGet :one
SELECT * FROM health_contracts WHERE service = $1;

-- name: ContractUpsert :one
INSERT INTO health_contracts (service, version, document, updated_at, updated_by)
VALUES ($1, 1, $2, sqlc.arg(now), sqlc.arg(updated_by))
ON CONFLICT (service) DO UPDATE
SET version = health_contracts.version + 1,
    document = EXCLUDED.document,
    updated_at = EXCLUDED.updated_at,
    updated_by = EXCLUDED.updated_by
RETURNING *;
