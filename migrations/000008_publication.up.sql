-- Fail-static publication (issue 11): view versions without a database
-- round trip, and each service's last published view kept for a restart.

-- Ownership epochs. A publisher takes one before it publishes anything
-- (and a fresh one when its counter runs out, or when it acquires a
-- service's publication) and publishes version = epoch << 32 | counter,
-- with no I/O per version (see assembler/doc.go, "Versions and deltas").
-- Epochs stop below 2^21, so versions stay below 2^53 and every JSON
-- reader reads them exactly; NO CYCLE makes running out an error, never a
-- version going back.
CREATE SEQUENCE publisher_epochs MINVALUE 1 MAXVALUE 2097151 NO CYCLE;

-- The first epoch lies above every version view_versions handed out: it
-- reserved blocks of 1000 starting at its last value, so every version is
-- below last_value + 1000. Versions published before this migration
-- therefore compare below all those published after it.
SELECT setval('publisher_epochs', (((SELECT last_value FROM view_versions) + 999) >> 32) + 1, false);

DROP SEQUENCE view_versions;

-- The last view each service was published with (its JSON as clients
-- received it), written asynchronously by the publisher and restored into
-- the assembler at start, so that last_instance and the next delta compare
-- with what clients hold. A write never replaces a newer version.
CREATE TABLE published_views (
    service      text PRIMARY KEY,
    version      bigint NOT NULL CHECK (version > 0),
    view         jsonb NOT NULL,
    published_at timestamptz NOT NULL
);
