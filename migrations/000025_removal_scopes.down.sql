ALTER TABLE lease_expiry_confirmations RENAME COLUMN scope TO service;
