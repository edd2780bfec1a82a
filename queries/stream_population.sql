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
-- Only live replicas count: self (the replica asking, live by asking,
-- even before its first heartbeat after a restart) and those whose
-- heartbeat in replicas is within ttl_ms by the database's clock (as
-- ReplicaListLive reads them). A dead replica's clients come back through
-- the live ones and raise their peaks; its own peak, kept for the
-- horizon, would count them twice and the region would over-admit.
-- With only_members, a replica other than self counts only if it is
-- among members: the replicas whose row's seal verified at the ownership
-- manager's last reading (a row written by hand, with a population row
-- beside it, must not size the region's admission).
SELECT
    coalesce(sum(CASE WHEN p.peak_at > sqlc.arg(since)::timestamptz THEN p.peak ELSE p.subscribers END), 0)::bigint AS expected,
    count(*)::bigint AS replicas,
    count(*) FILTER (WHERE p.at > sqlc.arg(live_since)::timestamptz)::bigint AS live
FROM stream_population p
WHERE p.at > sqlc.arg(since)::timestamptz
  AND (p.replica = sqlc.arg(self)::text
       OR EXISTS (SELECT 1 FROM replicas r
                  WHERE r.id = p.replica
                    AND r.last_seen > clock_timestamp() - sqlc.arg(ttl_ms)::bigint * interval '1 millisecond')
           AND (NOT sqlc.arg(only_members)::boolean OR p.replica = ANY(sqlc.arg(members)::text[])));

-- name: StreamPopulationPrune :execrows
-- Forgets replicas that have not reported since before.
DELETE FROM stream_population WHERE at < sqlc.arg(before)::timestamptz;

-- name: StreamPopulationForget :execrows
-- Forgets one replica's reports (a benchmark starting from a clean slate).
DELETE FROM stream_population WHERE replica = sqlc.arg(replica)::text;
