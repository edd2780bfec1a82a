-- Each replica evaluates the services it owns; the others keep their copy
-- of those services' state warm from the windows the owner writes here
-- (internal/evaluator, "follow"). They read what was written since their
-- last read, by the database's clock (the writers' clocks may disagree),
-- and leave out what they wrote themselves.
ALTER TABLE observed_windows
    ADD COLUMN written_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN writer text NOT NULL DEFAULT '';
CREATE INDEX observed_windows_written_idx ON observed_windows (written_at, instance_id, class);
