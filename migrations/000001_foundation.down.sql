DROP FUNCTION IF EXISTS audit_event_digest(audit_events);
DROP TABLE IF EXISTS audit_events;
DROP FUNCTION IF EXISTS audit_events_seal();
DROP FUNCTION IF EXISTS audit_events_refuse_change();
DROP TABLE IF EXISTS instances;
DROP TABLE IF EXISTS health_contracts;
DROP TABLE IF EXISTS services;
