-- Sealed membership: whom a replica follows (the relay), deals shards to
-- (the balance), forwards evidence to and counts in the census comes from
-- this table, so a row written by hand must not be believed. Each
-- replica seals its own row's identity (id, address, region and the
-- incarnation, a random name of the process) with the region's signing
-- key when it starts, and writes the seal with every heartbeat;
-- last_seen and ready change every round and are not sealed. A reader
-- believes a row only when its seal verifies (internal/ownership).
--
-- The columns are nullable with no default: a replica of the release
-- before writes none of them (its rows are unsealed, believed only with
-- MUSTER_PEER_TRUST=upgrade), and it leaves a row's seal as it found it
-- when it heartbeats under an id a newer release sealed.
ALTER TABLE replicas
    ADD COLUMN incarnation text,
    ADD COLUMN seal bytea,
    ADD COLUMN seal_key text;
