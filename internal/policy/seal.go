package policy

import (
	"context"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/seal"
)

// Seals (a hostile database administrator's writes; migration 000016).
//
// The overrides table is the truth of what is in force, and PostgreSQL's
// administrators can write it: without more, an INSERT of a row marking
// instances ineligible, a pending (budget-refused) row set to 'active',
// or an expiry pushed out would take capacity out of the views with no
// operator, no budget check and no audit row. So muster seals every
// override it puts in force (admitted within budget, or co-signed) with
// an Ed25519 signature by the region's signing key, the one that signs
// the audit checkpoints and that PostgreSQL never holds, over the fields
// that decide what the override does; and InForce applies a row only if
// its seal verifies against a trusted key. A row that fails is left out
// (its instance keeps its own verdict: a forged row can remove nothing),
// counted in muster_overrides_unsealed, and logged once.
//
// A seal proves muster put a row in force once, not that it is still in
// force: so every end of an override (lifted, expired) is recorded in the
// audit chain in the transaction that ends it (recordEnd), and InForce
// and the budget leave out every row muster has a record of ending
// (replayed), whatever the row says: a lifted override set back to
// 'active' by hand with its old seal changes nothing, is listed by
// Replayed, counted in muster_overrides_replayed and raised as an
// override_replayed alarm (docs/keys.md, "Replays"). An override deleted
// by hand is gone (that returns capacity, it never removes it).

// Sealer signs seals (package seal): the region's signing key.
type Sealer = seal.Signer

// SealKeys are the public keys seals are trusted from, by key ID.
type SealKeys = seal.Keys

// Reasons a row's seal does not verify.
var (
	ErrUnsealed   = seal.ErrUnsealed
	ErrUnknownKey = seal.ErrUnknownKey
	ErrBadSeal    = seal.ErrBadSeal
)

const sealDomain = "muster override seal v1"

// sealed is what a seal covers, in a fixed order: everything that decides
// which instance an override moves, which way and for how long, and who
// answered for it. State is not in it: a seal is only ever made for an
// override put in force, and only rows in force are read for one.
type sealed struct {
	ID            string `json:"id"`
	InstanceID    string `json:"instance_id"`
	Service       string `json:"service"`
	Zone          string `json:"zone"`
	Action        string `json:"action"`
	Actor         string `json:"actor"`
	Justification string `json:"justification"`
	Cosigner      string `json:"cosigner"`
	CreatedAt     int64  `json:"created_at"` // microseconds since the epoch, as stored
	ExpiresAt     int64  `json:"expires_at"`
}

// sealedOf is what row r's seal covers.
func sealedOf(r db.Override) sealed {
	s := sealed{
		ID: r.ID.String(), InstanceID: r.InstanceID.String(), Service: r.Service, Zone: r.Zone,
		Action: r.Action, Actor: r.Actor, Justification: r.Justification,
		CreatedAt: r.CreatedAt.UnixMicro(), ExpiresAt: r.ExpiresAt.UnixMicro(),
	}
	if r.Cosigner != nil {
		s.Cosigner = *r.Cosigner
	}
	return s
}

// sealRow signs row r, just put in force in q's transaction, and stores
// the seal in the same transaction. Without a Sealer it returns r unsealed.
func sealRow(ctx context.Context, q *db.Queries, s Sealer, r db.Override) (db.Override, error) {
	return seal.Store(ctx, s, sealDomain, "override "+r.ID.String(), sealedOf(r), r, func(sig []byte, kid *string) (db.Override, error) {
		return q.OverrideSeal(ctx, db.OverrideSealParams{ID: r.ID, Seal: sig, SealKey: kid})
	})
}

// recordEnd records the end of override r, just lifted or expired with q
// (audit.RecordEnd), sealed by s.
func recordEnd(ctx context.Context, q *db.Queries, s Sealer, r db.Override) error {
	ended := r.CreatedAt
	if r.EndedAt != nil {
		ended = *r.EndedAt
	}
	return audit.RecordEnd(ctx, q, s, audit.End{Kind: audit.EndOverride, ID: r.ID, State: r.State, EndedAt: ended})
}

// replayed returns which of rows (read as in force) muster has a record
// of ending, trusting the records sealed by keys, in one query; forged
// counts records that do not verify (not believed).
func replayed(ctx context.Context, q *db.Queries, keys SealKeys, rows []db.Override) (ends map[uuid.UUID]audit.End, forged int, err error) {
	ids := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	return audit.Ends(ctx, q, keys, audit.EndOverride, ids)
}

// verifyRow checks row r's seal against keys; with no keys every row
// passes (muster trusts its database, and says so at start).
func verifyRow(k SealKeys, r db.Override) error {
	return k.Verify(sealDomain, sealedOf(r), r.Seal, r.SealKey)
}
