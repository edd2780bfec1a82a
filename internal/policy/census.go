package policy

import (
	"context"
	"fmt"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/seal"
)

// SealCensus counts, into c, the overrides in force at now by the key
// that sealed them: policy's part of the start-up key check.
func SealCensus(ctx context.Context, q *db.Queries, c *seal.Census, now time.Time) error {
	rows, err := q.OverrideSealCensus(ctx, now)
	if err != nil {
		return fmt.Errorf("count sealed overrides: %w", err)
	}
	for _, r := range rows {
		c.Add(seal.TableOverrides, r.SealKey, r.Rows)
	}
	return nil
}
