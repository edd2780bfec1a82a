-- An override in force carries muster's seal: an Ed25519 signature, by
-- the region's signing key (the audit checkpoints' key, which PostgreSQL
-- never holds), over the fields that decide what it does (policy/seal.go).
-- muster applies an override only when its seal verifies, so a row
-- written by anyone but muster (a database administrator's INSERT, a
-- pending row set to 'active', an expiry pushed out) removes no capacity.
-- Rows from before this column have none: with a key configured they are
-- not applied (each instance falls back to its own verdict) and are
-- listed as unsealed until lifted or issued again.
ALTER TABLE overrides ADD COLUMN seal bytea, ADD COLUMN seal_key text;
