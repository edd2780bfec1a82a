package xds_test

import (
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/lagstats"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds/xdstest"
)

// TestPushesInTheServiceLagHistogram: each xDS push of a service's view
// is kept in the service's lag histograms (the UI's propagation page) as
// its own path, DeliveredXDS, apart from the watch streams' deliveries:
// a client's first assignment counts, and so does the push of a
// withdrawal; no watch stream is open, so Delivered stays empty.
func TestPushesInTheServiceLagHistogram(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string][]string{"az1": {"a1", "a2", "a3"}})
	lags := e.App.Lags
	pushed := func() uint64 { return lags.Of("web")[lagstats.DeliveredXDS].Total }
	if n := pushed(); n != 0 {
		t.Fatalf("%d pushes counted before any client", n)
	}
	conn := xdstest.Dial(t, e.XDSAddr, e.Token(t, apptest.Web), "web")
	only(t, conn, 30*time.Second, 30, "a1", "a2", "a3")
	wait.For(t, 10*time.Second, "the first push counted", func() bool { return pushed() >= 1 })
	before := pushed()

	e.report("hard_failure", "a3")
	e.Evaluator.EvaluateNow()
	e.Publisher.RunOnce()
	only(t, conn, 10*time.Second, 30, "a1", "a2")
	wait.For(t, 10*time.Second, "the withdrawal's push counted", func() bool { return pushed() > before })
	if n := lags.Of("web")[lagstats.Delivered].Total; n != 0 {
		t.Fatalf("the watch streams' histogram counts %d deliveries; no watch stream is open", n)
	}
}
