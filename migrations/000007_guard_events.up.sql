-- Fraction-guard trip history (issue 7): one row per episode of a zone's
-- guard being tripped, written by the publisher of every replica. Replicas
-- see the same trip at about the same moment, so writes are idempotent: at
-- most one open episode per service and zone (the partial unique index),
-- a trip that began before an episode of the same zone already recorded as
-- cleared is that episode seen late and is not recorded again, and a clear
-- only closes the open episode.
CREATE TABLE guard_events (
    id           bigserial PRIMARY KEY,
    service      text NOT NULL,
    zone         text NOT NULL,
    tripped_at   timestamptz NOT NULL,
    trip_detail  text NOT NULL,
    cleared_at   timestamptz,
    CHECK (cleared_at IS NULL OR cleared_at >= tripped_at)
);

CREATE UNIQUE INDEX guard_events_open_idx ON guard_events (service, zone) WHERE cleared_at IS NULL;
CREATE INDEX guard_events_service_idx ON guard_events (service, tripped_at DESC);
