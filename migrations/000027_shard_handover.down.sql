ALTER TABLE shard_leases DROP COLUMN offered_to;
ALTER TABLE replicas DROP COLUMN ready;
