package evaluator

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
)

// Change is one eligibility transition as the evaluator wrote it.
type Change struct {
	InstanceID uuid.UUID
	From, To   string
	Weight     float64
	At         time.Time
	Reason     string
}

// Window returns service's transitions in [since, until), oldest first,
// at most limit of them; truncated says the limit cut the list short.
func Window(ctx context.Context, pool *pgxpool.Pool, service string, since, until time.Time, limit int32) (out []Change, truncated bool, err error) {
	rows, err := db.New(pool).TransitionsWindow(ctx, db.TransitionsWindowParams{Service: service, Since: since, Until: until, Lim: limit + 1})
	if err != nil {
		return nil, false, fmt.Errorf("transitions of %s: %w", service, err)
	}
	if len(rows) > int(limit) {
		rows, truncated = rows[:limit], true
	}
	out = make([]Change, len(rows))
	for i, r := range rows {
		out[i] = Change{InstanceID: r.InstanceID, From: r.FromState, To: r.ToState, Weight: r.Weight, At: r.At, Reason: r.Reason}
	}
	return out, truncated, nil
}

// StateAt is an instance's state at a time as the transitions log tells
// it.
type StateAt struct {
	State string
	// Before says the state is the to-state of the last transition before
	// the time (At and Reason are that transition's); otherwise it is the
	// from-state of the first transition at or after it (At), the state the
	// instance was registered in.
	Before bool
	At     time.Time
	Reason string
}

// StatesAt returns the state each of ids was in at at, as the transitions
// log tells it: the last transition's to-state before at, else the first
// one's from-state after it. Instances with no transition at all are
// left out (their state has never changed). One query for all of ids.
func StatesAt(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID, at time.Time) (map[uuid.UUID]StateAt, error) {
	out := make(map[uuid.UUID]StateAt, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := db.New(pool).TransitionsStateAt(ctx, db.TransitionsStateAtParams{Ids: ids, At: at})
	if err != nil {
		return nil, fmt.Errorf("states of %d instances at %s: %w", len(ids), at.Format(time.RFC3339), err)
	}
	for _, r := range rows {
		out[r.InstanceID] = StateAt{State: r.State, Before: r.Before, At: r.At, Reason: r.Reason}
	}
	return out, nil
}
