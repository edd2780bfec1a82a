-- Services and grants carry muster's seal (registry/authzseal.go), like
-- instances and contracts: an Ed25519 signature by the region's key over
-- a service's name, owner and capabilities, and over a grant's service,
-- caller, grant and revocation. The copy watch, resolve and xDS authorise
-- from, and every decision about who owns a service, use only rows whose
-- seal verifies: a grant inserted by hand shows the service to nobody, an
-- owner changed by hand gives the new team nothing.
--
-- A revocation is a sealed tombstone (revoked_at, revoked_by, sealed with
-- the grant), not a missing row: a grant row deleted by hand revokes
-- nothing. Rows from before the seals are adopted once (seal_adoptions,
-- name 'authz').
ALTER TABLE services ADD COLUMN seal bytea, ADD COLUMN seal_key text;
-- version counts the writes of one (service, caller) row and is sealed
-- with it, so an older sealed row put back over a newer one (a grant over
-- its tombstone) is refused by the copy, whatever the replicas' clocks.
ALTER TABLE service_grants
    ADD COLUMN version bigint NOT NULL DEFAULT 1,
    ADD COLUMN revoked_at timestamptz,
    ADD COLUMN revoked_by text,
    ADD COLUMN seal bytea,
    ADD COLUMN seal_key text;

-- An admin's confirmation that a reload of services and grants which lost
-- more than the disbelief share is what the database should say: every
-- replica's copy releases a hold that began before it. Desired state (the
-- decision of a person), so logged; the audit log also records it.
CREATE TABLE authz_reload_confirmations (
    id           bigserial PRIMARY KEY,
    confirmed_at timestamptz NOT NULL,
    confirmed_by text NOT NULL,
    reason       text NOT NULL CHECK (reason <> '')
);
