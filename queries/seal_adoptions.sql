-- Table seal_adoptions, owned by internal/registry.

-- name: SealAdoptionLock :exec
-- One adoption at a time across replicas.
SELECT pg_advisory_xact_lock(7150309, hashtext(sqlc.arg(name)::text));

-- name: SealAdoptionGet :one
SELECT * FROM seal_adoptions WHERE name = $1;

-- name: SealAdoptionInsert :exec
INSERT INTO seal_adoptions (name, key_id, rows, at) VALUES ($1, $2, $3, $4);

-- name: SealAdoptionList :many
SELECT * FROM seal_adoptions ORDER BY at;
