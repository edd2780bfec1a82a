package app

import (
	"context"
	"slices"
	"testing"
)

type recorder struct {
	name    string
	stopped *[]string
}

func (r recorder) Start(context.Context) error { return nil }
func (r recorder) Stop()                       { *r.stopped = append(*r.stopped, r.name) }

// TestReconcileWorkersStopBeforeTheEvaluator: the reconciliation workers
// (one per source, and the diff's) write the registry and feed the
// evaluator readiness evidence, so they stop after the surfaces and
// before the evaluator; a caller's worker stops after the evaluator.
func TestReconcileWorkersStopBeforeTheEvaluator(t *testing.T) {
	var stopped []string
	a := &App{}
	for _, n := range []string{WorkerEvaluator, "audit-checkpoints", WorkerReconcilePrefix + "k8s/prod", WorkerDNS, WorkerReconcileDiff, WorkerPublisher} {
		a.workers = append(a.workers, worker{name: n, w: recorder{name: n, stopped: &stopped}})
	}
	a.stopWorkers()
	want := []string{WorkerDNS, WorkerReconcilePrefix + "k8s/prod", WorkerReconcileDiff, WorkerEvaluator, "audit-checkpoints", WorkerPublisher}
	if !slices.Equal(stopped, want) {
		t.Fatalf("stopped %v, want %v", stopped, want)
	}
}
