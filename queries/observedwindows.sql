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
    successes, failures, hard_failures, unobservable, reporters)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: ObservedWindowsForInstances :many
-- The retained windows of some instances (a contract preview's service),
-- oldest first.
SELECT instance_id, class, window_end, successes, failures, hard_failures, unobservable, reporters
FROM observed_windows
WHERE window_end > sqlc.arg(since)::timestamptz
  AND instance_id = ANY(sqlc.arg(ids)::uuid[])
ORDER BY window_end, instance_id, class;
