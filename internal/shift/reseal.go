package shift

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/seal"
)

// Reseal re-seals, with s, up to limit shifts in force after the id after
// (uuid.Nil: from the start) whose seal is by another key and verifies
// under keys (muster seal rotate). The shifts' revisions stay: what they
// do has not changed, so no replica reloads them for it.
func Reseal(ctx context.Context, q *db.Queries, s seal.Signer, keys seal.Keys, after uuid.UUID, limit int) (seal.Batch, error) {
	rows, err := q.ShiftResealBatch(ctx, db.ShiftResealBatchParams{KeyID: s.KeyID(), After: after, Lim: int32(limit)})
	if err != nil {
		return seal.Batch{}, fmt.Errorf("read shifts to re-seal: %w", err)
	}
	return seal.ResealRows(ctx, s, keys, sealDomain, rows, limit, func(r db.Shift) seal.Row {
		return seal.Row{Name: "shift " + r.ID.String(), Value: sealedOf(r), Sig: r.Seal, KeyID: r.SealKey,
			Store: func(sig []byte, kid string) (bool, error) {
				n, err := q.ShiftReseal(ctx, db.ShiftResealParams{ID: r.ID, Seal: sig, SealKey: &kid, OldSeal: r.Seal})
				return n == 1, err
			}}
	}, func(r db.Shift) string { return r.ID.String() })
}
