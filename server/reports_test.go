package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
)

// readyReq is a workload of "ready", a service with a readiness signal: its
// instances wait out of rotation until their first self-reported success.
var readyReq = devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "ready"}

// newReadyService creates "ready" through s once the evaluators of every
// stack are rebuilt, so that they know neither the service nor its
// instances (the stacks' refresh runs hourly).
func newReadyService(t *testing.T, s *stack, others ...*stack) {
	t.Helper()
	for _, st := range append(others, s) {
		st.WaitReady(t)
	}
	r := s.JSON(t, "PUT", "/v1/services/ready", s.Token(t, adminReq), `{"owner":"payments","capabilities":["self","readiness"]}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("create ready: %d %s", r.Status, r.Body)
	}
}

func register(t *testing.T, s *stack, token, body string) registry.Instance {
	t.Helper()
	r := s.JSON(t, "POST", "/v1/services/ready/instances", token, body)
	if r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	return apptest.Decode[registry.Instance](t, r)
}

func postReports(t *testing.T, s *stack, token string, items ...string) evaluator.Result {
	t.Helper()
	return postReportsWith(t, s, token, nil, items...)
}

// postReportsWith posts a batch with header h (an instance's credential,
// apptest.Stack.AsInstance).
func postReportsWith(t *testing.T, s *stack, token string, h http.Header, items ...string) evaluator.Result {
	t.Helper()
	r := s.DoWith(t, "POST", "/v1/reports", token, "application/json", `{"reports":[`+strings.Join(items, ",")+`]}`, h)
	if r.Status != http.StatusOK {
		t.Fatalf("POST /v1/reports: %d %s", r.Status, r.Body)
	}
	return apptest.Decode[evaluator.Result](t, r)
}

func selfReport(id uuid.UUID, outcome string) string {
	return fmt.Sprintf(`{"instance_id":%q,"class":"self","outcome":%q}`, id, outcome)
}

// verdicts reads the eligibility of "ready" by instance.
func verdicts(t *testing.T, s *stack) map[uuid.UUID]evaluator.InstanceVerdict {
	t.Helper()
	r := s.Do(t, "GET", "/v1/services/ready/eligibility", s.Token(t, adminReq), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET eligibility: %d %s", r.Status, r.Body)
	}
	out := map[uuid.UUID]evaluator.InstanceVerdict{}
	for _, v := range apptest.Decode[evaluator.ServiceEligibility](t, r).Instances {
		out[v.InstanceID] = v
	}
	return out
}

// counter reads one sample of a counter from the stack's registry.
func counter(t *testing.T, s *stack, name, label, value string) float64 {
	t.Helper()
	mfs, err := s.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestReportRightAfterRegistration (issue 12): a workload that registers
// and at once sends its first self-report has it accepted, because the
// registration hands the instance (and its service, new to the evaluator
// too) over in the same request; a second registration of the same
// endpoint retires the first instance in the same step.
func TestReportRightAfterRegistration(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	newReadyService(t, s)
	wl := s.Token(t, readyReq)

	inst := register(t, s, wl, `{"address":"127.0.0.1","port":9000,"zone":"az1"}`)
	res := postReportsWith(t, s, wl, s.AsInstance(inst.ID.String()), selfReport(inst.ID, "success"))
	if res.Accepted != 1 || len(res.Refused) != 0 {
		t.Fatalf("first report right after registering: %+v", res)
	}
	// A sibling that has not reported stays out: the report made the
	// difference.
	quiet := register(t, s, wl, `{"address":"127.0.0.1","port":9001,"zone":"az1"}`)
	if n := counter(t, s, "muster_evaluator_instances_loaded_on_demand_total", "source", "registration"); n != 2 {
		t.Errorf("loaded on demand by registration: %v, want 2", n)
	}
	if n := counter(t, s, "muster_evaluator_instance_lookups_total", "result", "ok"); n != 0 {
		t.Errorf("%v lookups: the hand-off should have made them needless", n)
	}
	// The refresh reading the same rows changes nothing: the report is
	// not lost to a re-added instance.
	if err := s.Evaluator.SyncNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Evaluator.EvaluateNow()
	vs := verdicts(t, s)
	if v := vs[inst.ID]; v.State != "eligible" {
		t.Fatalf("the instance that reported success: %+v", v)
	}
	if v := vs[quiet.ID]; v.State != "ineligible" || !strings.Contains(strings.Join(v.Reasons, ";"), "awaiting first success") {
		t.Fatalf("the instance that did not report: %+v", v)
	}

	// The process restarts and registers the same endpoint again: the new
	// instance's report is accepted, the old one's refused as ended, and
	// the old one leaves the verdicts without a refresh.
	s.Clock.Advance(time.Second)
	next := register(t, s, wl, `{"address":"127.0.0.1","port":9000,"zone":"az1"}`)
	res = postReportsWith(t, s, wl, s.AsInstance(next.ID.String()), selfReport(next.ID, "success"), selfReport(inst.ID, "success"))
	if res.Accepted != 1 || len(res.Refused) != 1 || res.Refused[0].Index != 1 || res.Refused[0].Code != "unknown_instance" ||
		!strings.Contains(res.Refused[0].Reason, "ended (replaced)") {
		t.Fatalf("reports on the new and the replaced instance: %+v", res)
	}
	s.Evaluator.EvaluateNow()
	vs = verdicts(t, s)
	if _, ok := vs[inst.ID]; ok || vs[next.ID].State != "eligible" || len(vs) != 2 {
		t.Fatalf("verdicts after the replacement: %+v", vs)
	}
	if n := counter(t, s, "muster_evaluator_instance_lookups_total", "result", "ok"); n != 0 {
		t.Errorf("%v lookups: the replaced instance was retired by the hand-off", n)
	}
}

// TestReportThroughAnotherReplica (issue 12): an instance registered
// through one muster is reported to another that has not refreshed since:
// the second looks it up (and its service) and accepts the report.
func TestReportThroughAnotherReplica(t *testing.T) {
	t.Parallel()
	a := newStack(t)
	b := apptest.New(t, apptest.Options{Pool: a.Pool})
	newReadyService(t, a, b)
	wl := a.Token(t, readyReq)

	inst := register(t, a, wl, `{"address":"127.0.0.1","port":9000,"zone":"az1"}`)
	res := postReportsWith(t, b, b.Token(t, readyReq), a.AsInstance(inst.ID.String()), selfReport(inst.ID, "success"))
	if res.Accepted != 1 || len(res.Refused) != 0 {
		t.Fatalf("report to the other replica: %+v", res)
	}
	if n := counter(t, b, "muster_evaluator_instances_loaded_on_demand_total", "source", "report"); n != 1 {
		t.Errorf("loaded on demand by report: %v, want 1", n)
	}
	if n := counter(t, b, "muster_evaluator_instance_lookups_total", "result", "ok"); n != 1 {
		t.Errorf("lookups: %v, want 1", n)
	}
	b.Evaluator.EvaluateNow()
	if v := verdicts(t, b)[inst.ID]; v.State != "eligible" {
		t.Fatalf("on the other replica, the instance that reported success: %+v", v)
	}
}

// TestProbeRightAfterAssignment (issue 12): a prober assigned a service a
// moment ago has its first probe of a just-registered instance accepted:
// the assignment is handed to the evaluator when it commits, like the
// registration, instead of waiting for the next refresh (hourly in these
// stacks).
func TestProbeRightAfterAssignment(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	newReadyService(t, s)
	inst := register(t, s, s.Token(t, readyReq), `{"address":"127.0.0.1","port":9000,"zone":"az1"}`)
	if r := s.JSON(t, "PUT", "/v1/probers/prober-az9/assignments", s.Token(t, adminReq), `{"services":["ready"]}`); r.Status != http.StatusOK {
		t.Fatalf("assign: %d %s", r.Status, r.Body)
	}
	prober := s.Token(t, devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-az9"})
	res := postReports(t, s, prober, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":"success"}`, inst.ID))
	if res.Accepted != 1 || len(res.Refused) != 0 {
		t.Fatalf("first probe right after the assignment: %+v", res)
	}
	// Taking the assignment away is as immediate.
	if r := s.JSON(t, "PUT", "/v1/probers/prober-az9/assignments", s.Token(t, adminReq), `{"services":[]}`); r.Status != http.StatusOK {
		t.Fatalf("unassign: %d %s", r.Status, r.Body)
	}
	res = postReports(t, s, prober, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":"failure"}`, inst.ID))
	if res.Accepted != 0 || len(res.Refused) != 1 || res.Refused[0].Code != "not_assigned" {
		t.Fatalf("a probe after the assignment was taken away: %+v", res)
	}
}
