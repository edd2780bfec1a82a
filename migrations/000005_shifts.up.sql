-- Shift-backs (issue 6, ADR-13): draining traffic away from a zone or the
-- region, and returning it in capped steps. Desired state (ADR-02): every
-- replica reads this table and publishes the same per-zone traffic weight.

-- Every write to shifts takes a fresh revision, so a replica learns of a
-- change made by another by polling max(revision): cheap, and independent
-- of the replicas' clocks.
CREATE SEQUENCE shift_revisions;

CREATE TABLE shifts (
    id            uuid PRIMARY KEY,
    scope         text NOT NULL CHECK (scope IN ('zone', 'region')),
    target        text NOT NULL CHECK (target ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    reason        text NOT NULL CHECK (reason <> ''),
    -- manual: a person declared the failover, so the final step back needs
    -- their confirmation; automatic shifts return on their own timer.
    manual        boolean NOT NULL,
    state         text NOT NULL CHECK (state IN
                  ('draining', 'returning', 'pending_confirmation', 'completed', 'cancelled')),
    -- step counts the steps taken back; weight is the traffic weight the
    -- views publish for the target (0 drained, 1 fully back).
    step          integer NOT NULL CHECK (step >= 0),
    weight        double precision NOT NULL CHECK (weight >= 0 AND weight <= 1),
    started_by    text NOT NULL,
    started_at    timestamptz NOT NULL,
    last_step_at  timestamptz NOT NULL,
    last_step_by  text NOT NULL,
    pending_since timestamptz,
    confirmed_by  text,
    confirmed_at  timestamptz,
    ended_at      timestamptz,
    revision      bigint NOT NULL DEFAULT nextval('shift_revisions'),
    updated_at    timestamptz NOT NULL,
    CHECK (state <> 'pending_confirmation' OR pending_since IS NOT NULL)
);

-- One active shift per target.
CREATE UNIQUE INDEX shifts_active_target_idx ON shifts (scope, target)
    WHERE state IN ('draining', 'returning', 'pending_confirmation');
CREATE INDEX shifts_state_idx ON shifts (state, id);
CREATE INDEX shifts_revision_idx ON shifts (revision);
-- The budget check asks which services have live instances in a zone.
CREATE INDEX instances_zone_idx ON instances (zone, service) WHERE state = 'active';
