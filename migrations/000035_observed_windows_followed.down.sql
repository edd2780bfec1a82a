DROP INDEX IF EXISTS observed_windows_written_idx;
ALTER TABLE observed_windows DROP COLUMN IF EXISTS writer, DROP COLUMN IF EXISTS written_at;
