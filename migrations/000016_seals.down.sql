ALTER TABLE shifts DROP COLUMN seal, DROP COLUMN seal_key;
ALTER TABLE overrides DROP COLUMN seal, DROP COLUMN seal_key;
