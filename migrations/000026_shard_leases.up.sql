-- One owner per service (issue 27): services are spread over a fixed set
-- of virtual shards, and each shard is owned by one replica at a time
-- through a lease row here (internal/ownership, see its doc.go).
--
-- Every time in these tables is the DATABASE's clock, never a replica's:
-- replicas compare against one clock, so skew between their clocks cannot
-- let two of them believe they hold the same shard. The queries
-- (queries/shard_leases.sql) use clock_timestamp(), not now(): now() is
-- the transaction's start, and a statement that waited for a row lock
-- (behind a fenced writer's FOR SHARE) would compare with the time it
-- began waiting. Every statement that changes a held lease names the
-- tenure, (shard, epoch), not only the owner, so a replica never renews
-- or releases a tenure it did not take itself. No advisory locks and no
-- LISTEN: neither survives an Aurora failover or a transaction pooler,
-- and a row does.

-- The replicas of the region, as each last reported itself. A replica is
-- live while last_seen is within a lease TTL; the balance shares the
-- shards among the live ones. address is where peers reach it (replica-
-- to-replica relaying, later); region is informational.
CREATE TABLE replicas (
    id         text PRIMARY KEY CHECK (id <> ''),
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL,
    address    text NOT NULL DEFAULT '',
    region     text NOT NULL DEFAULT ''
);

-- One lease per shard. The rows are the shard set: every replica reads
-- how many shards there are from here, so two replicas can never hash a
-- service with different shard counts. owner is the holding replica (NULL
-- when never taken or released); a lease whose expires_at has passed is
-- free whoever is named. epoch grows by one every time a replica takes
-- the shard (never on renew or release), so (shard, epoch) names one
-- tenure and is the fencing token a deposed owner's writes are refused by.
-- expires_at is when the lease runs or ran out; for a free shard, when it
-- became free (released, or seeded here).
CREATE TABLE shard_leases (
    shard       integer PRIMARY KEY CHECK (shard >= 0),
    owner       text CHECK (owner <> ''),
    epoch       bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    acquired_at timestamptz,
    renewed_at  timestamptz,
    expires_at  timestamptz NOT NULL,
    CHECK ((owner IS NULL) = (acquired_at IS NULL) AND (owner IS NULL) = (renewed_at IS NULL))
);

-- 64 shards: at 3 replicas 21 or 22 each, at 10 replicas 6 or 7; a
-- service's move costs one shard's rebuild, not a replica's. Changing the
-- count reassigns every service and needs every replica stopped.
INSERT INTO shard_leases (shard, expires_at) SELECT s, now() FROM generate_series(0, 63) AS s;
