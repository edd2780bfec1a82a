DROP INDEX IF EXISTS transitions_quarantined_until_idx;
ALTER TABLE transitions DROP COLUMN IF EXISTS quarantine_step, DROP COLUMN IF EXISTS quarantined_until;
