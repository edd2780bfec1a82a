-- The transitions table is append-only like audit_events (ADR-02): UPDATE
-- and DELETE were refused from the start (000002); TRUNCATE, which fires no
-- row trigger, is refused here too (issue 15).
CREATE FUNCTION append_only_refuse() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER transitions_no_truncate BEFORE TRUNCATE ON transitions
    FOR EACH STATEMENT EXECUTE FUNCTION append_only_refuse();
