-- Lease expiry that cannot mass-expire from muster's own absence (issue 11).

-- An operator's confirmation that the leases a disbelief threshold is
-- holding really ran out: the reaper may expire, in the scope, every lease
-- that had lapsed by confirmed_at. Desired state (the decision of a person),
-- so logged; the audit log also records it.
CREATE TABLE lease_expiry_confirmations (
    id           bigserial PRIMARY KEY,
    -- '' for the whole region, else the service the confirmation covers.
    service      text NOT NULL DEFAULT '',
    confirmed_at timestamptz NOT NULL,
    confirmed_by text NOT NULL,
    reason       text NOT NULL CHECK (reason <> '')
);
CREATE INDEX lease_expiry_confirmations_at_idx ON lease_expiry_confirmations (confirmed_at);

-- The disbelief threshold counts leases expired within the last TTL.
CREATE INDEX instances_expired_idx ON instances (ended_at, service) WHERE state = 'expired';
