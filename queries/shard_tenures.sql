-- Table shard_tenures, owned by internal/tenure (who may sign views under which epoch).

-- name: ShardTenureHeld :many
-- The shards owner holds now (by the database's clock) with their lease
-- epochs. FOR SHARE keeps any take of them waiting until the caller's
-- transaction (which records their tenures) ends.
SELECT shard, epoch FROM shard_leases
WHERE owner = sqlc.arg(owner)::text AND expires_at > clock_timestamp()
ORDER BY shard
FOR SHARE;

-- name: ShardTenureRecord :exec
-- Records one tenure; a second record of the same (shard, epoch) (a
-- retried adoption under the same epoch) changes nothing.
INSERT INTO shard_tenures (shard, epoch, owner, lease_epoch, taken_at, seal, key_id)
VALUES (sqlc.arg(shard)::integer, sqlc.arg(epoch)::bigint, sqlc.arg(owner)::text, sqlc.arg(lease_epoch)::bigint,
        clock_timestamp(), sqlc.arg(seal)::bytea, sqlc.arg(key_id)::text)
ON CONFLICT (shard, epoch) DO NOTHING;

-- name: ShardTenureGet :one
SELECT shard, epoch, owner, lease_epoch, seal, key_id FROM shard_tenures
WHERE shard = sqlc.arg(shard)::integer AND epoch = sqlc.arg(epoch)::bigint;

-- name: ShardTenurePrune :execrows
-- Forgets tenures a day old whose epoch is below every saved view's: no
-- view a hub may still serve carries them.
DELETE FROM shard_tenures
WHERE taken_at < clock_timestamp() - interval '1 day'
  AND epoch < (SELECT coalesce(min(version >> 32), 0) FROM published_views);
