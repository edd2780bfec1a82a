ALTER TABLE overrides DROP COLUMN seal, DROP COLUMN seal_key;
