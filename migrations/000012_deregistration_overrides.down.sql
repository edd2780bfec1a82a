-- Deregistrations kept as overrides cannot be described by the older
-- schema; their decisions stay in the audit log.
ALTER TABLE overrides DROP CONSTRAINT IF EXISTS overrides_applied_is_deregister;
ALTER TABLE overrides DROP CONSTRAINT IF EXISTS overrides_deregister_never_active;
DELETE FROM overrides WHERE action = 'deregister';
ALTER TABLE overrides DROP CONSTRAINT overrides_state_check;
ALTER TABLE overrides ADD CONSTRAINT overrides_state_check
    CHECK (state IN ('pending_cosign', 'active', 'lifted', 'expired'));
ALTER TABLE overrides DROP CONSTRAINT overrides_action_check;
ALTER TABLE overrides ADD CONSTRAINT overrides_action_check
    CHECK (action IN ('mark_ineligible', 'mark_eligible'));
