-- Stream population (issue 11): each replica's watch subscriber count,
-- written every admission window by its census, so a restarted replica
-- knows the population that is about to reconnect without having seen it
-- (ADR-13: admit 5% of the population per 10 s, not 5% of what this
-- process happens to remember).
--
-- peak is the most subscribers the replica had since peak_at; it is kept
-- for the census horizon (15 min) unless the count reaches it again, so a
-- replica that restarts under the same name finds its old peak still in
-- force while its clients come back. at is the last report: the expected
-- population sums the rows reported within the horizon, and the rows
-- reported within a few windows are the live replicas it is shared by.
CREATE TABLE stream_population (
    replica     text PRIMARY KEY CHECK (replica <> ''),
    subscribers integer NOT NULL CHECK (subscribers >= 0),
    peak        integer NOT NULL CHECK (peak >= subscribers),
    peak_at     timestamptz NOT NULL,
    at          timestamptz NOT NULL
);
