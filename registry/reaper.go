package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/musterhq/muster/audit"
	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/worker"
)

// ExpireLeases ends every active registered instance whose lease ran out by
// now, auditing each as a lease expiry by the system. It handles at most
// batch instances per call and returns how many it ended. Rows are claimed
// with SKIP LOCKED, so reapers on several replicas never end (or audit) one
// instance twice.
func (r *Registry) ExpireLeases(ctx context.Context, batch int) (int, error) {
	n := 0
	err := r.withTx(ctx, func(q *db.Queries) error {
		n = 0
		now := r.now()
		rows, err := q.LeaseListExpired(ctx, db.LeaseListExpiredParams{Now: now, Lim: int32(batch)})
		if err != nil {
			return fmt.Errorf("list expired leases: %w", err)
		}
		for _, row := range rows {
			ended, err := q.InstanceEnd(ctx, db.InstanceEndParams{ID: row.ID, State: StateExpired, Now: now})
			if err != nil {
				return fmt.Errorf("expire %s: %w", row.ID, err)
			}
			_, err = audit.Append(ctx, q, now, audit.Entry{
				ActorKind: "system", Actor: "system:lease-reaper", Action: "lease.expire",
				TargetKind: "instance", Target: row.ID.String(), Outcome: audit.Accepted,
				Reason: fmt.Sprintf("lease expired at %s without renewal", row.LeaseExpiresAt.Format(time.RFC3339Nano)),
				Before: instanceFromRow(row), After: instanceFromRow(ended),
			})
			if err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	r.metrics.expired.Add(float64(n))
	return n, nil
}

// reapTimeout bounds one ExpireLeases transaction of the reaper.
const reapTimeout = 10 * time.Second

// ReaperConfig configures a Reaper.
type ReaperConfig struct {
	Registry *Registry
	// Interval between sweeps; 1 s by default, so an instance is ended at
	// most about a second after its lease runs out.
	Interval time.Duration
	Batch    int
	Logger   *slog.Logger
}

// Validate checks the configuration and fills defaults.
func (c *ReaperConfig) Validate() error {
	if c.Registry == nil {
		return errors.New("reaper: Registry is required")
	}
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.Batch == 0 {
		c.Batch = 500
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Reaper is the worker that expires leases.
type Reaper struct {
	cfg    ReaperConfig
	runner worker.Runner
}

// NewReaper returns a stopped Reaper.
func NewReaper(cfg ReaperConfig) (*Reaper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Logger = cfg.Logger.With("worker", "lease-reaper")
	return &Reaper{cfg: cfg}, nil
}

// Start runs the sweep loop until ctx ends or Stop is called.
func (rp *Reaper) Start(ctx context.Context) error { return rp.runner.Start(ctx, rp.loop) }

// Stop ends the loop and waits for it. Safe to call twice or before Start.
func (rp *Reaper) Stop() { rp.runner.Stop() }

func (rp *Reaper) loop(ctx context.Context) {
	t := time.NewTicker(rp.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rp.runOnce(ctx)
		}
	}
}

func (rp *Reaper) runOnce(ctx context.Context) {
	for {
		// Each pass has a deadline: a frozen database must not park the
		// reaper (the connections' I/O backstop would end it later).
		pctx, cancel := context.WithTimeout(ctx, reapTimeout)
		n, err := rp.cfg.Registry.ExpireLeases(pctx, rp.cfg.Batch)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				rp.cfg.Logger.Warn("expire leases", "err", err)
			}
			return
		}
		if n > 0 {
			rp.cfg.Logger.Info("leases expired", "count", n)
		}
		if n < rp.cfg.Batch {
			return
		}
	}
}
