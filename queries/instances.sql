-- Table instances, owned by internal/registry (others read it through registry functions that take the transaction).

-- name: InstanceListChangedSince :many
-- Instances changed after (updated_at, id), for incremental refresh; pass
-- the zero time and the nil UUID for a full load.
SELECT * FROM instances
WHERE (updated_at, id) > (sqlc.arg(since)::timestamptz, sqlc.arg(after_id)::uuid)
ORDER BY updated_at, id
LIMIT sqlc.arg(lim);

-- name: InstanceNewestChange :one
-- The newest updated_at on record (instances_updated_idx, one entry): the
-- rebuild's incremental refreshes start from it.
SELECT updated_at FROM instances ORDER BY updated_at DESC LIMIT 1;

-- name: InstanceListLive :many
-- Live instances after an endpoint, by endpoint: the rebuild's read of what
-- is in rotation, through instances_live_endpoint_idx, which holds the
-- live rows only however many ended ones the table has.
SELECT * FROM instances
WHERE state = 'active'
  AND (service, address, port) > (sqlc.arg(after_service)::text, sqlc.arg(after_address)::text, sqlc.arg(after_port)::integer)
ORDER BY service, address, port
LIMIT sqlc.arg(lim);

-- name: InstanceListEndedSince :many
-- Ended instances after (ended_at, id), by end: the rebuild's read of the
-- recent ends it needs, from its horizon on (instances_ended_idx).
SELECT * FROM instances
WHERE state <> 'active'
  AND (ended_at, id) > (sqlc.arg(after_at)::timestamptz, sqlc.arg(after_id)::uuid)
ORDER BY ended_at, id
LIMIT sqlc.arg(lim);

-- name: InstanceListEndedUntimed :many
-- Instances that read ended with no end time, by id: muster stamps every
-- end it writes, so these were ended by hand, and the rebuild reads them
-- to keep them in rotation. Ordered as instances_ended_idx is (ended_at
-- is NULL throughout), or the planner prefers walking the primary key
-- through every row.
SELECT * FROM instances
WHERE state <> 'active' AND ended_at IS NULL AND id > sqlc.arg(after)::uuid
ORDER BY ended_at, id
LIMIT sqlc.arg(lim);

-- name: InstanceListByIDs :many
-- The instances among ids, in any state: ingest looks up the ids a report
-- names that the evaluator has not loaded yet (registered a moment ago,
-- perhaps through another replica). Ids with no row are simply absent.
SELECT * FROM instances
WHERE id = ANY(sqlc.arg(ids)::uuid[]);

-- name: InstanceGet :one
SELECT * FROM instances WHERE id = $1;

-- name: InstanceGetForUpdate :one
SELECT * FROM instances WHERE id = $1 FOR UPDATE;

-- name: InstanceStates :many
-- The registry's state of the instances the evaluator holds, read inside a
-- budget decision: its copy may lag behind an instance ended a moment ago.
SELECT id, state FROM instances WHERE id = ANY(sqlc.arg(ids)::uuid[]);

-- name: InstanceListByService :many
-- Keyset pagination by id. Ended instances are listed only when asked for.
SELECT * FROM instances
WHERE service = sqlc.arg(service)
  AND id > sqlc.arg(after)::uuid
  AND (sqlc.arg(include_ended)::boolean OR state = 'active')
ORDER BY id
LIMIT sqlc.arg(lim);

-- name: InstanceListDuring :many
-- A service's instances registered at some time in [since, until), in any
-- state, by id after a cursor: the timeline's rows. An end muster did not
-- stamp (ended by hand) counts as at updated_at. Through
-- instances_service_idx.
SELECT * FROM instances
WHERE service = sqlc.arg(service)
  AND id > sqlc.arg(after)::uuid
  AND created_at < sqlc.arg(until)::timestamptz
  AND (state = 'active' OR COALESCE(ended_at, updated_at) > sqlc.arg(since)::timestamptz)
ORDER BY id
LIMIT sqlc.arg(lim);

-- name: InstanceInsert :one
-- seal is the identity's seal, made before the insert (registry/seal.go);
-- credential_hash the SHA-256 of the instance's credential (NULL: none).
INSERT INTO instances (id, service, address, port, zone, region, source,
                       lease_expires_at, registered_by, created_at, updated_at, seal, seal_key, sealed_identity,
                       credential_hash)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, sqlc.arg(now), sqlc.arg(now), sqlc.narg(seal), sqlc.narg(seal_key),
        sqlc.narg(sealed_identity), sqlc.narg(credential_hash))
RETURNING *;

