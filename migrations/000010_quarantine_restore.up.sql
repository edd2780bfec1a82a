-- Quarantines survive a restart (issue 11): the transition that starts a
-- quarantine records when it ends and its escalation step, and the rebuild
-- reads back the newest quarantine per instance among those that ended
-- within the engine's forgiveness window (1 h) or have not ended yet.
-- Both columns are added without a table rewrite (a NULL column and a
-- constant default); the partial index holds quarantine rows only, so the
-- rebuild's read is bounded by recent quarantines, not by the size of the
-- five-year transition log.
ALTER TABLE transitions
    ADD COLUMN quarantined_until timestamptz,
    ADD COLUMN quarantine_step smallint NOT NULL DEFAULT 0;

CREATE INDEX transitions_quarantined_until_idx ON transitions (quarantined_until)
    WHERE quarantined_until IS NOT NULL;
