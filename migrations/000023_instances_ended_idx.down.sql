DROP INDEX IF EXISTS instances_ended_idx;
