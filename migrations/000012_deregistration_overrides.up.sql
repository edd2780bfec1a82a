-- Deregistration by anyone but the instance itself is an override (issue
-- 13, ADR-15): an operator's DELETE of an instance goes through the same
-- checks as mark_ineligible and is kept here with action 'deregister'. It
-- is never in force: within budget (or once co-signed) it ends the
-- instance at once and its row becomes 'applied', a final state only a
-- deregistration reaches. A budget refusal waits as pending_cosign, as any
-- override does. For a deregistration, expires_at is when the request
-- lapses unapplied (cosign_by); the API does not show it.
ALTER TABLE overrides DROP CONSTRAINT overrides_action_check;
ALTER TABLE overrides ADD CONSTRAINT overrides_action_check
    CHECK (action IN ('mark_ineligible', 'mark_eligible', 'deregister'));
ALTER TABLE overrides DROP CONSTRAINT overrides_state_check;
ALTER TABLE overrides ADD CONSTRAINT overrides_state_check
    CHECK (state IN ('pending_cosign', 'active', 'lifted', 'expired', 'applied'));
-- What the evaluator loads (state 'active') is only ever a mark_*.
ALTER TABLE overrides ADD CONSTRAINT overrides_deregister_never_active
    CHECK (action <> 'deregister' OR state <> 'active');
ALTER TABLE overrides ADD CONSTRAINT overrides_applied_is_deregister
    CHECK (state <> 'applied' OR (action = 'deregister' AND ended_at IS NOT NULL));
