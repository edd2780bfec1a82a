-- Table prober_assignments, owned by internal/registry.

-- name: ProberAssignmentsDelete :exec
DELETE FROM prober_assignments WHERE prober = $1;

-- name: ProberAssignmentInsertService :exec
INSERT INTO prober_assignments (prober, service, assigned_at, assigned_by)
VALUES ($1, $2, sqlc.arg(now), sqlc.arg(assigned_by));

-- name: ProberAssignmentInsertInstance :exec
INSERT INTO prober_assignments (prober, instance_id, assigned_at, assigned_by)
VALUES ($1, $2, sqlc.arg(now), sqlc.arg(assigned_by));

-- name: ProberAssignmentsGet :many
SELECT * FROM prober_assignments WHERE prober = $1
ORDER BY service NULLS LAST, instance_id;

-- name: ProberAssignmentsAll :many
SELECT * FROM prober_assignments ORDER BY prober;
