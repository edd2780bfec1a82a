-- Make before break: a replica takes shards only once it can publish
-- them, and an owner hands a shard over instead of letting it go.
--
-- replicas.ready says whether the replica can publish what it would be
-- given (rebuilt, its publisher prepared, its peers' views relayed). The
-- balance shares the shards among the ready live replicas only, so a
-- replica that is starting is sent evidence and relays views but is
-- dealt nothing until it could publish it. The default is true so that a
-- row written by a release that does not know the column (a rolling
-- upgrade) counts as it always did.
--
-- shard_leases.offered_to names the replica the owner offers the shard
-- to. The owner keeps holding, renewing and publishing the shard until
-- the named replica takes it (a new epoch, as any take); the old owner
-- notices the take and keeps publishing until the new owner has
-- published. An offer nobody takes costs nothing: the owner still owns.
ALTER TABLE replicas ADD COLUMN ready boolean NOT NULL DEFAULT true;
ALTER TABLE shard_leases ADD COLUMN offered_to text CHECK (offered_to <> '');
