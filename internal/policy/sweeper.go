package policy

import (
	"context"
	"time"

	"github.com/musterhq/muster/internal/worker"
)

// sweepTimeout bounds one sweep, so a database that stops answering does
// not park the sweeper; the next tick tries again.
const sweepTimeout = 10 * time.Second

// Sweeper runs Service.Sweep on a ticker: it writes down expired overrides
// (readers already treat them as expired at their time) and prunes the
// rate-limit log.
type Sweeper struct {
	svc    *Service
	every  time.Duration
	runner worker.Runner
}

// NewSweeper returns a stopped Sweeper; every defaults to 15 s.
func NewSweeper(svc *Service, every time.Duration) *Sweeper {
	if every <= 0 {
		every = 15 * time.Second
	}
	return &Sweeper{svc: svc, every: every}
}

// Start runs the sweep until ctx ends or Stop is called.
func (w *Sweeper) Start(ctx context.Context) error { return w.runner.Start(ctx, w.run) }

// Stop ends the loop and waits. Safe to call twice or before Start.
func (w *Sweeper) Stop() { w.runner.Stop() }

func (w *Sweeper) run(ctx context.Context) {
	log := w.svc.cfg.Logger.With("worker", "override-sweeper")
	worker.Every(ctx, w.every, func(ctx context.Context) {
		sctx, cancel := context.WithTimeout(ctx, sweepTimeout)
		n, err := w.svc.Sweep(sctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("sweep overrides", "err", err)
		} else if n > 0 {
			log.Info("overrides expired", "count", n)
		}
	})
}
