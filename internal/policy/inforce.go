package policy

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/internal/db"
	"github.com/musterhq/muster/internal/evaluator"
)

// InForce is where the evaluator reads the overrides in force
// (evaluator.OverrideSource), and how it learns at once that this process
// changed them: the policy Service signals it after each commit. It is
// built before both, so neither is bound to the other after construction:
// data flows from policy's table through InForce to the evaluator, and
// from the evaluator's verdicts to the Service's budget. Other replicas'
// changes reach the evaluator by its periodic refresh.
type InForce struct {
	pool    *pgxpool.Pool
	now     func() time.Time
	changed chan struct{}
}

// NewInForce returns an InForce reading pool on the clock now (time.Now
// when nil).
func NewInForce(pool *pgxpool.Pool, now func() time.Time) *InForce {
	if now == nil {
		now = time.Now
	}
	return &InForce{pool: pool, now: now, changed: make(chan struct{}, 1)}
}

// InForce returns every override in force, for the evaluator, which
// carries them beside the verdicts for the assembler to apply.
func (f *InForce) InForce(ctx context.Context) ([]evaluator.Override, error) {
	rows, err := db.New(f.pool).OverrideListInForce(ctx, f.now())
	if err != nil {
		return nil, fmt.Errorf("list overrides in force: %w", err)
	}
	out := make([]evaluator.Override, len(rows))
	for i, r := range rows {
		out[i] = evaluator.Override{
			ID: r.ID, InstanceID: r.InstanceID, Service: r.Service, Action: r.Action,
			Actor: r.Actor, Justification: r.Justification, ExpiresAt: r.ExpiresAt,
		}
		if r.Cosigner != nil {
			out[i].Cosigner = *r.Cosigner
		}
	}
	return out, nil
}

// Changed receives a value after this process committed a change to the
// overrides (one value may stand for several); it never blocks the
// writer.
func (f *InForce) Changed() <-chan struct{} { return f.changed }

func (f *InForce) signal() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}
