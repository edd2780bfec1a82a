-- The identity muster sealed, kept beside the columns (registry/seal.go):
-- a row whose columns were re-pointed by hand is routed as muster sealed
-- it, at a rebuild too, rather than left out. Live sealed rows are filled
-- from their columns; where those were changed by hand already, the value
-- does not verify and changes nothing.
ALTER TABLE instances ADD COLUMN sealed_identity jsonb;

UPDATE instances
SET sealed_identity = jsonb_build_object(
        'id', id::text, 'service', service, 'address', address, 'port', port, 'zone', zone,
        'region', region, 'source', source, 'registered_by', registered_by,
        'created_at', (extract(epoch FROM created_at) * 1000000)::bigint)
WHERE seal IS NOT NULL AND state = 'active';
