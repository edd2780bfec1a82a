-- Confirmations release what muster holds back from removing (a mass
-- lease expiry, a reconciliation source's absences, a reload of services
-- and grants that lost rows). A row inserted by hand would release them
-- without anyone's authority, audit or rate limit, so each is sealed by
-- the region's key when muster writes it (internal/registry,
-- confirmseal.go) and a replica believes only confirmations whose seal
-- verifies. Rows from before this migration stay unsealed and are not
-- believed: a confirmation only releases holds that began before it, and
-- every hold of a replica running this release began after its start.
ALTER TABLE lease_expiry_confirmations ADD COLUMN seal bytea, ADD COLUMN seal_key text;
ALTER TABLE reconcile_confirmations ADD COLUMN seal bytea, ADD COLUMN seal_key text;
ALTER TABLE authz_reload_confirmations ADD COLUMN seal bytea, ADD COLUMN seal_key text;
