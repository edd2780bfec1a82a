-- Overrides (issue 6, ADR-15): an operator's hand-made eligibility decision
-- about one instance, admitted by the policy package after authorisation, a
-- per-actor rate limit, a justification and the disruption budget. Rows are
-- desired state: never deleted, so the history of who forced what stays
-- queryable next to the audit log.
CREATE TABLE overrides (
    id                   uuid PRIMARY KEY,
    instance_id          uuid NOT NULL REFERENCES instances (id),
    service              text NOT NULL REFERENCES services (name),
    zone                 text NOT NULL,
    action               text NOT NULL
                         CHECK (action IN ('mark_ineligible', 'mark_eligible')),
    -- pending_cosign: refused by the budget, waiting (until cosign_by) for
    -- a second identity; active: applied until expires_at; lifted and
    -- expired are final. An active row past expires_at (or a pending one
    -- past cosign_by) is expired whatever its state says: the sweep only
    -- writes down what readers already compute.
    state                text NOT NULL
                         CHECK (state IN ('pending_cosign', 'active', 'lifted', 'expired')),
    actor                text NOT NULL CHECK (actor <> ''),
    justification        text NOT NULL CHECK (justification <> ''),
    cosigner             text,
    cosign_justification text,
    cosigned_at          timestamptz,
    cosign_by            timestamptz,
    -- The budget refusal that made the override need a co-signer.
    budget_detail        text NOT NULL DEFAULT '',
    created_at           timestamptz NOT NULL,
    expires_at           timestamptz NOT NULL,
    lifted_at            timestamptz,
    lifted_by            text,
    ended_at             timestamptz,
    CHECK (expires_at > created_at),
    CHECK (state <> 'pending_cosign' OR cosign_by IS NOT NULL),
    CHECK ((cosigner IS NULL) = (cosigned_at IS NULL)),
    CHECK (state <> 'lifted' OR (lifted_at IS NOT NULL AND lifted_by IS NOT NULL))
);

-- One override in force per instance (a second must lift the first) is
-- enforced by the policy package under the per-service advisory lock: a
-- row past its expiry may still say active until the sweep writes it down.
CREATE INDEX overrides_active_instance_idx ON overrides (instance_id) WHERE state = 'active';
CREATE INDEX overrides_service_idx ON overrides (service, id);
CREATE INDEX overrides_instance_idx ON overrides (instance_id, id);
CREATE INDEX overrides_actor_idx ON overrides (actor, id);
-- What the evaluator polls and the sweep ends.
CREATE INDEX overrides_live_idx ON overrides (expires_at) WHERE state IN ('active', 'pending_cosign');

-- The shared sliding log of the per-actor rate limits: one row per counted
-- attempt, keyed by actor and scope (e.g. "override:web", "policy:contracts").
-- Every muster replica counts in the same table under an advisory lock on
-- the key, so N replicas enforce one limit, not N.
CREATE TABLE rate_limit_attempts (
    actor text NOT NULL,
    scope text NOT NULL,
    at    timestamptz NOT NULL
);
CREATE INDEX rate_limit_attempts_key_idx ON rate_limit_attempts (actor, scope, at);
CREATE INDEX rate_limit_attempts_at_idx ON rate_limit_attempts (at);
