-- A confirmation of a reconciliation source's held removals names the
-- instances it vouches for: it releases a hold only while every instance
-- the hold lacks is among them, so a hold that grows after an operator
-- confirmed it (more absences, perhaps of other teams' services) is not
-- released on that word. A confirmation made before this column had none
-- and releases nothing.
ALTER TABLE reconcile_confirmations ADD COLUMN instances uuid[] NOT NULL DEFAULT '{}';
