-- Table published_views, owned by internal/publisher.

-- name: PublisherEpochNext :one
-- A fresh ownership epoch: above every epoch handed out before.
SELECT nextval('publisher_epochs')::bigint AS epoch;

-- name: PublishedViewPut :batchexec
-- Keeps the newest version of a service's view: a late or replayed write
-- of an older one changes nothing.
INSERT INTO published_views (service, version, view, published_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (service) DO UPDATE
SET version = EXCLUDED.version, view = EXCLUDED.view, published_at = EXCLUDED.published_at
WHERE published_views.version < EXCLUDED.version;

-- name: PublishedViewDelete :batchexec
-- Forgets a removed service's view, unless a newer one was written since.
DELETE FROM published_views WHERE service = $1 AND version <= $2;

-- name: PublishedViewList :many
SELECT service, version, view, published_at FROM published_views ORDER BY service;
