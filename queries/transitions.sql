-- Table transitions, owned by internal/evaluator.

-- name: TransitionsInsert :copyfrom
INSERT INTO transitions (instance_id, service, from_state, to_state, weight, at, reason, history,
    quarantined_until, quarantine_step)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: TransitionsList :many
SELECT * FROM transitions
WHERE (sqlc.narg(service)::text IS NULL OR service = sqlc.narg(service)::text)
  AND (sqlc.narg(instance_id)::uuid IS NULL OR instance_id = sqlc.narg(instance_id)::uuid)
  AND (sqlc.arg(before_id)::bigint = 0 OR id < sqlc.arg(before_id)::bigint)
ORDER BY id DESC
LIMIT sqlc.arg(lim);

-- name: TransitionsQuarantines :many
-- A service's transitions that started a quarantine (they carry the
-- history), newest first, for the flap report.
SELECT * FROM transitions
WHERE service = sqlc.arg(service)::text AND history IS NOT NULL AND at >= sqlc.arg(since)::timestamptz
ORDER BY at DESC, id DESC
LIMIT sqlc.arg(lim);

-- name: TransitionsLatestQuarantines :many
-- The newest quarantine of each instance among those ending after since,
-- for the rebuild to restore (through the partial index on
-- quarantined_until: it reads recent quarantines only).
SELECT DISTINCT ON (instance_id) instance_id, at, quarantined_until::timestamptz AS quarantined_until, quarantine_step
FROM transitions
WHERE quarantined_until > sqlc.arg(since)::timestamptz
ORDER BY instance_id, quarantined_until DESC, id DESC;

-- name: TransitionsLatestFor :many
-- The newest transition of each of the given instances that has one, for
-- the rebuild to restore admissions (an instance with any transition has
-- been in rotation). One index probe per instance through
-- transitions_instance_idx, however long the log.
SELECT t.instance_id, t.to_state, t.at
FROM unnest(sqlc.arg(ids)::uuid[]) AS a(id)
CROSS JOIN LATERAL (
    SELECT instance_id, to_state, at FROM transitions
    WHERE transitions.instance_id = a.id
    ORDER BY at DESC
    LIMIT 1
) t;

-- name: TransitionsWindow :many
-- A service's transitions in [from, until), oldest first, for its
-- timeline (through transitions_service_idx).
SELECT instance_id, from_state, to_state, weight, at, reason FROM transitions
WHERE service = sqlc.arg(service)::text AND at >= sqlc.arg(since)::timestamptz AND at < sqlc.arg(until)::timestamptz
ORDER BY at, id
LIMIT sqlc.arg(lim);

-- name: TransitionsStateAt :many
-- The state each of the given instances was in at the given time, for
-- those with a transition: the last one's to_state before it (before is
-- true, at and reason are that transition's), else the first one's
-- from_state after it (the state it was registered in). Two index probes
-- per instance through transitions_instance_idx, however long the log.
SELECT a.id::uuid AS instance_id, COALESCE(b.to_state, f.from_state)::text AS state,
    (b.to_state IS NOT NULL)::boolean AS before,
    COALESCE(b.at, f.at)::timestamptz AS at, COALESCE(b.reason, '')::text AS reason
FROM unnest(sqlc.arg(ids)::uuid[]) AS a(id)
LEFT JOIN LATERAL (
    SELECT to_state, at, reason FROM transitions
    WHERE transitions.instance_id = a.id AND at < sqlc.arg(at)::timestamptz
    ORDER BY at DESC, id DESC
    LIMIT 1
) b ON true
LEFT JOIN LATERAL (
    SELECT from_state, at FROM transitions
    WHERE transitions.instance_id = a.id AND at >= sqlc.arg(at)::timestamptz
    ORDER BY at, id
    LIMIT 1
) f ON true
WHERE b.to_state IS NOT NULL OR f.from_state IS NOT NULL;
