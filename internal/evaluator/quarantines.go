package evaluator

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
)

// Quarantine is a transition that started a quarantine, as the evaluator
// wrote it, with the eligibility changes that led to it.
type Quarantine struct {
	TransitionID int64
	InstanceID   uuid.UUID
	At           time.Time
	Reason       string
	History      []HistoryStep
}

// HistoryStep is one eligibility change in a quarantine's history.
type HistoryStep struct {
	From, To string
	At       time.Time
	Reason   string
}

// QuarantineHistory returns the quarantines of service started since
// since, newest first, at most limit of them. The history is the
// evaluator's own encoding (historyEntry); a row whose history cannot be
// read is returned without it, and counted in bad, rather than hiding
// the quarantine.
func QuarantineHistory(ctx context.Context, pool *pgxpool.Pool, service string, since time.Time, limit int32) (out []Quarantine, bad int, err error) {
	rows, err := db.New(pool).TransitionsQuarantines(ctx, db.TransitionsQuarantinesParams{Service: service, Since: since, Lim: limit})
	if err != nil {
		return nil, 0, fmt.Errorf("quarantine history of %s: %w", service, err)
	}
	out = make([]Quarantine, 0, len(rows))
	for _, t := range rows {
		q := Quarantine{TransitionID: t.ID, InstanceID: t.InstanceID, At: t.At, Reason: t.Reason}
		var hist []historyEntry
		if err := json.Unmarshal(t.History, &hist); err != nil {
			bad++
		}
		for _, h := range hist {
			q.History = append(q.History, HistoryStep(h))
		}
		out = append(out, q)
	}
	return out, bad, nil
}
