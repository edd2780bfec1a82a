-- An instance a workload registers gets a credential (issue 25): a random
-- 256-bit secret returned once, in the registration response. Only its
-- SHA-256 is kept (it is high-entropy, so no slow hash is needed); with it
-- the instance proves itself, not just its host, when it renews its lease,
-- deregisters itself or reports about itself. NULL for reconciled
-- instances, endpoints declared by an operator and rows from before this
-- migration: those keep the address proof alone.
--
-- credential_proven records that the instance has presented its credential
-- once (a renewal, a self-report's batch does not write): from then on a
-- renewal without it is not the instance's (registry.Renew).
ALTER TABLE instances
    ADD COLUMN credential_hash bytea CHECK (credential_hash IS NULL OR octet_length(credential_hash) = 32),
    ADD COLUMN credential_proven boolean NOT NULL DEFAULT false;
