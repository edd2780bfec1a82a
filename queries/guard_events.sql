-- Table guard_events, owned by internal/guardlog.

-- name: GuardEventTrip :execrows
-- Records a trip unless the zone has an open episode, or one recorded as
-- cleared at or after this trip began (another replica saw it first).
INSERT INTO guard_events (service, zone, tripped_at, trip_detail)
SELECT sqlc.arg(service)::text, sqlc.arg(zone)::text, sqlc.arg(tripped_at)::timestamptz, sqlc.arg(trip_detail)::text
WHERE NOT EXISTS (
    SELECT 1 FROM guard_events
    WHERE service = sqlc.arg(service)::text AND zone = sqlc.arg(zone)::text
      AND cleared_at >= sqlc.arg(tripped_at)::timestamptz
)
ON CONFLICT (service, zone) WHERE cleared_at IS NULL DO NOTHING;

-- name: GuardEventClear :execrows
-- Closes the zone's open episode, if any.
UPDATE guard_events SET cleared_at = GREATEST(sqlc.arg(cleared_at)::timestamptz, tripped_at)
WHERE service = sqlc.arg(service)::text AND zone = sqlc.arg(zone)::text AND cleared_at IS NULL;

-- name: GuardEventList :many
-- A service's guard episodes, newest first.
SELECT * FROM guard_events
WHERE service = sqlc.arg(service)::text
ORDER BY tripped_at DESC, id DESC
LIMIT sqlc.arg(lim);
