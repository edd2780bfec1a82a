package resolver_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/resolver"
)

// TestOutcomesGoToTheEvaluatingReplica: a client given two replicas of
// one region sends a service's outcomes straight to the replica that
// evaluates them (as the replicas' GET /v1/evidence/routes name it),
// whichever URL comes first: the owner takes them as reported, not
// forwarded, and the other replica forwards nothing. A client given one
// URL never asks.
func TestOutcomesGoToTheEvaluatingReplica(t *testing.T) {
	t.Parallel()
	a, b := apptest.Pair(t)
	a.Seed(t)
	own, other := a, b
	if id, _ := a.App.Ownership.Owner("web"); id == "b" {
		own, other = b, a
	}
	r := own.JSON(t, "POST", "/v1/services/web/instances", a.Token(t, apptest.Web), `{"address":"127.0.0.1","port":9000,"zone":"az1"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	inst := apptest.Decode[registry.Instance](t, r).ID.String()
	if r := own.JSON(t, "PUT", "/v1/services/web/grants", a.Token(t, apptest.Admin), `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Fatalf("grant api -> web: %d %s", r.Status, r.Body)
	}
	for _, s := range []*apptest.Stack{own, other} {
		if err := s.Evaluator.SyncNow(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	e := ep(0, "az1", 1)
	e.InstanceID = inst
	own.Hub.Publish([]stream.Update{{View: viewFrame(t, viewOf("web", 1, []resolver.Endpoint{e}))}})
	token := a.Token(t, apptest.API)
	// The other replica first: without the routes, the batch would go
	// there.
	c := newClient(t, resolver.Config{
		URLs: []string{other.URL, own.URL}, Services: []string{"web"}, HTTPClient: a.Client, ReportInterval: -1,
		Token: func(context.Context) (string, error) { return token, nil },
	}, &sleeps{})
	if err := c.Cache().ApplyView(viewOf("web", 1, []resolver.Endpoint{e})); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		c.Record("web", inst, i%5 != 0)
	}
	if err := c.FlushReports(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.ReportBatchesSent != 1 || st.ReportBatchesToOwner != 1 || st.OutcomesReported != 10 {
		t.Fatalf("stats after the flush: %+v", st)
	}
	el, err := own.Evaluator.ServiceEligibility("web")
	if err != nil {
		t.Fatal(err)
	}
	if len(el.Instances) != 1 || !el.Instances[0].Evidence["passive"].Present {
		t.Fatalf("the owner has no passive evidence for %s: %+v", inst, el.Instances)
	}
	if n := own.Metric(t, "muster_samples_forwarded_total", "result", "accepted"); n != 0 {
		t.Errorf("the owner was forwarded %v items: the batch went to the other replica", n)
	}

	// One URL: the outcomes go there, and no route is asked for.
	one := newClient(t, resolver.Config{
		URLs: []string{other.URL}, Services: []string{"web"}, HTTPClient: a.Client, ReportInterval: -1,
		Token: func(context.Context) (string, error) { return token, nil },
	}, &sleeps{})
	if err := one.Cache().ApplyView(viewOf("web", 1, []resolver.Endpoint{e})); err != nil {
		t.Fatal(err)
	}
	one.Record("web", inst, true)
	if err := one.FlushReports(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := one.Stats(); st.ReportBatchesSent != 1 || st.ReportBatchesToOwner != 0 {
		t.Fatalf("one URL: %+v", st)
	}
}
