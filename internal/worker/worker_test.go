package worker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/worker"
)

func TestRunner(t *testing.T) {
	var r worker.Runner
	r.Stop() // before Start: nothing to do
	started, stopped := make(chan struct{}), make(chan struct{})
	if err := r.Start(context.Background(), func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		close(stopped)
	}); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := r.Start(context.Background(), func(context.Context) {}); !errors.Is(err, worker.ErrStarted) {
		t.Fatalf("second Start: %v", err)
	}
	r.Stop()
	select {
	case <-stopped:
	default:
		t.Fatal("Stop returned before the loop did")
	}
	r.Stop() // twice: fine
}

func TestRunnerEndsWithItsContext(t *testing.T) {
	var r worker.Runner
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	if err := r.Start(ctx, func(ctx context.Context) { <-ctx.Done(); close(returned) }); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-returned
	r.Stop() // after the loop ended on its own
}

// TestEvery: tick runs on every interval, never concurrently, and Every
// returns once its context ends.
func TestEvery(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	ticks := make(chan struct{})
	var running atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		worker.Every(ctx, time.Millisecond, func(context.Context) {
			if running.Add(1) != 1 {
				t.Error("ticks ran concurrently")
			}
			defer running.Add(-1)
			select {
			case ticks <- struct{}{}:
			case <-ctx.Done():
			}
		})
	}()
	for range 3 {
		select {
		case <-ticks:
		case <-time.After(10 * time.Second):
			t.Fatal("no tick within 10 s")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Every did not return after its context ended")
	}
}
