-- The evaluator's rebuild reads what is live and what it needs from recent
-- history, never every instance row ever written (issue 26): ids are never
-- reused, so every deploy leaves ended rows behind, millions of them in a
-- region within months. Live rows are read through
-- instances_live_endpoint_idx (state = 'active'); ended ones through this
-- index, from the evaluator's horizon on (ExpiredHorizon), and those with
-- no end time at all (never muster's: every end it writes stamps one).
CREATE INDEX instances_ended_idx ON instances (ended_at, id) WHERE state <> 'active';
