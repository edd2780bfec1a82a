-- Evaluation (issue 3): prober assignments (desired state), observed health
-- windows (observed state, UNLOGGED: losing them costs confidence, never
-- correctness), and the append-only eligibility transition log.

-- Which instances a prober may report about: every instance of an assigned
-- service, or one assigned instance.
CREATE TABLE prober_assignments (
    prober      text NOT NULL CHECK (prober <> ''),
    service     text REFERENCES services (name),
    instance_id uuid REFERENCES instances (id),
    assigned_at timestamptz NOT NULL,
    assigned_by text NOT NULL,
    CHECK ((service IS NULL) <> (instance_id IS NULL))
);
CREATE UNIQUE INDEX prober_assignments_service_idx ON prober_assignments (prober, service) WHERE service IS NOT NULL;
CREATE UNIQUE INDEX prober_assignments_instance_idx ON prober_assignments (prober, instance_id) WHERE instance_id IS NOT NULL;

-- Lets the evaluator pick up registry changes incrementally.
CREATE INDEX instances_updated_idx ON instances (updated_at);
CREATE INDEX services_updated_idx ON services (updated_at);

-- Per-instance, per-class sample counts for one flush window. Written with
-- COPY in batches; read only by the rebuild after a restart.
CREATE UNLOGGED TABLE observed_windows (
    instance_id  uuid NOT NULL,
    class        smallint NOT NULL,
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    successes    integer NOT NULL,
    failures     integer NOT NULL,
    hard_failures integer NOT NULL,
    unobservable integer NOT NULL,
    reporters    integer NOT NULL
);
CREATE INDEX observed_windows_end_idx ON observed_windows (window_end, instance_id, class);

-- Every eligibility transition, for audit and incident reconstruction.
CREATE TABLE transitions (
    id          bigserial PRIMARY KEY,
    instance_id uuid NOT NULL,
    service     text NOT NULL,
    from_state  text NOT NULL,
    to_state    text NOT NULL,
    weight      double precision NOT NULL,
    at          timestamptz NOT NULL,
    reason      text NOT NULL,
    history     jsonb
);
CREATE INDEX transitions_instance_idx ON transitions (instance_id, at);
CREATE INDEX transitions_service_idx ON transitions (service, at);

CREATE TRIGGER transitions_append_only BEFORE UPDATE OR DELETE ON transitions
    FOR EACH ROW EXECUTE FUNCTION audit_events_refuse_change();
