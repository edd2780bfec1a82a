package evaluator_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	st "github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var (
	prober1 = devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-az1"}
	prober2 = devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-az2"}
	admin   = identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
)

// fixture seeds web and api, registers instances, assigns prober-az1 to
// web, and syncs the evaluator.
type fixture struct {
	*st.Stack
	web []string // web instance ids
	api []string
}

func newFixture(t *testing.T, opts st.Options) *fixture {
	t.Helper()
	s := st.New(t, opts)
	s.Seed(t)
	ctx := context.Background()
	f := &fixture{Stack: s}
	for i := range 3 {
		in, err := s.Registry.Register(ctx, admin, netip.Addr{}, "web", registry.Registration{Address: fmt.Sprintf("10.0.0.%d", i+1), Port: 8080, Zone: "az1"})
		if err != nil {
			t.Fatal(err)
		}
		f.web = append(f.web, in.ID.String())
	}
	in, err := s.Registry.Register(ctx, admin, netip.Addr{}, "api", registry.Registration{Address: "10.0.1.1", Port: 8080, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	f.api = append(f.api, in.ID.String())
	if _, err := s.Registry.PutProberAssignments(ctx, admin, "prober-az1", registry.ProberAssignments{Services: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	if !opts.NoStart {
		f.waitReady(t)
		if err := s.Evaluator.SyncNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *fixture) waitReady(t *testing.T) {
	t.Helper()
	f.WaitReady(t)
}

func report(id, class, outcome string) string {
	return fmt.Sprintf(`{"instance_id":%q,"class":%q,"outcome":%q}`, id, class, outcome)
}

func (f *fixture) post(t *testing.T, tok string, items ...string) evaluator.Result {
	t.Helper()
	r := f.JSON(t, "POST", "/v1/reports", tok, `{"reports":[`+strings.Join(items, ",")+`]}`)
	if r.Status != http.StatusOK {
		t.Fatalf("POST /v1/reports: %d %s", r.Status, r.Body)
	}
	return st.Decode[evaluator.Result](t, r)
}

func (f *fixture) verdict(t *testing.T, service, id string) evaluator.InstanceVerdict {
	t.Helper()
	r := f.Do(t, "GET", "/v1/services/"+service+"/eligibility", f.Token(t, st.Admin), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET eligibility: %d %s", r.Status, r.Body)
	}
	for _, v := range st.Decode[evaluator.ServiceEligibility](t, r).Instances {
		if v.InstanceID.String() == id {
			return v
		}
	}
	t.Fatalf("instance %s not in the eligibility of %s: %s", id, service, r.Body)
	return evaluator.InstanceVerdict{}
}

func TestIngestAttribution(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	web, api, p1, p2 := f.Token(t, st.Web), f.Token(t, st.API), f.Token(t, prober1), f.Token(t, prober2)

	// api's own instance is at 10.0.1.1: a token vouching for that address
	// is the instance itself (the test client's requests come from
	// loopback, not from there).
	apiSelf := f.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "api", Addresses: []string{"10.0.1.1"}})
	res := f.post(t, apiSelf,
		report(f.web[0], "self", "success"),                                  // 0: a neighbour's self-report
		report(f.web[0], "passive", "failure"),                               // 1: passive from a caller web has not granted
		report(f.api[0], "self", "success"),                                  // 2: its own: fine
		report(f.web[0], "probe", "success"),                                 // 3: a workload is no prober
		report("00000000-0000-0000-0000-000000000000", "passive", "success"), // 4: no such instance
		report(f.web[0], "gossip", "success"),                                // 5: bad class
		report(f.web[0], "passive", "meh"),                                   // 6: bad outcome
		report(f.api[0], "passive", "success"),                               // 7: a service's own callers: fine
	)
	if res.Accepted != 2 || len(res.Refused) != 6 {
		t.Fatalf("result %+v", res)
	}
	want := map[int]string{0: "not_own_instance", 1: "not_granted", 3: "wrong_identity_kind", 4: "unknown_instance", 5: "invalid", 6: "invalid"}
	for _, r := range res.Refused {
		if want[r.Index] != r.Code || r.Reason == "" {
			t.Errorf("item %d refused as %s (%s), want %s", r.Index, r.Code, r.Reason, want[r.Index])
		}
	}
	// An unassigned prober is refused; the assigned one is accepted.
	res = f.post(t, p2, report(f.web[0], "probe", "success"))
	if res.Accepted != 0 || len(res.Refused) != 1 || res.Refused[0].Code != "not_assigned" {
		t.Fatalf("unassigned prober: %+v", res)
	}
	if res := f.post(t, p1, report(f.web[0], "probe", "success")); res.Accepted != 1 {
		t.Fatalf("assigned prober: %+v", res)
	}
	// A workload of web speaks for the instance it is, not its siblings
	// (issue 13): from loopback with no address in its token it is none of
	// them; with web[1]'s address it is web[1].
	if res := f.post(t, web, report(f.web[1], "self", "failure")); res.Accepted != 0 || len(res.Refused) != 1 || res.Refused[0].Code != "not_own_instance" {
		t.Fatalf("a sibling's self-report: %+v", res)
	}
	web1 := f.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: []string{"10.0.0.2"}})
	if res := f.post(t, web1, report(f.web[1], "self", "success"), report(f.web[1], "self", "failure")); res.Accepted != 2 {
		t.Fatalf("own self-reports: %+v", res)
	}
	if res := f.post(t, web1, report(f.web[0], "self", "hard_failure")); res.Accepted != 0 || res.Refused[0].Code != "not_own_instance" {
		t.Fatalf("web[1] reporting its sibling web[0]: %+v", res)
	}
	// Operators are not callers: a viewer's passive evidence is refused.
	if res := f.post(t, f.Token(t, st.Viewer), report(f.web[0], "passive", "hard_failure")); res.Accepted != 0 || res.Refused[0].Code != "wrong_identity_kind" {
		t.Fatalf("a viewer's passive hard failure: %+v", res)
	}
	// Once web grants api, api's outcomes about web count.
	if r := f.JSON(t, "PUT", "/v1/services/web/grants", f.Token(t, st.Admin), `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Fatalf("grant: %d %s", r.Status, r.Body)
	}
	if err := f.Authz.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res := f.post(t, api, report(f.web[0], "passive", "success")); res.Accepted != 1 {
		t.Fatalf("a granted caller's passive evidence: %+v", res)
	}
	for reason, n := range map[string]float64{"not_own_instance": 3, "not_granted": 1, "not_assigned": 1, "wrong_identity_kind": 2, "unknown_instance": 1, "invalid": 2} {
		if got := metric(t, f, "muster_samples_refused_total", "reason", reason); got != n {
			t.Errorf("muster_samples_refused_total{reason=%q} = %v, want %v", reason, got, n)
		}
	}

	// A batch that is empty or too large is refused whole.
	if r := f.JSON(t, "POST", "/v1/reports", web, `{"reports":[]}`); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("empty batch: %d", r.Status)
	}
	if r := f.JSON(t, "POST", "/v1/reports", web, `{"reports":[{"instance_id":"x"}]}`); r.Status != http.StatusBadRequest {
		t.Fatalf("bad uuid: %d %s", r.Status, r.Body)
	}
}

// metric reads one sample of a counter or gauge from the stack's registry,
// selected by label name/value pairs.
func metric(t *testing.T, f *fixture, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := f.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func TestHardFailureIneligibleWithinOneTick(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	p1 := f.Token(t, prober1)
	id := f.web[0]
	// Before its first success a probed instance is not yet in rotation.
	if v := f.verdict(t, "web", id); v.State != "ineligible" || !strings.Contains(strings.Join(v.Reasons, ";"), "awaiting first success") {
		t.Fatalf("before any evidence: %+v", v)
	}
	for _, in := range f.web {
		f.post(t, p1, report(in, "probe", "success"))
	}
	f.Evaluator.EvaluateNow()
	if v := f.verdict(t, "web", id); v.State != "eligible" {
		t.Fatalf("after a probe success: %+v", v)
	}
	f.Clock.Advance(time.Second)
	f.post(t, p1, report(id, "probe", "hard_failure"))
	f.Evaluator.EvaluateNow() // one tick
	v := f.verdict(t, "web", id)
	if v.State != "ineligible" || len(v.Reasons) == 0 {
		t.Fatalf("one tick after a hard failure: %+v", v)
	}
	if n := metric(t, f, "muster_instances", "service", "web", "state", "ineligible"); n != 1 {
		t.Errorf("muster_instances{service=web,state=ineligible} = %v, want 1", n)
	}
	if n := metric(t, f, "muster_instances", "service", "web", "state", "eligible"); n != 2 {
		t.Errorf("muster_instances{service=web,state=eligible} = %v, want 2", n)
	}
	// The other instances were untouched.
	for _, other := range f.web[1:] {
		if v := f.verdict(t, "web", other); v.State == "ineligible" {
			t.Fatalf("silent instance %s is ineligible: %+v", other, v)
		}
	}
}

func TestSilenceIsUnknownNotIneligible(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	p1 := f.Token(t, prober1)
	for _, id := range f.web {
		f.post(t, p1, report(id, "probe", "success"))
	}
	f.Evaluator.EvaluateNow()
	// The prober goes away for ten minutes.
	for range 60 {
		f.Clock.Advance(10 * time.Second)
		f.Evaluator.EvaluateNow()
	}
	for _, id := range f.web {
		if v := f.verdict(t, "web", id); v.State != "unknown" && v.State != "eligible" {
			t.Fatalf("after 10 min of silence: %+v", v)
		}
	}
}

// recordingSink remembers what the evaluator published: it takes the
// changes queued for the publisher (which the stack does not run) as the
// publisher would.
type recordingSink struct {
	ev      *evaluator.Evaluator
	mu      sync.Mutex
	ts      []eligibility.Transition
	changed []string
}

// take pulls what the evaluator queued since the last take.
func (r *recordingSink) take() {
	c := r.ev.TakeChanges()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ts = append(r.ts, c.Transitions...)
	r.changed = append(r.changed, c.Services...)
}

func (r *recordingSink) count() int {
	r.take()
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ts)
}

func TestRestartRebuildsBeforePublishing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	p1 := f.Token(t, prober1)
	bad := f.web[0]
	for range 10 {
		f.post(t, p1, report(f.web[0], "probe", "failure"), report(f.web[1], "probe", "success"), report(f.web[2], "probe", "success"))
		f.Clock.Advance(time.Second)
		f.Evaluator.EvaluateNow()
	}
	if v := f.verdict(t, "web", bad); v.State != "ineligible" {
		t.Fatalf("before the restart: %+v", v)
	}
	ctx := context.Background()
	if err := f.Evaluator.FlushNow(ctx); err != nil {
		t.Fatal(err)
	}
	f.Evaluator.Stop()

	// A second muster on the same database: nothing published until the
	// rebuild is done, then the same verdicts.
	second := st.New(t, st.Options{Pool: f.Pool, NoStart: true, Evaluator: func(c *evaluator.Config) {
		c.Now = f.Clock.Now
	}})
	sink := &recordingSink{ev: second.Evaluator}
	if r := second.Do(t, "GET", "/v1/services/web/eligibility", second.Token(t, st.Admin), "", ""); r.Status != http.StatusServiceUnavailable || r.Problem(t).Type != "https://muster.dev/problems/not-ready" {
		t.Fatalf("before the rebuild: %d %s", r.Status, r.Body)
	}
	if _, err := second.Evaluator.Ingest(ctx, identity.Principal{Kind: identity.KindProber, Subject: "prober-az1"}, nil); err == nil {
		t.Fatal("ingest accepted before the rebuild")
	}
	if err := second.Evaluator.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Evaluator.Stop)
	g := &fixture{Stack: second, web: f.web}
	g.waitReady(t)
	if v := g.verdict(t, "web", bad); v.State != "ineligible" {
		t.Fatalf("after the rebuild, the failing instance is %+v", v)
	}
	for _, id := range f.web[1:] {
		if v := g.verdict(t, "web", id); v.State != "eligible" {
			t.Fatalf("after the rebuild, healthy %s is %+v", id, v)
		}
	}
	if n := sink.count(); n != 0 {
		t.Fatalf("the rebuild published %d transitions; it restates, it does not change", n)
	}
}

func TestEndedInstanceLeavesATransition(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	sink := &recordingSink{ev: f.Evaluator}
	p1 := f.Token(t, prober1)
	f.post(t, p1, report(f.web[0], "probe", "success"))
	f.Evaluator.EvaluateNow()
	sink.take()
	if !slices.Contains(sink.changed, "web") {
		t.Fatalf("services changed: %v, want web (instances were added)", sink.changed)
	}
	id, _ := uuid.Parse(f.web[0])
	if _, err := f.Registry.Deregister(context.Background(), admin, id); err != nil {
		t.Fatal(err)
	}
	if err := f.Evaluator.SyncNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.Evaluator.EvaluateNow()
	sink.take()
	sink.mu.Lock()
	defer sink.mu.Unlock()
	var last eligibility.Transition
	for _, tr := range sink.ts {
		if uuid.UUID(tr.Instance) == id {
			last = tr
		}
	}
	if last.To != eligibility.Ineligible || last.Reason != "deregistered" || last.From != eligibility.Eligible {
		t.Fatalf("last transition of the deregistered instance: %+v", last)
	}
	if _, ok := f.Evaluator.Snapshot("web"); !ok {
		t.Fatal("no snapshot of web")
	}
	snap, _ := f.Evaluator.Snapshot("web")
	if len(snap.Instances) != 2 || snap.MinHealthyFraction != 0.5 {
		t.Fatalf("snapshot after deregistration: %+v", snap)
	}
}

// TestHardFailureDoesNotWaitForTheTick: the stack's tick is an hour, so
// only the early evaluation a hard failure asks for can withdraw it.
func TestHardFailureDoesNotWaitForTheTick(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	p1 := f.Token(t, prober1)
	for _, in := range f.web {
		f.post(t, p1, report(in, "probe", "success"))
	}
	f.Evaluator.EvaluateNow()
	f.Clock.Advance(time.Second)
	f.post(t, p1, report(f.web[0], "probe", "hard_failure"))
	// Within 10 s of wall time, while the injected clock stands still: a
	// hard failure does not wait for the next tick.
	wait.For(t, 10*time.Second, "the hard failure applied before the next tick", func() bool {
		return f.verdict(t, "web", f.web[0]).State == "ineligible"
	})
}

// inRotation reads an instance's state from the evaluator's snapshot.
func inRotation(t *testing.T, ev *evaluator.Evaluator, service string, id uuid.UUID) (assembler.InstanceInput, bool) {
	t.Helper()
	snap, ok := ev.Snapshot(service)
	if !ok {
		t.Fatalf("no snapshot of %s", service)
	}
	for _, v := range snap.Instances {
		if v.ID == id {
			return v, v.State.InRotation()
		}
	}
	t.Fatalf("instance %s not in the snapshot of %s", id, service)
	return assembler.InstanceInput{}, false
}

// flapUntilQuarantined feeds the instance adversarial probe reports through
// Ingest, one a second (failing while it is in rotation, passing while it
// is out), evaluating after each, until the sink receives a quarantine.
// clock is the evaluator's.
func flapUntilQuarantined(t *testing.T, ev *evaluator.Evaluator, clock *st.Clock, sink *recordingSink, id uuid.UUID) eligibility.Transition {
	t.Helper()
	prober := identity.Principal{Kind: identity.KindProber, Subject: "prober-az1"}
	for range 3600 {
		clock.Advance(time.Second)
		outcome := "success"
		if _, in := inRotation(t, ev, "web", id); in {
			outcome = "failure"
		}
		if res, err := ev.Ingest(context.Background(), prober, []evaluator.Report{{InstanceID: id, Class: "probe", Outcome: outcome}}); err != nil || res.Accepted != 1 {
			t.Fatalf("ingest: %+v %v", res, err)
		}
		ev.EvaluateNow()
		sink.take()
		sink.mu.Lock()
		for _, tr := range sink.ts {
			if uuid.UUID(tr.Instance) == id && !tr.QuarantinedUntil.IsZero() {
				sink.ts = nil
				sink.mu.Unlock()
				return tr
			}
		}
		sink.ts = nil
		sink.mu.Unlock()
	}
	t.Fatal("not quarantined within an hour of flapping")
	return eligibility.Transition{}
}

// TestQuarantineSurvivesARestart (issue 11): a quarantined instance stays
// quarantined, until the same time, in the evaluator of a restarted
// process, and its next quarantine escalates from where the last one was.
func TestQuarantineSurvivesARestart(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	sinkA := &recordingSink{ev: f.Evaluator}
	id, _ := uuid.Parse(f.web[0])
	q := flapUntilQuarantined(t, f.Evaluator, f.Clock, sinkA, id)
	if d := q.QuarantinedUntil.Sub(q.At); d != time.Minute || q.QuarantineStep != 1 {
		t.Fatalf("first quarantine lasts %v at step %d, want 1m at step 1", d, q.QuarantineStep)
	}
	f.Evaluator.Stop() // flushes the transitions
	rows, err := db.New(f.Pool).TransitionsList(context.Background(), db.TransitionsListParams{InstanceID: &id, Lim: 1})
	if err != nil || len(rows) != 1 || rows[0].QuarantinedUntil == nil || !rows[0].QuarantinedUntil.Equal(q.QuarantinedUntil) || rows[0].QuarantineStep != 1 {
		t.Fatalf("newest transition on record: %+v %v", rows, err)
	}

	// Another process on the same database, 10 s into the quarantine, its
	// evaluator on the first one's clock.
	f.Clock.Advance(10 * time.Second)
	second := st.New(t, st.Options{Pool: f.Pool, Evaluator: func(c *evaluator.Config) {
		c.Now = f.Clock.Now
	}})
	sinkB := &recordingSink{ev: second.Evaluator}
	g := &fixture{Stack: second, web: f.web}
	g.waitReady(t)
	if v, in := inRotation(t, second.Evaluator, "web", id); in || !v.Quarantined {
		t.Fatalf("after the restart the quarantined instance is %+v", v)
	}
	v := g.verdict(t, "web", f.web[0])
	if v.State != "ineligible" || v.QuarantineUntil == nil || !v.QuarantineUntil.Equal(q.QuarantinedUntil) ||
		!strings.Contains(strings.Join(v.Reasons, ";"), "quarantined until") {
		t.Fatalf("after the restart: %+v, want quarantined until %v", v, q.QuarantinedUntil)
	}
	if st := second.Evaluator.Stats(); st.QuarantinesRestored != 1 {
		t.Errorf("stats %+v, want 1 quarantine restored", st)
	}

	// Passing probes do not bring it back before the quarantine ends.
	prober := identity.Principal{Kind: identity.KindProber, Subject: "prober-az1"}
	for f.Clock.Now().Before(q.QuarantinedUntil.Add(-time.Second)) {
		f.Clock.Advance(time.Second)
		if _, err := second.Evaluator.Ingest(context.Background(), prober, []evaluator.Report{{InstanceID: id, Class: "probe", Outcome: "success"}}); err != nil {
			t.Fatal(err)
		}
		second.Evaluator.EvaluateNow()
		if v, in := inRotation(t, second.Evaluator, "web", id); in {
			t.Fatalf("back in rotation at %v, quarantined until %v: %+v", f.Clock.Now(), q.QuarantinedUntil, v)
		}
	}

	// Flapping again after it ends: the next quarantine is the second step.
	next := flapUntilQuarantined(t, second.Evaluator, f.Clock, sinkB, id)
	if !next.At.After(q.QuarantinedUntil) {
		t.Fatalf("quarantined again at %v, before the first ended at %v", next.At, q.QuarantinedUntil)
	}
	if d := next.QuarantinedUntil.Sub(next.At); d != 2*time.Minute || next.QuarantineStep != 2 {
		t.Fatalf("the quarantine after the restart lasts %v at step %d, want 2m at step 2", d, next.QuarantineStep)
	}
}

// TestProberSuspectAlarm (issue 13): a prober reporting failure on every
// web instance while their self-reports say healthy removes nothing; the
// instances are degraded with a reason naming the prober, the prober turns
// suspect (metric, alarm, its evidence ignored), and when it goes silent
// the suspicion gives way to an outage alarm that names it too.
func TestProberSuspectAlarm(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	// One token vouching for the three instances' addresses stands in for
	// the three instances, each reporting itself.
	p1 := f.Token(t, prober1)
	web := f.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}})
	both := func(outcome string) {
		var items []string
		for _, id := range f.web {
			items = append(items, report(id, "self", "success"))
		}
		if res := f.post(t, web, items...); res.Accepted != len(f.web) {
			t.Fatalf("self-reports: %+v", res)
		}
		if outcome == "" {
			return
		}
		items = nil
		for _, id := range f.web {
			items = append(items, report(id, "probe", outcome))
		}
		if res := f.post(t, p1, items...); res.Accepted != len(f.web) {
			t.Fatalf("probe reports: %+v", res)
		}
	}
	both("success")
	f.Evaluator.EvaluateNow()
	weight := map[string]float64{} // a step into the slow start
	for _, id := range f.web {
		v := f.verdict(t, "web", id)
		if v.State != "eligible" {
			t.Fatalf("before the prober fails: %+v", v)
		}
		weight[id] = v.Weight
	}
	if alarms := f.Evaluator.ProberAlarms(); len(alarms) != 0 {
		t.Fatalf("alarms while every prober is healthy: %+v", alarms)
	}

	f.Clock.Advance(5 * time.Second)
	both("failure")
	f.Evaluator.EvaluateNow()
	want := "probe failing (prober prober-az1) contradicted by self: degraded"
	for _, id := range f.web {
		v := f.verdict(t, "web", id)
		if v.State != "degraded" || v.Weight != weight[id]/2 || !slices.Contains(v.Reasons, want) {
			t.Fatalf("contradicted: %+v, want degraded at half its weight %v: %q", v, weight[id], want)
		}
	}
	if n := metric(t, f, "muster_instances_contradicted", "service", "web"); n != 3 {
		t.Errorf("muster_instances_contradicted{service=web} = %v, want 3", n)
	}
	if n := metric(t, f, "muster_contradicted_failures_total", "service", "web"); n != 3 {
		t.Errorf("muster_contradicted_failures_total{service=web} = %v, want 3", n)
	}

	// The next evaluation finds the prober suspect and sets its evidence
	// aside.
	f.Clock.Advance(time.Second)
	f.Evaluator.EvaluateNow()
	alarms := f.Evaluator.ProberAlarms()
	if len(alarms) != 1 || alarms[0].Kind != evaluator.AlarmProberSuspect || alarms[0].Prober != "prober-az1" ||
		!alarms[0].Since.Equal(f.Clock.Now()) || !strings.Contains(alarms[0].Detail, "web: 3 failing, 3 contradicted") {
		t.Fatalf("alarms %+v, want prober-az1 suspect since %v", alarms, f.Clock.Now())
	}
	if a := alarms[0].Alarm(); a.Kind != "prober_suspect" || a.Detail != alarms[0].Detail || !a.Since.Equal(alarms[0].Since) {
		t.Errorf("as a server alarm: %+v", a)
	}
	if n := metric(t, f, "muster_prober_suspect", "prober", "prober:prober-az1"); n != 1 {
		t.Errorf("muster_prober_suspect{prober=prober:prober-az1} = %v, want 1", n)
	}
	if n := metric(t, f, "muster_prober_contradicted_targets", "prober", "prober:prober-az1"); n != 3 {
		t.Errorf("muster_prober_contradicted_targets{prober=prober:prober-az1} = %v, want 3", n)
	}
	for _, id := range f.web {
		v := f.verdict(t, "web", id)
		if v.State != "eligible" || !strings.Contains(strings.Join(v.Reasons, ";"), "probe from prober prober-az1 ignored: suspect") {
			t.Fatalf("target of the suspect prober: %+v", v)
		}
	}

	// The prober falls silent: no longer failing, so no longer suspect,
	// and in outage.
	for range 4 {
		f.Clock.Advance(5 * time.Second)
		both("")
		f.Evaluator.EvaluateNow()
	}
	alarms = f.Evaluator.ProberAlarms()
	if len(alarms) != 1 || alarms[0].Kind != evaluator.AlarmProberOutage || alarms[0].Prober != "prober-az1" ||
		!strings.HasPrefix(alarms[0].Detail, "prober prober-az1 has observed none of its 3 targets since") {
		t.Fatalf("alarms %+v, want prober-az1 in outage", alarms)
	}
	for _, id := range f.web {
		v := f.verdict(t, "web", id)
		if v.State != "eligible" || !strings.Contains(strings.Join(v.Reasons, ";"), "prober prober-az1 in outage") {
			t.Fatalf("target of the prober in outage: %+v", v)
		}
	}
}

// TestRefreshKeepsANewerProberAssignment: an assignment committed (and
// applied through ProberAssigned) after a refresh read the assignments is
// not put back to the older one by that refresh's end: the prober's first
// reports are accepted at once, not refused "not assigned" until the next
// refresh (CI at f611d01).
func TestRefreshKeepsANewerProberAssignment(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	ctx := context.Background()
	type mine struct{}
	assigned := false
	f.Evaluator.SetAfterAssignmentsRead(func(c context.Context) {
		if c.Value(mine{}) == nil || assigned {
			return // another refresh, or done already
		}
		assigned = true
		if _, err := f.Registry.PutProberAssignments(ctx, admin, "prober-az2", registry.ProberAssignments{Services: []string{"web"}}); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { f.Evaluator.SetAfterAssignmentsRead(nil) })
	if err := f.Evaluator.SyncNow(context.WithValue(ctx, mine{}, true)); err != nil {
		t.Fatal(err)
	}
	if !assigned {
		t.Fatal("the hook did not run")
	}
	p2 := f.Token(t, prober2)
	if res := f.post(t, p2, report(f.web[0], "probe", "success")); res.Accepted != 1 {
		t.Fatalf("prober-az2's report just after its assignment: %+v", res)
	}
}

// TestAssignmentDuringTheRebuildIsKept: an assignment committed while the
// evaluator rebuilds, after the rebuild read the assignments, is not lost
// until the next refresh (cmd/muster's TestTgsyncHAProxyEndToEnd met its
// prober refused "not assigned" on a loaded machine).
func TestAssignmentDuringTheRebuildIsKept(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{NoStart: true})
	ctx := context.Background()
	type mine struct{}
	assigned := false
	f.Evaluator.SetAfterAssignmentsRead(func(c context.Context) {
		if c.Value(mine{}) == nil || assigned {
			return
		}
		assigned = true
		if _, err := f.Registry.PutProberAssignments(ctx, admin, "prober-az2", registry.ProberAssignments{Services: []string{"web"}}); err != nil {
			t.Error(err)
		}
	})
	if err := f.Evaluator.SyncNow(context.WithValue(ctx, mine{}, true)); err != nil {
		t.Fatal(err)
	}
	if !assigned {
		t.Fatal("the hook did not run")
	}
	if !f.Evaluator.ProberCovers("prober-az2", "web") {
		t.Fatal("an assignment committed during the rebuild, after its read, is lost")
	}
}
