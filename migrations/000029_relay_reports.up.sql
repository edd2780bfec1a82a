-- What each replica follows of its peers (internal/relay). A replica cut
-- off from its peers but not from PostgreSQL hears nothing from them, so
-- the only place it can learn that the others still follow each other
-- (and that it, not they, is the one cut off) is here. Each replica
-- rewrites its row every second: per peer, how many milliseconds before
-- the report it last read a line of that peer's stream (heard, an object
-- of peer id to milliseconds, measured on its own monotonic clock), and
-- the shards it owns (shards), so that a replica that can no longer hear
-- an owner still knows which services that owner publishes. reported_at
-- is the database's clock: readers compare ages, never two replicas'
-- clocks.
CREATE TABLE relay_reports (
    replica     text PRIMARY KEY CHECK (replica <> ''),
    heard       jsonb NOT NULL DEFAULT '{}',
    shards      integer[] NOT NULL DEFAULT '{}',
    reported_at timestamptz NOT NULL
);
