-- The rows that take capacity out of the views carry muster's seal: an
-- Ed25519 signature, by the region's signing key (the audit checkpoints'
-- key, which PostgreSQL never holds), over the fields that decide what the
-- row does (internal/seal; policy/seal.go, shift/seal.go). muster applies
-- an override in force or an active shift only when its seal verifies, so
-- a row written by anyone but muster (a database administrator's INSERT, a
-- pending override set to 'active', an expiry pushed out, a shift's weight
-- set to 0) removes no capacity.
--
-- Rows from before these columns have none: with a key configured they are
-- not applied (each instance falls back to its own verdict, each zone to
-- full traffic) and are listed as unsealed until ended or issued again.
ALTER TABLE overrides ADD COLUMN seal bytea, ADD COLUMN seal_key text;
ALTER TABLE shifts ADD COLUMN seal bytea, ADD COLUMN seal_key text;
