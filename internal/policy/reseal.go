package policy

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/seal"
)

// Reseal re-seals, with s, up to limit overrides in force at now, after
// the id after (uuid.Nil: from the start), whose seal is by another key
// and verifies under keys (muster seal rotate). An override no longer in
// force keeps its seal: it is never applied again.
func Reseal(ctx context.Context, q *db.Queries, s seal.Signer, keys seal.Keys, after uuid.UUID, limit int, now time.Time) (seal.Batch, error) {
	rows, err := q.OverrideResealBatch(ctx, db.OverrideResealBatchParams{KeyID: s.KeyID(), After: after, Lim: int32(limit), Now: now})
	if err != nil {
		return seal.Batch{}, fmt.Errorf("read overrides to re-seal: %w", err)
	}
	return seal.ResealRows(ctx, s, keys, sealDomain, rows, limit, func(r db.Override) seal.Row {
		return seal.Row{Name: "override " + r.ID.String(), Value: sealedOf(r), Sig: r.Seal, KeyID: r.SealKey,
			Store: func(sig []byte, kid string) (bool, error) {
				n, err := q.OverrideReseal(ctx, db.OverrideResealParams{ID: r.ID, Seal: sig, SealKey: &kid, OldSeal: r.Seal})
				return n == 1, err
			}}
	}, func(r db.Override) string { return r.ID.String() })
}
