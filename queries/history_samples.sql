-- Table history_samples, owned by internal/zonehistory.

-- name: HistorySampleInsert :exec
-- Records one series' sample; a second writer at the same instant (a
-- handover) is ignored.
INSERT INTO history_samples (kind, series, at, eligible, total, unknown, state)
VALUES (sqlc.arg(kind)::text, sqlc.arg(series)::text, sqlc.arg(at)::timestamptz,
        sqlc.arg(eligible)::integer, sqlc.arg(total)::integer, sqlc.arg(unknown)::integer, sqlc.arg(state)::text)
ON CONFLICT (kind, at, series) DO NOTHING;

-- name: HistorySampleListSince :many
-- A kind's samples at or after since, oldest first.
SELECT series, at, eligible, total, unknown, state FROM history_samples
WHERE kind = sqlc.arg(kind)::text AND at >= sqlc.arg(since)::timestamptz
ORDER BY at, series
LIMIT sqlc.arg(lim);

-- name: HistorySampleLatest :one
-- When a kind was last sampled, by anyone (the epoch when never): a new
-- writer waits out the interval from there, so a handover does not draw
-- two points a moment apart.
SELECT COALESCE(max(at), 'epoch'::timestamptz)::timestamptz AS at FROM history_samples
WHERE kind = sqlc.arg(kind)::text;

-- name: HistorySampleDeleteBefore :execrows
-- Drops a kind's samples older than before.
DELETE FROM history_samples
WHERE kind = sqlc.arg(kind)::text AND at < sqlc.arg(before)::timestamptz;
