-- Table breakglass_grants, owned by internal/breakglass (audited, expiring operator grants).

-- name: BreakGlassInsert :one
INSERT INTO breakglass_grants (id, region, operator, role, reason, issued_by, issued_at, expires_at, seal, seal_key)
VALUES (sqlc.arg(id), sqlc.arg(region), sqlc.arg(operator), sqlc.arg(role), sqlc.arg(reason), sqlc.arg(issued_by),
        sqlc.arg(issued_at), sqlc.arg(expires_at), sqlc.arg(seal), sqlc.arg(seal_key))
RETURNING *;

-- name: BreakGlassGet :one
SELECT * FROM breakglass_grants WHERE id = sqlc.arg(id);

-- name: BreakGlassRevoke :one
-- Revokes a grant not revoked yet; no row when it is unknown or already
-- revoked (the caller tells which).
UPDATE breakglass_grants SET revoked_at = sqlc.arg(revoked_at), revoked_by = sqlc.arg(revoked_by)
WHERE id = sqlc.arg(id) AND revoked_at IS NULL
RETURNING *;

-- name: BreakGlassList :many
-- The grants issued since a time, newest first, bounded.
SELECT * FROM breakglass_grants
WHERE issued_at >= sqlc.arg(since)
ORDER BY issued_at DESC, id
LIMIT sqlc.arg(max_rows);

-- name: BreakGlassLive :many
-- The grants not revoked and not expired at now: what the alarm shows.
SELECT * FROM breakglass_grants
WHERE revoked_at IS NULL AND expires_at > sqlc.arg(now)
ORDER BY expires_at, id
LIMIT 100;
