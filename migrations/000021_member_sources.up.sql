-- Who may supply a service's members from each reconciliation source
-- (issue 25): its owning team or an admin names them through the API
-- (PUT /v1/services/{name}/member-sources). The document lists entries
-- {"source": "k8s/<cluster>", "namespaces": [...], "selector": "..."} or
-- {"source": "snapshot/<name>"}; a reconciled endpoint of the service
-- from anywhere else is not admitted (alarm reconcile_unauthorised).
-- A row carries muster's seal (registry/member_sources.go) over its
-- service, version, document, author and time: a row written by hand
-- authorises nothing.
CREATE TABLE member_sources (
    service    text PRIMARY KEY REFERENCES services (name) ON DELETE CASCADE,
    version    bigint NOT NULL CHECK (version > 0),
    document   jsonb NOT NULL,
    updated_by text NOT NULL,
    updated_at timestamptz NOT NULL,
    seal       bytea,
    seal_key   text
);
