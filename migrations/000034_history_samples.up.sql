-- History samples: the admin UI's per-zone and per-prober sparklines
-- (internal/zonehistory). One replica of the region samples a series
-- kind at a time (the owner of the kind's shard), every 30 s, so every
-- replica reads and draws the same points and a restart (a deploy)
-- keeps the last day. Rows older than a day are deleted by the writer.
--
-- Not sealed: a sample is a record of what muster already published,
-- never an input to a verdict, a guard or a removal; a forged row can
-- only draw a wrong line, which the published views and the transitions
-- (the sealed and fenced records) contradict.
CREATE TABLE history_samples (
    kind     text NOT NULL CHECK (kind IN ('zone', 'prober')),
    series   text NOT NULL CHECK (length(series) BETWEEN 1 AND 253),
    at       timestamptz NOT NULL,
    eligible integer NOT NULL CHECK (eligible >= 0),
    total    integer NOT NULL CHECK (total >= 0),
    unknown  integer NOT NULL CHECK (unknown >= 0),
    state    text NOT NULL DEFAULT '' CHECK (length(state) <= 32),
    PRIMARY KEY (kind, at, series)
);
