package publisher_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	st "github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var admin = identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}

type pipeline struct {
	*st.Stack
	t      *testing.T
	prober string
	zones  map[string][]string // zone -> instance ids
}

// newPipeline runs the whole path: registry -> evaluator -> publisher ->
// hub -> HTTP, with web's six instances in two zones probed by prober-az1.
func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	s := st.New(t, st.Options{})
	s.Seed(t)
	ctx := context.Background()
	p := &pipeline{Stack: s, t: t, zones: map[string][]string{}}
	for i := range 6 {
		zone := fmt.Sprintf("az%d", i%2+1)
		in, err := s.Registry.Register(ctx, admin, netip.Addr{}, "web", registry.Registration{Address: fmt.Sprintf("10.0.%d.%d", i%2, i), Port: 8080, Zone: zone})
		if err != nil {
			t.Fatal(err)
		}
		p.zones[zone] = append(p.zones[zone], in.ID.String())
	}
	if _, err := s.Registry.PutProberAssignments(ctx, admin, "prober-az1", registry.ProberAssignments{Services: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	p.prober = s.Token(t, devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-az1"})
	s.WaitReady(t)
	if err := s.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	p.probe("success", append(p.zones["az1"], p.zones["az2"]...)...)
	p.step(2 * time.Second) // past the addition window: the first view goes out
	return p
}

// probe reports one outcome for each instance.
func (p *pipeline) probe(outcome string, ids ...string) {
	p.t.Helper()
	var items []string
	for _, id := range ids {
		items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":%q}`, id, outcome))
	}
	r := p.JSON(p.t, "POST", "/v1/reports", p.prober, `{"reports":[`+strings.Join(items, ",")+`]}`)
	if r.Status != http.StatusOK || strings.Contains(string(r.Body), `"code"`) {
		p.t.Fatalf("reports: %d %s", r.Status, r.Body)
	}
}

// step evaluates, advances the clock by d, and lets the publisher publish
// what has come due.
func (p *pipeline) step(d time.Duration) {
	p.Evaluator.EvaluateNow()
	p.Publisher.RunOnce()
	p.Clock.Advance(d)
	p.Publisher.RunOnce()
}

func (p *pipeline) view() assembler.View {
	p.t.Helper()
	r := p.Do(p.t, "GET", "/v1/resolve/web", p.Token(p.t, st.Admin), "", "")
	if r.Status != http.StatusOK {
		p.t.Fatalf("resolve: %d %s", r.Status, r.Body)
	}
	return st.Decode[assembler.View](p.t, r)
}

func (p *pipeline) alarms() []assembler.Alarm {
	p.t.Helper()
	r := p.Do(p.t, "GET", "/v1/alarms", p.Token(p.t, st.Viewer), "", "")
	if r.Status != http.StatusOK {
		p.t.Fatalf("alarms: %d %s", r.Status, r.Body)
	}
	return st.Decode[struct{ Alarms []assembler.Alarm }](p.t, r).Alarms
}

func TestBadHealthCheckRolloutTripsOneZone(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	v := p.view()
	if len(v.Endpoints) != 6 || v.Zones["az1"].Guard != "ok" || v.Zones["az2"].Guard != "ok" {
		t.Fatalf("healthy view: %+v", v)
	}

	// A watcher that is current receives the change as a delta.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/v1/watch?service=web&since=%d", p.URL, v.Version), nil)
	req.Header.Set("Authorization", "Bearer "+p.Token(t, st.Web))
	res, err := p.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()

	// Every instance of az1 fails its (new, broken) health check. Nothing
	// is withdrawn (the guard keeps the zone's full set), so the change
	// rides the addition queue: it is out within the addition window.
	p.probe("hard_failure", p.zones["az1"]...)
	p.step(1500 * time.Millisecond)

	sc := bufio.NewScanner(res.Body)
	var kind, data string
	for sc.Scan() {
		line := sc.Text()
		if k, ok := strings.CutPrefix(line, "event: "); ok {
			kind = k
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok && kind != "synced" {
			data = d
			break
		}
	}
	if kind != "delta" {
		t.Fatalf("a current watcher got %q, want a delta", kind)
	}
	var d assembler.Delta
	if err := json.Unmarshal([]byte(data), &d); err != nil {
		t.Fatal(err)
	}
	if d.FromVersion != v.Version || d.Version <= v.Version || d.Zones["az1"].Guard != "tripped" {
		t.Fatalf("delta %+v", d)
	}

	// The guard publishes az1's full set, each endpoint with its own
	// verdict visible; az2 is unaffected.
	tripped := p.view()
	if len(tripped.Endpoints) != 6 || tripped.Zones["az1"].Guard != "tripped" || tripped.Zones["az2"].Guard != "ok" {
		t.Fatalf("tripped view zones %+v, %d endpoints", tripped.Zones, len(tripped.Endpoints))
	}
	for _, ep := range tripped.Endpoints {
		if want := map[string]string{"az1": "ineligible", "az2": "eligible"}[ep.Zone]; ep.State != want {
			t.Errorf("endpoint %s in %s is %s, want %s", ep.InstanceID, ep.Zone, ep.State, want)
		}
	}
	alarms := p.alarms()
	if len(alarms) != 1 || alarms[0].Kind != "fraction_guard" || alarms[0].Zone != "az1" || alarms[0].Detail == "" {
		t.Fatalf("alarms %+v", alarms)
	}

	// The check is fixed: az1 recovers, the alarm clears.
	for range 20 {
		p.probe("success", p.zones["az1"]...)
		p.step(5 * time.Second)
	}
	if a := p.alarms(); len(a) != 0 {
		t.Fatalf("alarms after recovery: %+v", a)
	}
	if v := p.view(); v.Zones["az1"].Guard != "ok" {
		t.Fatalf("az1 after recovery: %+v", v.Zones["az1"])
	}
	// The trip and its clear were handed to the guard-trip history.
	if err := p.Guards.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	eps, err := p.Guards.List(ctx, "web", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 1 || eps[0].Zone != "az1" || eps[0].ClearedAt == nil || !eps[0].ClearedAt.After(eps[0].TrippedAt) ||
		!strings.Contains(eps[0].Detail, "below the minimum healthy fraction") {
		t.Fatalf("guard history %+v", eps)
	}
}

func TestLastInstanceAlarm(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	all := append(p.zones["az1"], p.zones["az2"]...)
	p.probe("hard_failure", all...)
	p.step(1500 * time.Millisecond)
	var kinds []string
	for _, a := range p.alarms() {
		kinds = append(kinds, a.Kind+":"+a.Zone)
	}
	if got := strings.Join(kinds, ","); got != "fraction_guard:az1,fraction_guard:az2,last_instance:" {
		t.Fatalf("alarms %s", got)
	}
	// Nothing was drained: the guard keeps the full set published.
	if v := p.view(); len(v.Endpoints) != 6 {
		t.Fatalf("%d endpoints published with every instance failing", len(v.Endpoints))
	}
}

func TestWithdrawalWithinTheBatchingWindow(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	before := p.view()
	gone := p.zones["az2"][0]
	p.probe("hard_failure", gone)
	p.step(100 * time.Millisecond) // the withdrawal window is 50 ms
	after := p.view()
	if len(after.Endpoints) != 5 || after.Version <= before.Version || after.Zones["az2"].Guard != "ok" {
		t.Fatalf("after one failure in az2: %d endpoints, zones %+v", len(after.Endpoints), after.Zones)
	}
	for _, ep := range after.Endpoints {
		if ep.InstanceID.String() == gone {
			t.Fatalf("the failed instance is still published: %+v", ep)
		}
	}
	mfs, err := p.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var lags uint64
	for _, mf := range mfs {
		if mf.GetName() == "muster_withdrawal_lag_seconds" {
			for _, m := range mf.GetMetric() {
				lags += m.GetHistogram().GetSampleCount()
			}
		}
	}
	if lags != 1 {
		t.Fatalf("withdrawal lag observations = %d, want 1", lags)
	}
	if a := p.alarms(); len(a) != 0 {
		t.Fatalf("a withdrawal within budget raised alarms: %+v", a)
	}
}

// A lone hard failure is published by the evaluation and assembly that
// follow it, with no clock advance: the withdrawal queue was idle, so the
// withdrawal is due at once (issue 14), and its lag is what the evaluation
// took, not a batching window.
func TestLoneWithdrawalPublishedAtOnce(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	p.Clock.Advance(time.Minute) // well past any earlier withdrawal's window
	before := p.view()
	gone := p.zones["az1"][1]
	p.probe("hard_failure", gone)
	p.Evaluator.EvaluateNow()
	p.Publisher.RunOnce()
	after := p.view()
	if len(after.Endpoints) != 5 || after.Version <= before.Version {
		t.Fatalf("after one hard failure, same instant: %d endpoints at version %d (was %d), want it withdrawn at once",
			len(after.Endpoints), after.Version, before.Version)
	}
	for _, ep := range after.Endpoints {
		if ep.InstanceID.String() == gone {
			t.Fatalf("the failed instance is still published: %+v", ep)
		}
	}
	if !after.GeneratedAt.Equal(p.Clock.Now()) {
		t.Fatalf("published at %v, want the instant of the failure %v", after.GeneratedAt, p.Clock.Now())
	}
}
