DROP TABLE IF EXISTS authz_reload_confirmations;
DELETE FROM service_grants WHERE revoked_at IS NOT NULL;
ALTER TABLE service_grants DROP COLUMN seal_key, DROP COLUMN seal, DROP COLUMN revoked_by, DROP COLUMN revoked_at, DROP COLUMN version;
ALTER TABLE services DROP COLUMN seal_key, DROP COLUMN seal;
DELETE FROM seal_adoptions WHERE name = 'authz';
