package app

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/fence"
)

// ownerAudit appends audit rows a replica writes as the owner of a key
// (the routing control's changes, a peer region's reconciliations): each
// row in a transaction that first checks the tenure this replica holds
// the key under (fence.Fence.Check), so a deposed owner (a pause outlived
// its tenure) appends nothing and its writer drops the row (counted
// here). The tenure is read as the row is appended: the writers ask
// whether they own the key just before, with nothing in between that a
// pause could make stale but the pause itself, which the check covers.
type ownerAudit struct {
	pool   *pgxpool.Pool
	fence  *fence.Fence
	key    func(e audit.Entry) string
	writer string
}

// Append writes e under the tenure of its key, or fails with an error
// fence.IsNotOwner recognises.
func (o ownerAudit) Append(ctx context.Context, now time.Time, e audit.Entry) (audit.Event, error) {
	key := o.key(e)
	tenure, ok := o.fence.Claim(key)
	if !ok {
		o.fence.Dropped(o.writer, 1)
		return audit.Event{}, fmt.Errorf("audit %s as the owner of %s: %w", e.Action, key, fence.ErrNotOwner)
	}
	var ev audit.Event
	err := db.WithTx(ctx, o.pool, func(q *db.Queries) error {
		if err := o.fence.Check(ctx, q, tenure); err != nil {
			return fmt.Errorf("audit %s as the owner of %s: %w", e.Action, key, err)
		}
		var err error
		ev, err = audit.Append(ctx, q, now, e)
		return err
	})
	if fence.IsNotOwner(err) {
		o.fence.Dropped(o.writer, 1)
	}
	return ev, err
}
