DROP TABLE IF EXISTS reconcile_confirmations;
DROP INDEX IF EXISTS instances_source_idx;
