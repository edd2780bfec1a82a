-- Table replicas, owned by internal/ownership (one owner per service).

-- name: ReplicaHeartbeat :one
-- Records that replica id is alive now (the database's clock). restart
-- stamps started_at anew (the first heartbeat of a process); otherwise a
-- replica keeps the started_at it has. ready says whether it can publish
-- what it would be dealt (the balance counts only ready replicas).
-- incarnation names the process; seal and seal_key seal the row's
-- identity (id, address, region, incarnation) with the region's key
-- (NULL without one), so the others believe the row only as muster
-- wrote it (internal/ownership, "Sealed membership").
INSERT INTO replicas (id, started_at, last_seen, address, region, ready, incarnation, seal, seal_key)
VALUES (sqlc.arg(id)::text, clock_timestamp(), clock_timestamp(), sqlc.arg(address)::text, sqlc.arg(region)::text, sqlc.arg(ready)::boolean,
        sqlc.arg(incarnation)::text, sqlc.narg(seal)::bytea, sqlc.narg(seal_key)::text)
ON CONFLICT (id) DO UPDATE SET
    started_at = CASE WHEN sqlc.arg(restart)::boolean THEN EXCLUDED.started_at ELSE replicas.started_at END,
    last_seen = EXCLUDED.last_seen,
    address = EXCLUDED.address,
    region = EXCLUDED.region,
    ready = EXCLUDED.ready,
    incarnation = EXCLUDED.incarnation,
    seal = EXCLUDED.seal,
    seal_key = EXCLUDED.seal_key
RETURNING started_at, last_seen;

-- name: ReplicaListLive :many
-- The replicas seen within the last within_ms milliseconds (the
-- database's clock), by id, with their seals: the caller believes only
-- the rows whose seal verifies.
SELECT id, started_at, last_seen, address, region, ready, incarnation, seal, seal_key
FROM replicas
WHERE last_seen > clock_timestamp() - sqlc.arg(within_ms)::bigint * interval '1 millisecond'
ORDER BY id;

-- name: ReplicaForget :exec
-- Removes a replica that is leaving gracefully, so the others stop
-- counting it in the balance at once instead of a TTL later.
DELETE FROM replicas WHERE id = sqlc.arg(id)::text;

-- name: ReplicaPrune :execrows
-- Forgets replicas not seen for older_ms milliseconds.
DELETE FROM replicas
WHERE last_seen < clock_timestamp() - sqlc.arg(older_ms)::bigint * interval '1 millisecond';
