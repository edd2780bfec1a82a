ALTER TABLE instances DROP COLUMN credential_hash, DROP COLUMN credential_proven;
