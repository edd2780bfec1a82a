ALTER TABLE reconcile_confirmations DROP COLUMN IF EXISTS instances;