-- name: LeaseRenew :one
-- proven: the renewal presented the instance's credential, which it then
-- needs from now on (registry.Renew). The lease runs lifetime_us from at,
-- or from PostgreSQL's clock when at is NULL: lease times are the
-- database's, whichever replica took the renewal, so no replica's clock
-- skew shortens or lengthens a lease. updated_at is stamped on the same
-- clock (the evaluators' incremental refresh reads by it), read once so
-- that the lease runs exactly lifetime_us past it.
UPDATE instances SET lease_expires_at = c.at + sqlc.arg(lifetime_us)::bigint * interval '1 microsecond',
                     updated_at = c.at,
                     credential_proven = credential_proven OR sqlc.arg(proven)::boolean
FROM (SELECT COALESCE(sqlc.narg(at)::timestamptz, clock_timestamp()) AS at) AS c
WHERE id = sqlc.arg(id) AND state = 'active'
RETURNING instances.*;

-- name: LeaseCountRegisteredBy :one
-- The live leases one identity registered: its lease renewal limit grows
-- with them (instances_registered_by_live_idx).
SELECT count(*)::int FROM instances
WHERE registered_by = sqlc.arg(registered_by) AND state = 'active' AND lease_expires_at IS NOT NULL;

-- name: InstanceListByIDsForUpdate :many
-- The instances among ids, locked in id order until the transaction ends:
-- a batch of lease renewals decides on each as a single renewal does
-- (InstanceGetForUpdate), and two batches lock in the same order.
SELECT * FROM instances
WHERE id = ANY(sqlc.arg(ids)::uuid[])
ORDER BY id
FOR UPDATE;

-- name: LeaseRenewMany :many
-- Renews many leases in one statement: each id's lease runs lifetime_us
-- from at (PostgreSQL's clock when at is NULL, as LeaseRenew, which
-- stamps updated_at too) unless it
-- already runs longer (a later renewal through another replica), and
-- proven says that its renewal presented the instance's credential
-- (LeaseRenew). The three arrays are zipped (set-returning functions in
-- one select list run in step), so they must be of one length. Ended
-- instances are left alone.
UPDATE instances AS i
SET lease_expires_at = GREATEST(i.lease_expires_at, c.at + v.lifetime_us * interval '1 microsecond'),
    updated_at = c.at,
    credential_proven = i.credential_proven OR v.proven
FROM (SELECT unnest(sqlc.arg(ids)::uuid[]) AS id, unnest(sqlc.arg(lifetime_us)::bigint[]) AS lifetime_us,
             unnest(sqlc.arg(proven)::boolean[]) AS proven) AS v,
     (SELECT COALESCE(sqlc.narg(at)::timestamptz, clock_timestamp()) AS at) AS c
WHERE i.id = v.id AND i.state = 'active' AND i.lease_expires_at IS NOT NULL
RETURNING i.*;

-- name: InstanceEnd :one
-- updated_at is never behind PostgreSQL's clock, whichever replica's clock
-- now is: the other replicas' evaluators read changes by updated_at, and
-- an end stamped behind what they have read would never reach them.
UPDATE instances
SET state = sqlc.arg(state), ended_at = sqlc.arg(now)::timestamptz,
    updated_at = GREATEST(sqlc.arg(now)::timestamptz, clock_timestamp())
WHERE id = $1 AND state = 'active'
RETURNING *;

-- name: LeaseListExpired :many
-- Instances whose lease ran out, locked so that concurrent reapers on several
-- replicas never expire (and audit) one instance twice.
SELECT * FROM instances
WHERE state = 'active' AND lease_expires_at IS NOT NULL
  AND lease_expires_at <= sqlc.arg(now)::timestamptz
ORDER BY lease_expires_at
LIMIT sqlc.arg(lim)
FOR UPDATE SKIP LOCKED;

-- name: InstanceEndLiveEndpoint :many
-- Ends the live instance (if any) holding an endpoint that a new
-- registration claims: a restarted process is a new instance (ADR-03).
UPDATE instances
SET state = 'replaced', ended_at = sqlc.arg(now)::timestamptz, updated_at = sqlc.arg(now)::timestamptz
WHERE service = $1 AND address = $2 AND port = $3 AND state = 'active'
RETURNING *;

-- name: InstancesCopy :copyfrom
-- Bulk load, used by `muster loadgen seed` only (sealed by registry.SealCopy):
-- live rows, and ended ones with their end (ended_at, end_seal).
INSERT INTO instances (id, service, address, port, zone, region, source, state,
                       lease_expires_at, registered_by, created_at, updated_at, seal, seal_key, sealed_identity,
                       ended_at, end_seal, end_seal_key)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18);

-- name: InstanceCountByState :many
-- How many instance rows each state has (muster loadgen rebuild reports
-- what it rebuilt from). A full scan: tools only.
SELECT state, count(*)::bigint AS rows FROM instances GROUP BY state ORDER BY state;

-- name: LeaseListLapsed :many
-- Active leases that ran out by now, oldest first: the reaper's candidates.
-- Not locked: the reaper decides first, then ends each with LeaseExpire.
SELECT id, service, zone, lease_expires_at FROM instances
WHERE state = 'active' AND lease_expires_at IS NOT NULL
  AND lease_expires_at <= sqlc.arg(now)::timestamptz
ORDER BY lease_expires_at
LIMIT sqlc.arg(lim);

-- name: LeaseCountLive :many
-- Active leased instances per service and zone: the disbelief
-- threshold's base.
SELECT service, zone, count(*)::int AS live FROM instances
WHERE state = 'active' AND lease_expires_at IS NOT NULL
GROUP BY service, zone;

