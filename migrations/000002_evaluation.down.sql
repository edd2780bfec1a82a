DROP TABLE IF EXISTS transitions;
DROP TABLE IF EXISTS observed_windows;
DROP INDEX IF EXISTS services_updated_idx;
DROP INDEX IF EXISTS instances_updated_idx;
DROP TABLE IF EXISTS prober_assignments;
