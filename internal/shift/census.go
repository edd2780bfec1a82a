package shift

import (
	"context"
	"fmt"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/seal"
)

// SealCensus counts, into c, the shifts in force by the key that sealed
// them: shift's part of the start-up key check.
func SealCensus(ctx context.Context, q *db.Queries, c *seal.Census) error {
	rows, err := q.ShiftSealCensus(ctx)
	if err != nil {
		return fmt.Errorf("count sealed shifts: %w", err)
	}
	for _, r := range rows {
		c.Add(seal.TableShifts, r.SealKey, r.Rows)
	}
	return nil
}
