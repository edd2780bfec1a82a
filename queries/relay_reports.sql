-- Table relay_reports, owned by internal/relay (what each replica hears of its peers).

-- name: RelayReportPut :exec
-- Records what replica hears and owns now (the database's clock).
INSERT INTO relay_reports (replica, heard, shards, reported_at)
VALUES (sqlc.arg(replica)::text, sqlc.arg(heard)::jsonb, sqlc.arg(shards)::integer[], clock_timestamp())
ON CONFLICT (replica) DO UPDATE SET
    heard = EXCLUDED.heard,
    shards = EXCLUDED.shards,
    reported_at = EXCLUDED.reported_at;

-- name: RelayReportListFresh :many
-- The reports made within the last within_ms milliseconds (the
-- database's clock), newest first, with their age in milliseconds.
SELECT replica, heard, shards,
       (extract(epoch FROM clock_timestamp() - reported_at) * 1000)::bigint AS age_ms
FROM relay_reports
WHERE reported_at > clock_timestamp() - sqlc.arg(within_ms)::bigint * interval '1 millisecond'
ORDER BY reported_at DESC;

-- name: RelayReportForget :exec
-- Removes a replica's report (it stops gracefully), and any report not
-- renewed for an hour, so the table holds only the region's replicas.
DELETE FROM relay_reports
WHERE replica = sqlc.arg(replica)::text
   OR reported_at < clock_timestamp() - interval '1 hour';
