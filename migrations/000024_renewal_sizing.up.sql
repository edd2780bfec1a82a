-- The leases each identity registered and still holds: lease renewals are
-- limited per identity, and the limit grows with them (server/limits.go),
-- so a fleet renewing under one identity is never refused for its size
-- (issue 26). Only live leases are indexed: the count is read whenever an
-- identity reaches its limit, and must not scan the ended rows.
CREATE INDEX instances_registered_by_live_idx ON instances (registered_by)
    WHERE state = 'active' AND lease_expires_at IS NOT NULL;
