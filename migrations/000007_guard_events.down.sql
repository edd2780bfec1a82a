DROP TABLE IF EXISTS guard_events;
