-- Table member_sources, owned by internal/registry.

-- name: MemberSourcesGet :one
SELECT * FROM member_sources WHERE service = $1;

-- name: MemberSourcesUpsert :one
-- Replaces a service's member sources whole (version + 1); the caller
-- holds the service's row lock (ServiceGetForUpdate) and seals the row
-- in the same transaction (MemberSourcesSeal).
INSERT INTO member_sources (service, version, document, updated_by, updated_at)
VALUES (sqlc.arg(service), 1, sqlc.arg(document), sqlc.arg(updated_by), sqlc.arg(now)::timestamptz)
ON CONFLICT (service) DO UPDATE
SET version = member_sources.version + 1, document = EXCLUDED.document,
    updated_by = EXCLUDED.updated_by, updated_at = EXCLUDED.updated_at,
    seal = NULL, seal_key = NULL
RETURNING *;

-- name: MemberSourcesSeal :one
UPDATE member_sources SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key)
WHERE service = sqlc.arg(service)
RETURNING *;

-- name: MemberSourcesListByServices :many
-- The registered services among those a reconciliation reading names,
-- each with its member sources (NULL columns: none configured).
SELECT s.name AS service, m.version, m.document, m.updated_by, m.updated_at, m.seal, m.seal_key
FROM services s LEFT JOIN member_sources m ON m.service = s.name
WHERE s.name = ANY(sqlc.arg(services)::text[])
ORDER BY s.name;

-- name: MemberSourcesSealCensus :many
-- How many services' member sources each key sealed (seal_key NULL:
-- unsealed).
SELECT seal_key, count(*)::bigint AS rows FROM member_sources GROUP BY seal_key;

-- name: MemberSourcesResealBatch :many
-- muster seal rotate: the next member sources, by service, sealed by a
-- key other than the new one, locked until their re-seal commits.
SELECT * FROM member_sources
WHERE seal IS NOT NULL AND seal_key IS DISTINCT FROM sqlc.arg(key_id)::text
  AND service > sqlc.arg(after)::text
ORDER BY service
LIMIT sqlc.arg(lim)
FOR UPDATE;

-- name: MemberSourcesReseal :execrows
-- Replaces a service's member sources' seal with one by the new key, only
-- if the row still carries the version and seal that were verified.
UPDATE member_sources SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key)
WHERE service = sqlc.arg(service) AND version = sqlc.arg(version) AND seal = sqlc.arg(old_seal);
