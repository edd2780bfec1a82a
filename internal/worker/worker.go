// Package worker gives muster's background workers one start/stop shape
// (STYLE.md habit 6): Start runs the loop in a goroutine under its own
// cancelable context; Stop cancels it and waits for the loop to return.
// Both are safe to call twice, and Stop before Start is a no-op.
package worker

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrStarted is returned by a second Start.
var ErrStarted = errors.New("worker already started")

// Runner runs one loop. The zero value is ready to use.
type Runner struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs loop(ctx) in a goroutine until ctx ends or Stop is called.
func (r *Runner) Start(ctx context.Context, loop func(ctx context.Context)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		return ErrStarted
	}
	ctx, r.cancel = context.WithCancel(ctx)
	done := make(chan struct{})
	r.done = done
	go func() {
		defer close(done)
		loop(ctx)
	}()
	return nil
}

// Stop cancels the loop and waits for it to return.
func (r *Runner) Stop() {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// Every calls tick(ctx) every interval until ctx ends: the ticker loop
// around a worker's RunOnce, written once. A tick that outlasts the
// interval delays the next; ticks are never run concurrently.
func Every(ctx context.Context, interval time.Duration, tick func(ctx context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			tick(ctx)
		}
	}
}
