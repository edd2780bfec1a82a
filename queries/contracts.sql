-- Table health_contracts, owned by internal/registry.

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

-- name: ContractSeal :one
-- Seals a contract as muster just wrote it, in that transaction.
UPDATE health_contracts SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key)
WHERE service = sqlc.arg(service)
RETURNING *;

-- name: ContractListUnsealed :many
-- Contracts from before the seals, for their one adoption.
SELECT * FROM health_contracts WHERE seal IS NULL ORDER BY service;

-- name: ContractAnySealed :one
SELECT EXISTS (SELECT 1 FROM health_contracts WHERE seal IS NOT NULL) AS sealed;

-- name: ServiceContractsAll :many
SELECT s.name, s.owner, s.capabilities, s.updated_at AS service_updated_at,
       c.version AS contract_version, c.document AS contract,
       c.updated_at AS contract_updated_at, c.updated_by AS contract_updated_by,
       c.seal AS contract_seal, c.seal_key AS contract_seal_key
FROM services s LEFT JOIN health_contracts c ON c.service = s.name
ORDER BY s.name;

-- name: ServiceContractsByName :many
-- ServiceContractsAll for the named services only: a service the
-- evaluator meets first through one of its instances.
SELECT s.name, s.owner, s.capabilities, s.updated_at AS service_updated_at,
       c.version AS contract_version, c.document AS contract,
       c.updated_at AS contract_updated_at, c.updated_by AS contract_updated_by,
       c.seal AS contract_seal, c.seal_key AS contract_seal_key
FROM services s LEFT JOIN health_contracts c ON c.service = s.name
WHERE s.name = ANY(sqlc.arg(names)::text[])
ORDER BY s.name;

-- name: ContractSealCensus :many
-- How many services' current contracts each key sealed (seal_key NULL:
-- unsealed).
SELECT seal_key, count(*)::bigint AS rows
FROM (SELECT DISTINCT ON (service) service, seal_key FROM health_contracts ORDER BY service, version DESC) AS current
GROUP BY seal_key;

-- name: ContractResealBatch :many
-- muster seal rotate: the next contracts, by service, sealed by a key
-- other than the new one, locked until their re-seal commits.
SELECT * FROM health_contracts
WHERE seal IS NOT NULL AND seal_key IS DISTINCT FROM sqlc.arg(key_id)::text
  AND service > sqlc.arg(after)::text
ORDER BY service
LIMIT sqlc.arg(lim)
FOR UPDATE;

-- name: ContractReseal :execrows
-- Replaces a contract's seal with one by the new key, only if the row
-- still carries the version and seal that were verified.
UPDATE health_contracts SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key)
WHERE service = sqlc.arg(service) AND version = sqlc.arg(version) AND seal = sqlc.arg(old_seal);
