package seal

import (
	"context"
	"errors"
	"fmt"
)

// Rotation (muster seal rotate): the live rows sealed by a key other than
// the signing key are re-sealed by it, batch by batch, each batch in its
// own transaction with its rows locked, so that the old key can be
// retired. A row is re-sealed only if its seal verifies under the keys
// trusted now: rotation never launders a row written by hand into one
// the new key vouches for. Each owning package walks its own table
// (registry.Reseal*, policy.Reseal, shift.Reseal) with the helper below.

// Batch is what one batch of a table's rotation did.
type Batch struct {
	// Resealed counts the rows now sealed by the signing key.
	Resealed int
	// Refused names the rows left as they are because their seal does not
	// verify (written outside muster, or by a key not trusted): they stay
	// refused and alarmed, as before the rotation.
	Refused []string
	// Changed counts rows that changed between the read and the re-seal
	// (their new seal is muster's own already).
	Changed int
	// Next is the cursor the next batch starts after; Done says the table
	// has no rows after it.
	Next string
	Done bool
}

// ErrNoTrust: a rotation was asked to trust no key, under which every row
// would pass unverified.
var ErrNoTrust = errors.New("seal rotate: no trusted key: every row would pass unverified")

// Row is one row of a rotation batch, as its owner describes it.
type Row struct {
	Name  string // for Refused and errors ("instance 0190…")
	Value any    // what the row's seal covers, as the owner seals it
	Sig   []byte
	KeyID *string
	// Store writes the new seal if the row still carries Sig, reporting
	// whether it did.
	Store func(sig []byte, keyID string) (bool, error)
}

// Reseal re-seals, in domain, each of rows whose seal verifies under
// keys, with s. The caller runs it inside the batch's transaction.
func Reseal(ctx context.Context, s Signer, keys Keys, domain string, rows []Row) (Batch, error) {
	var b Batch
	if s == nil {
		return b, errors.New("seal rotate: no signing key")
	}
	if len(keys) == 0 {
		return b, ErrNoTrust
	}
	for _, r := range rows {
		if err := keys.Verify(domain, r.Value, r.Sig, r.KeyID); err != nil {
			b.Refused = append(b.Refused, fmt.Sprintf("%s (%v)", r.Name, err))
			continue
		}
		sig, kid, err := Sign(ctx, s, domain, r.Value)
		if err != nil {
			return b, err
		}
		ok, err := r.Store(sig, kid)
		if err != nil {
			return b, fmt.Errorf("re-seal %s: %w", r.Name, err)
		}
		if ok {
			b.Resealed++
		} else {
			b.Changed++
		}
	}
	return b, nil
}

// ResealRows is Reseal over one batch of a table as its owner read it
// (up to limit rows, in cursor order): row describes each, and cursor
// names a row for Batch.Next; a batch shorter than limit is the table's
// last (Batch.Done).
func ResealRows[R any](ctx context.Context, s Signer, keys Keys, domain string, rows []R, limit int, row func(R) Row, cursor func(R) string) (Batch, error) {
	batch := make([]Row, len(rows))
	for i, r := range rows {
		batch[i] = row(r)
	}
	b, err := Reseal(ctx, s, keys, domain, batch)
	if err != nil {
		return b, err
	}
	if len(rows) > 0 {
		b.Next = cursor(rows[len(rows)-1])
	}
	b.Done = len(rows) < limit
	return b, nil
}
