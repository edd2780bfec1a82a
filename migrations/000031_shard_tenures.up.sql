-- Which replica may sign views under which version epoch, per shard
-- (internal/tenure). A view's version is epoch << 32 | counter, and the
-- epoch comes from publisher_epochs; a replica records here, in the
-- transaction that hands it an epoch for its publisher, one row for each
-- shard whose lease it holds then (the lease rows are read FOR SHARE, so
-- no take of them can commit in between). A replica that receives a
-- relayed view believes it only if (shard of its service, its epoch) is
-- a row here naming the replica that signed it.
--
-- Rows are sealed by the region's key (seal, key_id), so a row written by
-- hand is not believed; they are never updated (append-only), and a row is
-- pruned once it is a day old and older than every saved view's epoch
-- (no view still current can carry it).
CREATE TABLE shard_tenures (
    shard       integer NOT NULL CHECK (shard >= 0),
    epoch       bigint NOT NULL CHECK (epoch > 0),
    owner       text NOT NULL CHECK (owner <> ''),
    lease_epoch bigint NOT NULL CHECK (lease_epoch >= 0),
    taken_at    timestamptz NOT NULL,
    seal        bytea NOT NULL,
    key_id      text NOT NULL,
    PRIMARY KEY (shard, epoch)
);

CREATE FUNCTION shard_tenures_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'shard_tenures is append-only';
END;
$$;

CREATE TRIGGER shard_tenures_no_update BEFORE UPDATE ON shard_tenures
    FOR EACH ROW EXECUTE FUNCTION shard_tenures_append_only();
