package policy

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/musterhq/muster/internal/db"
)

// Seals (issue 16's hostile-administrator review; migration 000016).
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
// What a seal does not cover: a sealed override lifted and then set back
// to 'active' by hand is applied again until its own expiry (it was
// authorised for that window once); an override deleted or lifted by hand
// is gone (that returns capacity, it never removes it).

// Sealer signs seals: the region's signing key (audit.KeyFileSigner, or
// a KMS behind the same interface).
type Sealer interface {
	KeyID() string
	Public() ed25519.PublicKey
	Sign(ctx context.Context, msg []byte) ([]byte, error)
}

// SealKeys are the public keys seals are trusted from, by key ID
// (audit.KeyID): the Sealer's own, and a rotated-out key's until the
// overrides it sealed have expired.
type SealKeys map[string]ed25519.PublicKey

// With returns k with s's key added (s may be nil).
func (k SealKeys) With(s Sealer) SealKeys {
	out := maps.Clone(k)
	if out == nil {
		out = SealKeys{}
	}
	if s != nil {
		out[s.KeyID()] = s.Public()
	}
	return out
}

const sealDomain = "muster override seal v1\x00"

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

// sealMessage is the exact bytes a seal signs for row r.
func sealMessage(r db.Override) ([]byte, error) {
	s := sealed{
		ID: r.ID.String(), InstanceID: r.InstanceID.String(), Service: r.Service, Zone: r.Zone,
		Action: r.Action, Actor: r.Actor, Justification: r.Justification,
		CreatedAt: r.CreatedAt.UnixMicro(), ExpiresAt: r.ExpiresAt.UnixMicro(),
	}
	if r.Cosigner != nil {
		s.Cosigner = *r.Cosigner
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("seal of override %s: %w", r.ID, err)
	}
	return append([]byte(sealDomain), b...), nil
}

// seal signs row r, just put in force in q's transaction, and stores the
// seal in the same transaction. Without a Sealer it returns r unsealed.
func seal(ctx context.Context, q *db.Queries, s Sealer, r db.Override) (db.Override, error) {
	if s == nil {
		return r, nil
	}
	msg, err := sealMessage(r)
	if err != nil {
		return db.Override{}, err
	}
	sig, err := s.Sign(ctx, msg)
	if err != nil {
		return db.Override{}, fmt.Errorf("seal override %s: %w", r.ID, err)
	}
	id := s.KeyID()
	out, err := q.OverrideSeal(ctx, db.OverrideSealParams{ID: r.ID, Seal: sig, SealKey: &id})
	if err != nil {
		return db.Override{}, fmt.Errorf("store the seal of override %s: %w", r.ID, err)
	}
	return out, nil
}

// Reasons a row's seal does not verify.
var (
	ErrUnsealed   = errors.New("not sealed by muster")
	ErrUnknownKey = errors.New("sealed by a key muster does not trust")
	ErrBadSeal    = errors.New("its seal does not match the row (changed outside muster)")
)

// verify checks row r's seal against keys. With no keys (none configured:
// muster trusts its database, and says so at start) every row passes.
func (k SealKeys) verify(r db.Override) error {
	if len(k) == 0 {
		return nil
	}
	if len(r.Seal) == 0 || r.SealKey == nil {
		return ErrUnsealed
	}
	pub, ok := k[*r.SealKey]
	if !ok {
		return fmt.Errorf("%w (key %q)", ErrUnknownKey, *r.SealKey)
	}
	msg, err := sealMessage(r)
	if err != nil {
		return err
	}
	if !ed25519.Verify(pub, msg, r.Seal) {
		return ErrBadSeal
	}
	return nil
}
