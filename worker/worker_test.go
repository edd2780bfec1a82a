package worker_test

import (
	"context"
	"errors"
	"testing"

	"github.com/musterhq/muster/worker"
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
