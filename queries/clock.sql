-- No table: PostgreSQL's own clock, the one clock every replica of a
-- region shares.

-- name: ClockNow :one
-- The database's time now (clock_timestamp(), not the transaction's
-- start): lease times are taken from and judged by it, and each replica
-- measures its own clock's skew against it (db.Monitor).
SELECT clock_timestamp()::timestamptz AS now;
