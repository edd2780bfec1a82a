DROP TABLE IF EXISTS shard_tenures;
DROP FUNCTION IF EXISTS shard_tenures_append_only();
