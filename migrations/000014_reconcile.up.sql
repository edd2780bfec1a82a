-- Existence by reconciliation (ADR-03, issue 19). Reconciled instances carry
-- source 'k8s/<cluster>' or 'snapshot/<name>' and no lease: the orchestrator
-- ends them, never the lease reaper (whose queries all ask for
-- lease_expires_at IS NOT NULL).

-- A reconciler reads the live instances of its source on every pass.
CREATE INDEX instances_source_idx ON instances (source, service)
    WHERE state = 'active';

-- An operator's confirmation that a reconciliation source really lost what
-- its disbelief threshold is holding: the removals held before confirmed_at
-- may go ahead. Desired state (the decision of a person), so logged; the
-- audit log records it too.
CREATE TABLE reconcile_confirmations (
    id           bigserial PRIMARY KEY,
    source       text NOT NULL CHECK (source <> ''),
    confirmed_at timestamptz NOT NULL,
    confirmed_by text NOT NULL,
    reason       text NOT NULL CHECK (reason <> '')
);
CREATE INDEX reconcile_confirmations_source_idx ON reconcile_confirmations (source, confirmed_at);
