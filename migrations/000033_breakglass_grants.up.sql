-- Break-glass grants: the audited, expiring way in for an operator while
-- no identity provider can vouch for one (a new region, an IdP outage).
-- `muster breakglass` writes a row, sealed with the region's signing key
-- over every field that decides what the grant allows, and prints a token
-- signed by the same key whose jti is the row's id. The server honours
-- such a token only while its row exists, its seal verifies and matches
-- the token, and it is neither expired nor revoked: an administrator of
-- PostgreSQL (who never holds the key) cannot mint, widen or extend a
-- grant; deleting or editing a row only refuses its token.
--
-- revoked_at is outside the seal: setting it can only refuse. Clearing
-- it again is tampering the audit chain shows (the revocation is there).
CREATE TABLE breakglass_grants (
    id          uuid PRIMARY KEY,
    region      text NOT NULL,
    operator    text NOT NULL CHECK (operator ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$'),
    role        text NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    reason      text NOT NULL CHECK (length(btrim(reason)) > 0 AND length(reason) <= 1024),
    issued_by   text NOT NULL,
    issued_at   timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL CHECK (expires_at > issued_at),
    revoked_at  timestamptz,
    revoked_by  text,
    seal        bytea NOT NULL,
    seal_key    text NOT NULL
);

-- Live grants are few; the alarm lists them every few seconds.
CREATE INDEX breakglass_grants_live_idx ON breakglass_grants (expires_at) WHERE revoked_at IS NULL;
