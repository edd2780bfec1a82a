DROP TABLE seal_adoptions;
ALTER TABLE instances DROP COLUMN seal, DROP COLUMN seal_key, DROP COLUMN end_seal, DROP COLUMN end_seal_key;
