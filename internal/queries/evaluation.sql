-- name: InstanceListChangedSince :many
-- Instances changed after (updated_at, id), for incremental refresh; pass
-- the zero time and the nil UUID for a full load.
SELECT * FROM instances
WHERE (updated_at, id) > (sqlc.arg(since)::timestamptz, sqlc.arg(after_id)::uuid)
ORDER BY updated_at, id
LIMIT sqlc.arg(lim);

-- name: ServiceContractsAll :many
SELECT s.name, s.owner, s.capabilities, s.updated_at AS service_updated_at,
       c.version AS contract_version, c.document AS contract
FROM services s LEFT JOIN health_contracts c ON c.service = s.name
ORDER BY s.name;

-- name: InstanceListByIDs :many
-- The instances among ids, in any state: ingest looks up the ids a report
-- names that the evaluator has not loaded yet (registered a moment ago,
-- perhaps through another replica). Ids with no row are simply absent.
SELECT * FROM instances
WHERE id = ANY(sqlc.arg(ids)::uuid[]);

-- name: ServiceContractsByName :many
-- ServiceContractsAll for the named services only: a service the
-- evaluator meets first through one of its instances.
SELECT s.name, s.owner, s.capabilities, s.updated_at AS service_updated_at,
       c.version AS contract_version, c.document AS contract
FROM services s LEFT JOIN health_contracts c ON c.service = s.name
WHERE s.name = ANY(sqlc.arg(names)::text[])
ORDER BY s.name;

-- name: ObservedWindowsSince :many
-- One page of retained windows, oldest first; pass the last row's
-- (window_end, instance_id, class) as the cursor for the next page.
SELECT instance_id, class, window_end, successes, failures, hard_failures, unobservable, reporters
FROM observed_windows
WHERE window_end > sqlc.arg(since)::timestamptz
  AND (window_end, instance_id, class) > (sqlc.arg(after_end)::timestamptz, sqlc.arg(after_id)::uuid, sqlc.arg(after_class)::smallint)
ORDER BY window_end, instance_id, class
LIMIT sqlc.arg(lim);

-- name: ObservedWindowsPrune :execrows
DELETE FROM observed_windows WHERE window_end < sqlc.arg(before)::timestamptz;

-- name: ObservedWindowsInsert :copyfrom
INSERT INTO observed_windows (instance_id, class, window_start, window_end,
    successes, failures, hard_failures, unobservable, reporters)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

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