-- name: LeaseCountExpiredSince :many
-- Instances ended by lease expiry since a moment, per service and zone.
SELECT service, zone, count(*)::int AS expired FROM instances
WHERE state = 'expired' AND ended_at > sqlc.arg(since)::timestamptz
GROUP BY service, zone;

-- name: LeaseExpire :one
-- Ends one instance whose lease ran out by cutoff, unless a renewal or
-- another reaper got there first (then no row).
UPDATE instances
SET state = 'expired', ended_at = sqlc.arg(now)::timestamptz, updated_at = sqlc.arg(now)::timestamptz
WHERE id = sqlc.arg(id) AND state = 'active' AND lease_expires_at <= sqlc.arg(cutoff)::timestamptz
RETURNING *;

-- name: LeaseCountLapsed :one
-- Active leases that ran out by now in a scope (service and zone '' for
-- any).
SELECT count(*)::int FROM instances
WHERE state = 'active' AND lease_expires_at IS NOT NULL
  AND lease_expires_at <= sqlc.arg(now)::timestamptz
  AND (sqlc.arg(service)::text = '' OR service = sqlc.arg(service)::text)
  AND (sqlc.arg(zone)::text = '' OR zone = sqlc.arg(zone)::text);

-- name: InstanceServicesInZone :many
-- The services with live instances in a zone (a zone drain counts its budget over them).
SELECT DISTINCT service FROM instances
WHERE state = 'active' AND zone = $1
ORDER BY service;

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

-- name: ReconcileSourceLock :exec
-- Serialises one reconciliation source's passes across replicas for the
-- rest of the transaction: every replica reconciles every source, and the
-- second to apply a pass then reads what the first wrote (READ COMMITTED)
-- instead of inserting the same ids and failing its pass.
SELECT pg_advisory_xact_lock(7150308, hashtext(sqlc.arg(source)::text));

-- name: ReconcileInstanceStates :many
-- Whether ids a reading derives already exist (ended ones too: an id is
-- never reused).
SELECT id, state FROM instances WHERE id = ANY(sqlc.arg(ids)::uuid[]);

-- name: InstanceGetLiveEndpoint :one
-- The live instance holding an endpoint of a service, if any: a
-- registration colliding with a reconciled one is refused.
SELECT * FROM instances
WHERE service = $1 AND address = $2 AND port = $3 AND state = 'active';

-- name: InstanceSeal :one
-- Seals an instance's identity as muster inserted it, in that transaction.
UPDATE instances SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key), sealed_identity = sqlc.arg(sealed_identity)
WHERE id = sqlc.arg(id)
RETURNING *;

-- name: InstanceSealEnd :one
-- Seals an instance's end as muster wrote it, in that transaction.
UPDATE instances SET end_seal = sqlc.arg(end_seal), end_seal_key = sqlc.arg(end_seal_key)
WHERE id = sqlc.arg(id)
RETURNING *;

-- name: InstanceListUnsealed :many
-- Rows from before the seals, for their one adoption.
SELECT * FROM instances WHERE seal IS NULL OR (state <> 'active' AND end_seal IS NULL)
ORDER BY id;

-- name: InstanceAnySealed :one
-- Whether any instance was ever sealed: a database that has been is never
-- adopted again (registry/seal.go).
SELECT EXISTS (SELECT 1 FROM instances WHERE seal IS NOT NULL OR end_seal IS NOT NULL) AS sealed;

-- name: InstanceSealCensus :many
-- How many live instances each key sealed (seal_key NULL: unsealed), for
-- the start-up key check and muster seal status.
SELECT seal_key, count(*)::bigint AS rows FROM instances WHERE state = 'active' GROUP BY seal_key;

-- name: InstanceResealBatch :many
-- muster seal rotate: the next live instances, by id, whose identity is
-- sealed by a key other than the new one, locked until their re-seal
-- commits.
SELECT * FROM instances
WHERE state = 'active' AND seal IS NOT NULL AND seal_key IS DISTINCT FROM sqlc.arg(key_id)::text
  AND id > sqlc.arg(after)::uuid
ORDER BY id
LIMIT sqlc.arg(lim)
FOR UPDATE;

-- name: InstanceReseal :execrows
-- Replaces an instance's identity seal with one by the new key, only if
-- the row still carries the seal that was verified.
UPDATE instances SET seal = sqlc.arg(seal), seal_key = sqlc.arg(seal_key), sealed_identity = sqlc.arg(sealed_identity)
WHERE id = sqlc.arg(id) AND seal = sqlc.arg(old_seal) AND state = 'active';

-- name: InstancesVacuum :exec
-- muster loadgen seed, after its bulk load: the visibility map set and the
-- planner's statistics fresh, as in a region's database long in service.
VACUUM (ANALYZE) instances;

-- name: LeaseClockNow :one
-- PostgreSQL's time now (clock_timestamp(), not the transaction's start),
-- the one clock every replica of a region shares: lease times are taken
-- from and judged by it (registry), and each replica measures its own
-- clock's skew against it (db.Monitor).
SELECT clock_timestamp()::timestamptz AS now;
