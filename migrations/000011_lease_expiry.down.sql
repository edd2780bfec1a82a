DROP INDEX IF EXISTS instances_expired_idx;
DROP TABLE IF EXISTS lease_expiry_confirmations;
