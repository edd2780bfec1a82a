package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/musterhq/muster/db"
)

// The evaluator's rebuild reads the instances through these,
// and InstancesChangedSince after it.

// NewestInstanceChange returns the newest updated_at of any instance row,
// and false when there is none.
func (r *Registry) NewestInstanceChange(ctx context.Context) (time.Time, bool, error) {
	t, err := db.New(r.cfg.Pool).InstanceNewestChange(ctx)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read the newest instance change: %w", err)
	}
	return t, true, nil
}

// RebuildCursor is where a read of InstancesToRebuild stands: the zero
// value starts one, Done says it is over.
type RebuildCursor struct {
	phase int
	// live: the last endpoint returned; untimed: the last id; ended: the
	// last (ended_at, id).
	service, address string
	port             int32
	at               time.Time
	id               uuid.UUID
}

// The phases of a rebuild's read, in order.
const (
	rebuildLive = iota
	rebuildUntimed
	rebuildEnded
	rebuildDone
)

// Done reports whether the read is over.
func (c RebuildCursor) Done() bool { return c.phase >= rebuildDone }

// InstancesToRebuild returns the next instances (at most limit) an
// evaluator rebuilding its state needs, and the cursor to pass next: every
// live one, every one that reads ended without an end time (muster stamps
// every end it writes, so that end was written by hand, and the rebuild
// keeps the instance), and every one ended at or after endedSince (the
// evaluator's horizon). Each comes through an index holding those rows
// only, so the read costs what is live and recent, never every row ever
// written (ids are never reused: ended rows only accumulate). A batch may
// be empty before the end. A row that changes during the read may come
// twice (live, then ended) or in its newer state only; the caller's
// incremental refreshes, from before the read began, catch up with it.
func (r *Registry) InstancesToRebuild(ctx context.Context, endedSince time.Time, c RebuildCursor, limit int) ([]Instance, RebuildCursor, error) {
	q := db.New(r.cfg.Pool)
	lim := int32(limit)
	var rows []db.Instance
	var err error
	switch c.phase {
	case rebuildLive:
		rows, err = q.InstanceListLive(ctx, db.InstanceListLiveParams{AfterService: c.service, AfterAddress: c.address, AfterPort: c.port, Lim: lim})
		if n := len(rows); n > 0 {
			c.service, c.address, c.port = rows[n-1].Service, rows[n-1].Address, rows[n-1].Port
		}
	case rebuildUntimed:
		rows, err = q.InstanceListEndedUntimed(ctx, db.InstanceListEndedUntimedParams{After: c.id, Lim: lim})
		if n := len(rows); n > 0 {
			c.id = rows[n-1].ID
		}
	case rebuildEnded:
		if c.at.IsZero() {
			c.at = endedSince // and c.id is uuid.Nil: every row ended at endedSince or after
		}
		rows, err = q.InstanceListEndedSince(ctx, db.InstanceListEndedSinceParams{AfterAt: c.at, AfterID: c.id, Lim: lim})
		if n := len(rows); n > 0 && rows[n-1].EndedAt != nil {
			c.at, c.id = *rows[n-1].EndedAt, rows[n-1].ID
		}
	default:
		return nil, c, nil
	}
	if err != nil {
		return nil, c, fmt.Errorf("list instances for a rebuild: %w", err)
	}
	if len(rows) < limit {
		c = RebuildCursor{phase: c.phase + 1}
	}
	out := make([]Instance, len(rows))
	for i, row := range rows {
		out[i] = instanceFromRow(row)
	}
	return out, c, nil
}
