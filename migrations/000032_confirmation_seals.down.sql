ALTER TABLE lease_expiry_confirmations DROP COLUMN IF EXISTS seal, DROP COLUMN IF EXISTS seal_key;
ALTER TABLE reconcile_confirmations DROP COLUMN IF EXISTS seal, DROP COLUMN IF EXISTS seal_key;
ALTER TABLE authz_reload_confirmations DROP COLUMN IF EXISTS seal, DROP COLUMN IF EXISTS seal_key;
