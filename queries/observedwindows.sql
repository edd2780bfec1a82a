-- Table observed_windows, owned by internal/evaluator. (Not observed_windows.sql: Go reads the _windows suffix of sqlc's observed_windows.sql.go as a GOOS build constraint.)

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
    successes, failures, hard_failures, unobservable, reporters, writer)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: ObservedWindowsSettled :one
-- The newest write time a follower may read up to: the database's now,
-- less a margin for the transactions still writing (a row becomes visible
-- when its transaction commits, stamped with when it began).
SELECT (now() - make_interval(secs => sqlc.arg(margin_seconds)::float8))::timestamptz AS settled;

-- name: ObservedWindowsWritten :many
-- One page of the windows other replicas wrote in (after, upto], by write
-- time: pass the last row's (written_at, instance_id, class) as the cursor
-- for the next page.
SELECT instance_id, class, window_end, successes, failures, hard_failures, unobservable, reporters, written_at
FROM observed_windows
WHERE written_at <= sqlc.arg(upto)::timestamptz
  AND (written_at, instance_id, class) > (sqlc.arg(after_at)::timestamptz, sqlc.arg(after_id)::uuid, sqlc.arg(after_class)::smallint)
  AND writer <> sqlc.arg(reader)::text
ORDER BY written_at, instance_id, class
LIMIT sqlc.arg(lim);

-- name: ObservedWindowsForInstances :many
-- The retained windows of some instances (a contract preview's service),
-- oldest first.
SELECT instance_id, class, window_end, successes, failures, hard_failures, unobservable, reporters
FROM observed_windows
WHERE window_end > sqlc.arg(since)::timestamptz
  AND instance_id = ANY(sqlc.arg(ids)::uuid[])
ORDER BY window_end, instance_id, class;
