-- A health contract carries muster's seal (registry/seal.go): an Ed25519
-- signature by the region's key over its service, version, document,
-- author and time, made when muster writes it. The evaluator applies a
-- contract only when its seal verifies: one written by hand (a threshold
-- set to drain on the first failure, a minimum healthy fraction lowered)
-- is not applied; the service keeps the contract it had, or the platform
-- defaults at a rebuild. Contracts from before the seal are adopted once,
-- like instances (seal_adoptions).
ALTER TABLE health_contracts ADD COLUMN seal bytea, ADD COLUMN seal_key text;
