DROP INDEX IF EXISTS instances_registered_by_live_idx;
