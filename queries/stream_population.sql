-- Table stream_population, owned by internal/stream (the census).

-- name: StreamPopulationPut :exec
-- Records a replica's subscriber count at at. Its peak stays while it was
-- reached after peak_since and is above the new count; otherwise the count
-- is the new peak.
INSERT INTO stream_population (replica, subscribers, peak, peak_at, at)
VALUES (sqlc.arg(replica)::text, sqlc.arg(subscribers)::integer, sqlc.arg(subscribers)::integer,
        sqlc.arg(at)::timestamptz, sqlc.arg(at)::timestamptz)
ON CONFLICT (replica) DO UPDATE SET
    subscribers = EXCLUDED.subscribers,
    peak = CASE WHEN stream_population.peak_at > sqlc.arg(peak_since)::timestamptz
                 AND stream_population.peak > EXCLUDED.subscribers
            THEN stream_population.peak ELSE EXCLUDED.subscribers END,
    peak_at = CASE WHEN stream_population.peak_at > sqlc.arg(peak_since)::timestamptz
                    AND stream_population.peak > EXCLUDED.subscribers
               THEN stream_population.peak_at ELSE EXCLUDED.at END,
    at = EXCLUDED.at;

-- name: StreamPopulationExpected :one
-- The region's expected population: the sum over replicas reported since
-- since of their peak (or their count, if the peak is older than since),
-- how many replicas that is, and how many reported since live_since.
SELECT
    coalesce(sum(CASE WHEN peak_at > sqlc.arg(since)::timestamptz THEN peak ELSE subscribers END), 0)::bigint AS expected,
    count(*)::bigint AS replicas,
    count(*) FILTER (WHERE at > sqlc.arg(live_since)::timestamptz)::bigint AS live
FROM stream_population
WHERE at > sqlc.arg(since)::timestamptz;

-- name: StreamPopulationPrune :execrows
-- Forgets replicas that have not reported since before.
DELETE FROM stream_population WHERE at < sqlc.arg(before)::timestamptz;

-- name: StreamPopulationForget :execrows
-- Forgets one replica's reports (a benchmark starting from a clean slate).
DELETE FROM stream_population WHERE replica = sqlc.arg(replica)::text;
