// Package seal signs the rows of desired state that decide where traffic
// goes (an instance's identity and its end, overrides in force,
// shift-backs), so that muster acts only on what it wrote itself.
//
// PostgreSQL's administrators can write every table. The API's checks
// (authorisation, rate limits, the disruption budget, the audit record)
// guard muster's own writes; a row written straight into a table passes
// none of them. So the package that owns such a table seals each row it
// puts in force with an Ed25519 signature by the region's signing key
// (the audit checkpoints' key, which PostgreSQL never holds) over the
// fields that decide what the row does, and applies a row only if its
// seal verifies. A row that does not verify is treated as absent: it
// never removes capacity, and its owner raises an alarm.
//
// A seal is over a domain string (naming the table and the version of the
// encoding) and the JSON of a struct the owner defines, so a seal of one
// kind of row can never pass for another.
package seal

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
)

// Signer signs seals: the region's signing key (audit.KeyFileSigner, or a
// KMS behind the same interface).
type Signer interface {
	KeyID() string
	Public() ed25519.PublicKey
	Sign(ctx context.Context, msg []byte) ([]byte, error)
}

// Keys are the public keys seals are trusted from, by key ID
// (audit.KeyID): the Signer's own, and a rotated-out key's until the rows
// it sealed are over. Empty Keys trust every row: no key is configured,
// and muster says so at start.
type Keys map[string]ed25519.PublicKey

// With returns k with s's key added (s may be nil).
func (k Keys) With(s Signer) Keys {
	out := maps.Clone(k)
	if out == nil {
		out = Keys{}
	}
	if s != nil {
		out[s.KeyID()] = s.Public()
	}
	return out
}

// Reasons a row's seal does not verify.
var (
	ErrUnsealed   = errors.New("not sealed by muster")
	ErrUnknownKey = errors.New("sealed by a key muster does not trust")
	ErrBadSeal    = errors.New("its seal does not match the row (changed outside muster)")
)

// Message is the exact bytes a seal of v signs in domain.
func Message(domain string, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("seal %s: %w", domain, err)
	}
	return append([]byte(domain+"\x00"), b...), nil
}

// Sign seals v in domain with s, returning the signature and the key's ID.
func Sign(ctx context.Context, s Signer, domain string, v any) (sig []byte, keyID string, err error) {
	msg, err := Message(domain, v)
	if err != nil {
		return nil, "", err
	}
	if sig, err = s.Sign(ctx, msg); err != nil {
		return nil, "", fmt.Errorf("seal %s: %w", domain, err)
	}
	return sig, s.KeyID(), nil
}

// Store seals v in domain with s and hands the seal to store, which
// writes it beside the row in the caller's transaction and returns the
// row as stored. what names the row in errors ("override 0190…"). A nil
// Signer stores nothing and returns unsealed, unchanged.
func Store[R any](ctx context.Context, s Signer, domain, what string, v any, unsealed R, store func(sig []byte, keyID *string) (R, error)) (R, error) {
	if s == nil {
		return unsealed, nil
	}
	sig, kid, err := Sign(ctx, s, domain, v)
	if err != nil {
		return unsealed, fmt.Errorf("seal %s: %w", what, err)
	}
	out, err := store(sig, &kid)
	if err != nil {
		return unsealed, fmt.Errorf("store the seal of %s: %w", what, err)
	}
	return out, nil
}

// Verify checks sig, by the key named keyID, over v in domain. With no
// keys every row passes.
func (k Keys) Verify(domain string, v any, sig []byte, keyID *string) error {
	if len(k) == 0 {
		return nil
	}
	if len(sig) == 0 || keyID == nil {
		return ErrUnsealed
	}
	pub, ok := k[*keyID]
	if !ok || len(pub) != ed25519.PublicKeySize { // (noKey's entry holds none)
		return fmt.Errorf("%w (key %q)", ErrUnknownKey, *keyID)
	}
	msg, err := Message(domain, v)
	if err != nil {
		return err
	}
	if !ed25519.Verify(pub, msg, sig) {
		return ErrBadSeal
	}
	return nil
}

// Memo remembers the seals that verified, so that rows read again
// unchanged (a refresh reads its whole table every second) are not
// verified again: a row is remembered by its exact sealed bytes, seal and
// key, so any change to it is verified afresh. A full read of a table
// calls Next first; what that pass does not meet again is forgotten, so
// the memo holds no more than one table's rows.
type Memo struct {
	mu        sync.Mutex
	prev, cur map[string]struct{}
}

// Next starts a pass: only the seals it meets are kept after it.
func (m *Memo) Next() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.prev, m.cur = m.cur, nil
}

// Verify is k.Verify, remembered.
func (m *Memo) Verify(k Keys, domain string, v any, sig []byte, keyID *string) error {
	if len(k) == 0 || len(sig) == 0 || keyID == nil {
		return k.Verify(domain, v, sig, keyID)
	}
	msg, err := Message(domain, v)
	if err != nil {
		return err
	}
	seen := *keyID + "\x00" + string(sig) + "\x00" + string(msg)
	m.mu.Lock()
	_, ok := m.cur[seen]
	if !ok {
		_, ok = m.prev[seen]
	}
	m.mu.Unlock()
	if !ok {
		if err := k.Verify(domain, v, sig, keyID); err != nil {
			return err
		}
	}
	m.mu.Lock()
	if m.cur == nil {
		m.cur = map[string]struct{}{}
	}
	m.cur[seen] = struct{}{}
	m.mu.Unlock()
	return nil
}
