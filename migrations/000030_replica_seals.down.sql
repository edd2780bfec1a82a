ALTER TABLE replicas DROP COLUMN seal_key, DROP COLUMN seal, DROP COLUMN incarnation;
