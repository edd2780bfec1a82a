-- One removal rule (issue 26): lease expiry is held, and confirmed, in
-- zones and probers as well as the region and services.

-- A confirmation's scope: '' for the region, a service's name (as before),
-- 'zone:<zone>' or 'prober:<name>' (service names never hold a colon).
ALTER TABLE lease_expiry_confirmations RENAME COLUMN service TO scope;
