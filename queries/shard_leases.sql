-- Table shard_leases, owned by internal/ownership (one owner per service).

-- name: ShardLeaseList :many
-- Every shard's lease; held says whether it is held now (owner set and
-- not expired by the database's clock).
SELECT shard, owner, epoch, acquired_at, renewed_at, expires_at,
       (owner IS NOT NULL AND expires_at > clock_timestamp())::boolean AS held,
       offered_to
FROM shard_leases
ORDER BY shard;

-- name: ShardLeaseRenew :many
-- Extends the given tenures of owner (epochs[i] is the epoch of
-- shards[i]) by ttl_ms from now, each only while it is still held: same
-- owner, same epoch, not yet expired. A tenure missing from the result is
-- lost.
UPDATE shard_leases AS l
SET renewed_at = clock_timestamp(),
    expires_at = clock_timestamp() + sqlc.arg(ttl_ms)::bigint * interval '1 millisecond'
WHERE l.shard = ANY(sqlc.arg(shards)::integer[])
  AND l.epoch = (sqlc.arg(epochs)::bigint[])[array_position(sqlc.arg(shards)::integer[], l.shard)]
  AND l.owner = sqlc.arg(owner)::text
  AND l.expires_at > clock_timestamp()
RETURNING l.shard, l.epoch, l.acquired_at, l.expires_at;

