DROP TABLE shard_leases;
DROP TABLE replicas;
