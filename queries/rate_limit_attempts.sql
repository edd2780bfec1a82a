-- Table rate_limit_attempts, owned by internal/policy.

-- name: RateLimitLock :exec
-- Serialises every decision about one rate-limit key (actor and scope)
-- across replicas, until the transaction ends. The two-key form keeps
-- these locks apart from the audit chain's one-key lock.
SELECT pg_advisory_xact_lock(7150306, hashtext(sqlc.arg(key)::text));

-- name: RateLimitWindow :one
-- The attempts of one key inside the window, and the oldest of them (now
-- when there are none).
SELECT count(*)::int AS attempts,
       COALESCE(min(at), sqlc.arg(now)::timestamptz)::timestamptz AS oldest
FROM rate_limit_attempts
WHERE actor = sqlc.arg(actor) AND scope = sqlc.arg(scope) AND at > sqlc.arg(since)::timestamptz;

-- name: RateLimitRecord :exec
INSERT INTO rate_limit_attempts (actor, scope, at) VALUES ($1, $2, $3);

-- name: RateLimitPrune :exec
-- Forgets one key's attempts that have left its window.
DELETE FROM rate_limit_attempts
WHERE actor = sqlc.arg(actor) AND scope = sqlc.arg(scope) AND at <= sqlc.arg(before)::timestamptz;

-- name: RateLimitPruneAll :execrows
-- Forgets every attempt older than any window, for keys never used again.
DELETE FROM rate_limit_attempts WHERE at <= sqlc.arg(before)::timestamptz;
