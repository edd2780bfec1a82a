-- Desired state (ADR-02): services, health contracts, instances and leases.
-- Audit (ADR-15): an append-only, hash-chained log of every policy change.

CREATE TABLE services (
    name         text PRIMARY KEY
                 CHECK (name ~ '^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$'),
    owner        text NOT NULL CHECK (owner <> ''),
    capabilities text[] NOT NULL
                 CHECK (capabilities <@ ARRAY['probe','self','passive','readiness']::text[]),
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);

-- One current contract per service. The document is validated by the registry
-- package before it is written; version increments on every change and serves
-- as the ETag for optimistic concurrency.
CREATE TABLE health_contracts (
    service    text PRIMARY KEY REFERENCES services (name) ON DELETE CASCADE,
    version    bigint NOT NULL CHECK (version > 0),
    document   jsonb NOT NULL,
    updated_at timestamptz NOT NULL,
    updated_by text NOT NULL
);

-- Instances are never deleted, so an id is never reused (ADR-03): a
-- deregistered or expired instance keeps its row with its final state.
CREATE TABLE instances (
    id               uuid PRIMARY KEY,
    service          text NOT NULL REFERENCES services (name),
    address          text NOT NULL,
    port             integer NOT NULL CHECK (port BETWEEN 1 AND 65535),
    zone             text NOT NULL,
    region           text NOT NULL,
    source           text NOT NULL,
    state            text NOT NULL DEFAULT 'active'
                     CHECK (state IN ('active', 'deregistered', 'expired', 'replaced')),
    lease_expires_at timestamptz,
    registered_by    text NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    ended_at         timestamptz,
    CHECK (source <> 'registered' OR lease_expires_at IS NOT NULL)
);

CREATE INDEX instances_service_idx ON instances (service, id);
CREATE INDEX instances_lease_idx ON instances (lease_expires_at)
    WHERE state = 'active' AND lease_expires_at IS NOT NULL;
-- Two live instances of one service cannot claim the same endpoint.
CREATE UNIQUE INDEX instances_live_endpoint_idx ON instances (service, address, port)
    WHERE state = 'active';

CREATE TABLE audit_events (
    seq         bigint PRIMARY KEY,
    at          timestamptz NOT NULL,
    actor_kind  text NOT NULL,
    actor       text NOT NULL,
    action      text NOT NULL,
    target_kind text NOT NULL,
    target      text NOT NULL,
    outcome     text NOT NULL CHECK (outcome IN ('accepted', 'refused')),
    reason      text NOT NULL DEFAULT '',
    before      jsonb,
    after       jsonb,
    prev_hash   bytea NOT NULL,
    hash        bytea NOT NULL
);

CREATE INDEX audit_events_actor_idx ON audit_events (actor, seq);
CREATE INDEX audit_events_target_idx ON audit_events (target_kind, target, seq);
CREATE INDEX audit_events_action_idx ON audit_events (action, seq);

-- audit_event_digest is the one definition of what a row's hash covers. The
-- insert trigger and `muster audit verify` both call it, so the canonical form
-- lives in exactly one place. Timestamps are hashed as epoch microseconds and
-- JSON as jsonb's own canonical text, so neither the session time zone nor
-- key order can change a digest.
CREATE FUNCTION audit_event_digest(e audit_events) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT sha256(convert_to(jsonb_build_array(
        e.seq,
        (extract(epoch FROM e.at) * 1000000)::bigint,
        e.actor_kind, e.actor, e.action, e.target_kind, e.target,
        e.outcome, e.reason, e.before, e.after,
        encode(e.prev_hash, 'hex')
    )::text, 'UTF8'))
$$;

CREATE FUNCTION audit_events_seal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.hash := audit_event_digest(NEW);
    RETURN NEW;
END
$$;

CREATE TRIGGER audit_events_seal BEFORE INSERT ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_seal();

CREATE FUNCTION audit_events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER audit_events_append_only BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_refuse_change();

CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_refuse_change();
