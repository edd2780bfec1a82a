package server_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/registry"
)

// TestHealthKnownReachesTheView (issue 14): api has no readiness signal
// (passive only), so its new instance is in rotation with health unknown.
// Its first success makes health known, which changes neither its state
// nor its weight; the published view must say so all the same, without
// waiting for an unrelated change of the service.
func TestHealthKnownReachesTheView(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	admin, api := s.Token(t, adminReq), s.Token(t, apptest.API)
	r := s.JSON(t, "POST", "/v1/services/api/instances", admin, `{"address":"10.0.1.1","port":8080,"zone":"az1"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	id := apptest.Decode[registry.Instance](t, r).ID.String()
	s.WaitReady(t)
	if err := s.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Evaluate and publish; the addition window is 1 s.
	step := func() {
		s.Evaluator.EvaluateNow()
		s.Publisher.RunOnce()
		s.Clock.Advance(assembler.DefaultAdditionWindow + 100*time.Millisecond)
		s.Publisher.RunOnce()
	}
	endpoint := func() assembler.Endpoint {
		t.Helper()
		r := s.Do(t, "GET", "/v1/resolve/api", api, "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("resolve: %d %s", r.Status, r.Body)
		}
		v := apptest.Decode[assembler.View](t, r)
		if len(v.Endpoints) != 1 || v.Endpoints[0].InstanceID.String() != id {
			t.Fatalf("view %+v; want the one instance", v)
		}
		return v.Endpoints[0]
	}
	health := func() string {
		t.Helper()
		r := s.Do(t, "GET", "/v1/services/api/eligibility", admin, "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("eligibility: %d %s", r.Status, r.Body)
		}
		e := apptest.Decode[evaluator.ServiceEligibility](t, r)
		if len(e.Instances) != 1 {
			t.Fatalf("eligibility %+v", e)
		}
		return e.Instances[0].Health
	}

	// Past the slow start, so that nothing but health changes below.
	step()
	s.Clock.Advance(time.Minute)
	step()
	if ep := endpoint(); ep.State != "eligible" || ep.Weight != 1 || ep.Health != assembler.HealthUnknown {
		t.Fatalf("before any evidence: %+v; want eligible at weight 1 with health unknown", ep)
	}

	// api's own workload reports a success of its instance.
	r = s.JSON(t, "POST", "/v1/reports", api, fmt.Sprintf(`{"reports":[{"instance_id":%q,"class":"passive","outcome":"success"}]}`, id))
	if r.Status != http.StatusOK || apptest.Decode[evaluator.Result](t, r).Accepted != 1 {
		t.Fatalf("report: %d %s", r.Status, r.Body)
	}
	s.Evaluator.EvaluateNow()
	if h := health(); h != "known" {
		t.Fatalf("eligibility after a success says health %q, want known", h)
	}
	step()
	if ep := endpoint(); ep.State != "eligible" || ep.Weight != 1 || ep.Health != assembler.HealthKnown {
		t.Fatalf("after a success: %+v; want eligible at weight 1 with health known", ep)
	}
}
