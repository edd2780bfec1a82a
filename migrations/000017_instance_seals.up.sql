-- An instance carries two seals by the region's key (internal/seal;
-- registry/seal.go): seal over its identity (service, address, port, zone,
-- region, source, registered_by, created_at), made when muster inserts it,
-- and end_seal over its end (state, ended_at), made when muster ends it.
-- The evaluator routes to no instance whose identity seal fails (a row
-- inserted or re-pointed by hand gets no traffic) and honours no end whose
-- end seal fails (a row set to 'deregistered' by hand keeps its traffic),
-- and raises instance_unsealed for each.
ALTER TABLE instances ADD COLUMN seal bytea, ADD COLUMN seal_key text,
                      ADD COLUMN end_seal bytea, ADD COLUMN end_seal_key text;

-- Rows from before the seals are adopted once: the first muster to start
-- with a key after this migration seals every unsealed row as it stands
-- (trust on first use), records it here and in the audit log, and from then
-- on an unsealed row is refused.
CREATE TABLE seal_adoptions (
    name    text PRIMARY KEY,
    key_id  text NOT NULL,
    rows    bigint NOT NULL,
    at      timestamptz NOT NULL
);
