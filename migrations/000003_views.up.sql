-- Views (issue 4): the region-wide view version counter and resolution
-- grants.

-- View versions are reserved in blocks of 1000 (INCREMENT BY): a server
-- takes nextval and owns [v, v+1000). A restarted or second control plane
-- always gets a block above every version already handed out, so a client
-- never sees a version go backwards.
CREATE SEQUENCE view_versions INCREMENT BY 1000 MINVALUE 1 START WITH 1;

-- Which caller services' workloads may resolve a service (ADR-15).
CREATE TABLE service_grants (
    service    text NOT NULL REFERENCES services (name) ON DELETE CASCADE,
    caller     text NOT NULL CHECK (caller ~ '^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$'),
    granted_at timestamptz NOT NULL,
    granted_by text NOT NULL,
    PRIMARY KEY (service, caller)
);
CREATE INDEX service_grants_caller_idx ON service_grants (caller);
