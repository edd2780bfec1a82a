package seal

import "sync/atomic"

// Trust is the keys a replica believes seals from, as they stand now. A
// replica with keys trusts them for its whole life. A keyless replica
// starts trusting every row (the region has no seals, and muster said so
// at start); the start-up check refuses it a sealed database, but one
// already running when the region's rows become sealed (a keyed replica
// rolled out beside it) is told by its key watch, which calls Seal. From
// then on it trusts no key: an unsealed row fails as ErrUnsealed, exactly
// as on a keyed replica, and a sealed one as ErrUnknownKey (it cannot
// check it). The rows' owners keep what they had verified before, as
// they do for any row that stops verifying: no instance is withdrawn, no
// override or drain is applied or ended, by a row it cannot believe.
//
// A nil *Trust trusts every row, as empty Keys do.
type Trust struct {
	keys   Keys
	sealed atomic.Bool
}

// NewTrust returns a Trust in keys (nil or empty: a keyless replica's).
func NewTrust(keys Keys) *Trust { return &Trust{keys: keys} }

// noKey is what a keyless replica trusts once the region is sealed: a
// set holding no usable key, so Verify refuses every row. Its one entry
// only makes the set non-empty; the ID cannot be a real key's (audit.KeyID
// is hex), and Verify refuses it as unknown.
var noKey = Keys{"\x00keyless": nil}

// Keys returns the keys to verify with now.
func (t *Trust) Keys() Keys {
	if t == nil {
		return nil
	}
	if len(t.keys) == 0 && t.sealed.Load() {
		return noKey
	}
	return t.keys
}

// For returns the keys to verify a row sealed by sig under keyID with. A
// keyless replica that meets a sealed row learns from it that the region
// is sealed: it seals its Trust at once (within the refresh that read the
// row, rather than at the key watch's next count), and verifies this row
// and every later one as a keyed replica trusting no key would.
func (t *Trust) For(sig []byte, keyID *string) Keys {
	if t != nil && len(t.keys) == 0 && len(sig) > 0 && keyID != nil {
		t.Seal()
	}
	return t.Keys()
}

// Keyless reports whether the replica holds no key at all.
func (t *Trust) Keyless() bool { return t == nil || len(t.keys) == 0 }

// Seal tells a keyless Trust that the region's rows are sealed: from now
// on it believes none of them. It reports whether that changed anything
// (false for a replica with keys, or one already told). There is no way
// back short of a restart, which the start-up check then refuses: a
// database administrator who deletes the sealed rows must not thereby
// make a running replica believe hand-written ones again.
func (t *Trust) Seal() bool {
	if t == nil || len(t.keys) != 0 {
		return false
	}
	return t.sealed.CompareAndSwap(false, true)
}

// Sealed reports whether a keyless Trust has been told the region is
// sealed.
func (t *Trust) Sealed() bool { return t != nil && len(t.keys) == 0 && t.sealed.Load() }
