ALTER TABLE instances DROP COLUMN sealed_identity;