-- name: ShardLeaseTake :many
-- Takes those of the given shards that are free (never taken, released,
-- or expired by the database's clock) for owner, for ttl_ms, each under a
-- new epoch. Rows another statement holds locked (a rival taker, or the
-- old owner's fenced writer) are skipped, not waited for: the next round
-- looks again.
WITH free AS (
    SELECT f.shard FROM shard_leases AS f
    WHERE f.shard = ANY(sqlc.arg(shards)::integer[])
      AND (f.owner IS NULL OR f.expires_at <= clock_timestamp())
    ORDER BY f.shard
    FOR UPDATE SKIP LOCKED
)
UPDATE shard_leases AS l
SET owner = sqlc.arg(owner)::text,
    epoch = l.epoch + 1,
    acquired_at = clock_timestamp(),
    renewed_at = clock_timestamp(),
    expires_at = clock_timestamp() + sqlc.arg(ttl_ms)::bigint * interval '1 millisecond',
    offered_to = NULL
FROM free
WHERE l.shard = free.shard
RETURNING l.shard, l.epoch, l.acquired_at, l.expires_at;

-- name: ShardLeaseRelease :many
-- Gives up the given tenures of owner (epochs[i] is the epoch of
-- shards[i]): the shard is free at once, and its epoch stays (the next
-- take increments it).
UPDATE shard_leases AS l
SET owner = NULL, acquired_at = NULL, renewed_at = NULL, expires_at = clock_timestamp(), offered_to = NULL
WHERE l.shard = ANY(sqlc.arg(shards)::integer[])
  AND l.epoch = (sqlc.arg(epochs)::bigint[])[array_position(sqlc.arg(shards)::integer[], l.shard)]
  AND l.owner = sqlc.arg(owner)::text
RETURNING l.shard;

-- name: ShardLeaseFence :one
-- The fencing check a writer runs inside its transaction: the row comes
-- back only while owner holds shard under epoch, and FOR SHARE keeps any
-- takeover (an UPDATE of the row) waiting until the writer's transaction
-- ends, so the writer's changes commit before a new owner's tenure begins
-- or not at all.
SELECT shard FROM shard_leases
WHERE shard = sqlc.arg(shard)::integer
  AND epoch = sqlc.arg(epoch)::bigint
  AND owner = sqlc.arg(owner)::text
  AND expires_at > clock_timestamp()
FOR SHARE;

-- name: ShardLeaseReleaseOwner :many
-- Frees every shard the database names for owner when no process under
-- that id has heartbeated within quiet_ms: a replica starting under the
-- id of a killed process takes over its dead tenures at once instead of
-- waiting out their TTL. A live process under the same id (a
-- misconfiguration) keeps its tenures: it heartbeats every round.
UPDATE shard_leases AS l
SET owner = NULL, acquired_at = NULL, renewed_at = NULL, expires_at = clock_timestamp(), offered_to = NULL
WHERE l.owner = sqlc.arg(owner)::text
  AND NOT EXISTS (
    SELECT 1 FROM replicas AS r
    WHERE r.id = sqlc.arg(owner)::text
      AND r.last_seen > clock_timestamp() - sqlc.arg(quiet_ms)::bigint * interval '1 millisecond'
  )
RETURNING l.shard;

-- name: ShardLeaseOffer :many
-- Sets, for the given tenures of owner (epochs[i] is the epoch of
-- shards[i]), whom each is offered to (offered_to[i]; '' withdraws the
-- offer). The owner keeps the lease: an offer changes nothing until the
-- named replica takes it (ShardLeaseTakeOffered).
UPDATE shard_leases AS l
SET offered_to = NULLIF((sqlc.arg(offered_to)::text[])[array_position(sqlc.arg(shards)::integer[], l.shard)], '')
WHERE l.shard = ANY(sqlc.arg(shards)::integer[])
  AND l.epoch = (sqlc.arg(epochs)::bigint[])[array_position(sqlc.arg(shards)::integer[], l.shard)]
  AND l.owner = sqlc.arg(owner)::text
  AND l.expires_at > clock_timestamp()
RETURNING l.shard, l.offered_to;

-- name: ShardLeaseTakeOffered :many
-- Takes, for taker, those of the given shards that their owner offers
-- to it, while the owner's lease is still held: a new epoch, as any take,
-- so the giver's tenure ends here and its fenced writes fail from now on.
-- Rows another statement holds locked (the giver's fenced writer) are
-- skipped, not waited for: the next look takes them.
WITH offered AS (
    SELECT f.shard FROM shard_leases AS f
    WHERE f.shard = ANY(sqlc.arg(shards)::integer[])
      AND f.offered_to = sqlc.arg(taker)::text
      AND f.owner IS NOT NULL AND f.owner <> sqlc.arg(taker)::text
      AND f.expires_at > clock_timestamp()
    ORDER BY f.shard
    FOR UPDATE SKIP LOCKED
)
UPDATE shard_leases AS l
SET owner = sqlc.arg(taker)::text,
    epoch = l.epoch + 1,
    acquired_at = clock_timestamp(),
    renewed_at = clock_timestamp(),
    expires_at = clock_timestamp() + sqlc.arg(ttl_ms)::bigint * interval '1 millisecond',
    offered_to = NULL
FROM offered
WHERE l.shard = offered.shard
RETURNING l.shard, l.epoch, l.acquired_at, l.expires_at;

-- name: ShardLeaseHandovers :many
-- What a handover needs between rounds, in one cheap read: the shards
-- offered to replica (to take), and the current holder of the given
-- shards (the giver's offers, to notice the take).
SELECT shard, owner, epoch, offered_to,
       (owner IS NOT NULL AND expires_at > clock_timestamp())::boolean AS held
FROM shard_leases
WHERE offered_to = sqlc.arg(replica)::text OR shard = ANY(sqlc.arg(shards)::integer[])
ORDER BY shard;

-- name: ShardLeaseHolder :one
-- Who holds shard now (owner, and whether the lease is live by the
-- database's clock), for a writer of records whose tenure ended: its
-- records stand unless another replica holds the shard. FOR SHARE keeps
-- a takeover waiting until the writer's transaction ends, as Fence does.
SELECT owner, (owner IS NOT NULL AND expires_at > clock_timestamp())::boolean AS held
FROM shard_leases
WHERE shard = sqlc.arg(shard)::integer
FOR SHARE;
