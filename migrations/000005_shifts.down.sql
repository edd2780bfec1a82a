DROP INDEX IF EXISTS instances_zone_idx;
DROP TABLE IF EXISTS shifts;
DROP SEQUENCE IF EXISTS shift_revisions;
