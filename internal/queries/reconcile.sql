-- name: ReconcileListLive :many
-- The live instances of one reconciliation source: what its last applied
-- reading left in the registry.
SELECT * FROM instances
WHERE source = sqlc.arg(source) AND state = 'active'
ORDER BY service, id;

-- name: ReconcileListLiveInServices :many
-- The live instances of some services, whatever their source: the
-- reconciliation diff compares them with what the sources report.
SELECT * FROM instances
WHERE service = ANY(sqlc.arg(services)::text[]) AND state = 'active'
ORDER BY service, id;

-- name: ReconcileInstanceStates :many
-- Whether ids a reading derives already exist (ended ones too: an id is
-- never reused).
SELECT id, state FROM instances WHERE id = ANY(sqlc.arg(ids)::uuid[]);

-- name: InstanceGetLiveEndpoint :one
-- The live instance holding an endpoint of a service, if any: a
-- registration colliding with a reconciled one is refused.
SELECT * FROM instances
WHERE service = $1 AND address = $2 AND port = $3 AND state = 'active';

-- name: ReconcileConfirmationInsert :one
INSERT INTO reconcile_confirmations (source, confirmed_at, confirmed_by, reason)
VALUES ($1, $2, $3, $4)
RETURNING *;

-- name: ReconcileConfirmationLatest :one
-- The newest confirmation of a source.
SELECT * FROM reconcile_confirmations
WHERE source = $1
ORDER BY confirmed_at DESC
LIMIT 1;
