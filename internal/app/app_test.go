package app_test

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestProductionWorkersPublishUnstepped: with every worker running as
// muster serve runs them (apptest Run: Held), a registration reaches the
// published view through the pulls alone (the evaluator's queued changes,
// taken by the running publisher), with no test stepping the publisher;
// Shutdown then stops every worker.
func TestProductionWorkersPublishUnstepped(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{Run: apptest.Held})
	want := []string{app.WorkerMonitor, app.WorkerAuthz, app.WorkerOverrides, app.WorkerCensus, app.WorkerOwnership, app.WorkerReaper, app.WorkerShifts,
		app.WorkerSweeper, app.WorkerGuards, app.WorkerPublisher, app.WorkerEvaluator, app.WorkerRefusals, app.WorkerKeyWatch, app.WorkerAuthFailures, app.WorkerZoneHistory, app.WorkerProberHistory, app.WorkerRelay, app.WorkerForward, app.WorkerBreakGlass}
	if got := s.App.Workers(); !slices.Equal(got, want) {
		t.Fatalf("workers in start order %v, want %v", got, want)
	}
	for _, w := range want {
		if !s.App.Running(w) {
			t.Errorf("worker %s is not running", w)
		}
	}
	s.Seed(t)
	r := s.JSON(t, "POST", "/v1/services/api/instances", s.Token(t, apptest.API), `{"address":"127.0.0.1","port":9000,"zone":"az1"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	id := apptest.Decode[registry.Instance](t, r).ID
	// The evaluator's tick is an hour in tests: one evaluation, by hand;
	// what follows it is the workers' own doing.
	s.Evaluator.EvaluateNow()
	wait.For(t, 20*time.Second, "the running publisher publishing the registered instance", func() bool {
		if v, ok := s.Publisher.View("api"); ok && len(v.Endpoints) == 1 && v.Endpoints[0].InstanceID == id {
			return true
		}
		// The stack's clock moves only when told: past the addition
		// window, a little at a time.
		s.Clock.Advance(100 * time.Millisecond)
		return false
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.App.Shutdown(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if s.App.Running(w) {
			t.Errorf("worker %s still running after Shutdown", w)
		}
	}
}
