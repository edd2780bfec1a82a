ALTER TABLE health_contracts DROP COLUMN seal, DROP COLUMN seal_key;
