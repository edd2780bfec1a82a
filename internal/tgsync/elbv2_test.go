package tgsync

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/musterhq/muster/internal/tgsync/elbv2standin"
	"github.com/musterhq/muster/resolver"
)

const testARN = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123456789abcdef"

// elbFixture is the real SDK against the ELBv2 stand-in, a real resolver
// cache as the source, and a Syncer on an injected clock.
type elbFixture struct {
	standin *elbv2standin.StandIn
	backend *ELBv2
	src     *cacheSource
	clk     *clock
	s       *Syncer
	eps     []ep
	version uint64
}

type elbOpts struct {
	slowStart int
	dryRun    bool
	policy    Policy
	creds     string
	readEvery time.Duration
}

func newELBFixture(t *testing.T, n int, o elbOpts) *elbFixture {
	t.Helper()
	st := elbv2standin.New("AKIDSTANDIN")
	st.AddGroup(testARN, "ip", 80, o.slowStart)
	srv := httptest.NewServer(st)
	t.Cleanup(srv.Close)
	if o.creds == "" {
		o.creds = "AKIDSTANDIN"
	}
	awsCfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider(o.creds, "secret", "")}
	api := NewELBv2Client(awsCfg, AWSConfig{EndpointURL: srv.URL, MaxAttempts: 10, MaxBackoff: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	be, err := NewELBv2(ctx, api, ELBv2Target{TargetGroupARN: testARN, TargetType: "ip"})
	if err != nil {
		t.Fatal(err)
	}
	if o.policy == (Policy{}) {
		o.policy = Policy{MaxDeregisterFraction: DefaultMaxDeregisterFraction, AddStepFraction: DefaultAddStepFraction}
	}
	f := &elbFixture{standin: st, backend: be, clk: &clock{now: t0}}
	f.src = newCacheSource(t, f.clk.Now, time.Minute, "web")
	f.s, err = NewSyncer(SyncerConfig{Source: f.src, Clock: f.clk.Now, Registerer: prometheus.NewRegistry(), DryRun: o.dryRun,
		Interval: 30 * time.Second, Rand: func() float64 { return 0.5 },
		Bindings: []Bound{{Binding: Binding{Name: "alb", Service: "web", ELBv2: &ELBv2Target{TargetGroupARN: testARN, TargetType: "ip"}, Policy: o.policy}, Backend: be, ReadEvery: o.readEvery}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		f.eps = append(f.eps, ep{addr: fmt.Sprintf("10.0.%d.%d", i%2, i+1), port: 8080, zone: fmt.Sprintf("az%d", i%2+1)})
	}
	return f
}

// publish applies the fixture's endpoints as the next view; zones
// override the computed zone objects.
func (f *elbFixture) publish(t *testing.T, zones map[string]resolver.Zone) error {
	t.Helper()
	f.version++
	return f.src.apply(viewOf("web", f.version, f.eps, zones))
}

func (f *elbFixture) registered() []string { return f.standin.Registered(testARN) }

func addrs(f *elbFixture, idx ...int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, f.eps[i].addr+":8080")
	}
	slices.Sort(out)
	return out
}

func upTo(n int) []int { return seq(0, n-1) }

func (f *elbFixture) metric(g *prometheus.GaugeVec) float64 {
	return testutil.ToFloat64(g.WithLabelValues("alb"))
}

// TestELBv2Diffs: the first view registers every target at once (an
// empty group); a withdrawal deregisters it (the group's draining state
// does not count as registered); re-entry registers it again; a target
// someone registered by hand is reported and left alone; a 10 to 4
// scale-down the registry lists is followed at once.
func TestELBv2Diffs(t *testing.T) {
	t.Parallel()
	f := newELBFixture(t, 10, elbOpts{})
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	mustSync(t, f.s)
	if got, want := f.registered(), addrs(f, upTo(10)...); !slices.Equal(got, want) {
		t.Fatalf("after v1: %v, want %v", got, want)
	}
	f.standin.Put(testARN, "192.168.9.9", 8080) // by hand
	f.eps[3].state = resolver.StateIneligible
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	rep := mustSync(t, f.s)[0]
	want := addrs(f, 0, 1, 2, 4, 5, 6, 7, 8, 9)
	want = append(want, "192.168.9.9:8080")
	slices.Sort(want)
	if got := f.registered(); !slices.Equal(got, want) {
		t.Fatalf("after the withdrawal: %v, want %v", got, want)
	}
	if !slices.Contains(f.standin.Targets(testARN), f.eps[3].addr+":8080 draining") {
		t.Fatalf("the withdrawn target is not draining: %v", f.standin.Targets(testARN))
	}
	if len(rep.Plan.Unmanaged) != 1 || f.metric(f.s.m.unmanaged) != 1 {
		t.Fatalf("unmanaged not reported: %+v", rep.Plan.Unmanaged)
	}
	f.eps[3].state = ""
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(30 * time.Second) // next interval: the step is free
	mustSync(t, f.s)
	if got := f.registered(); len(got) != 11 {
		t.Fatalf("after re-entry: %v", got)
	}

	// Scale-down: six instances deregistered from muster (the view no
	// longer carries them; the registry lists four).
	f.eps = f.eps[:4]
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	rep = mustSync(t, f.s)[0]
	if rep.Hold != nil {
		t.Fatalf("the resolver held a shrink the registry explains: %+v", rep.Hold)
	}
	want = append(addrs(f, 0, 1, 2, 3), "192.168.9.9:8080")
	slices.Sort(want)
	if got := f.registered(); !slices.Equal(got, want) {
		t.Fatalf("after 10 -> 4: %v, want %v (%s)", got, want, rep.Plan.Describe())
	}
}

// TestELBv2CappedDeregistrations: a view withdrawing half of ten
// (unexplained, under the client guard's cap) drains the group one per
// interval, with pending deregistrations metered, never faster.
func TestELBv2CappedDeregistrations(t *testing.T) {
	t.Parallel()
	f := newELBFixture(t, 10, elbOpts{})
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	mustSync(t, f.s)
	for _, i := range []int{0, 2, 4, 6} {
		f.eps[i].state = resolver.StateIneligible
	}
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	for step := 1; step <= 4; step++ {
		mustSync(t, f.s)
		mustSync(t, f.s) // a second cycle in the same interval changes nothing
		if got := len(f.registered()); got != 10-step {
			t.Fatalf("interval %d: %d registered, want %d", step, got, 10-step)
		}
		if p := f.metric(f.s.m.pendingDeregs); p != float64(4-step) {
			t.Fatalf("interval %d: pending %v, want %d", step, p, 4-step)
		}
		f.clk.Advance(30 * time.Second)
	}
	if got, want := f.registered(), addrs(f, 1, 3, 5, 7, 8, 9); !slices.Equal(got, want) {
		t.Fatalf("drained to %v, want %v", got, want)
	}
}

// TestELBv2HeldEmptySet: a view with nothing routable is held by the
// resolver (the group unchanged, held metered); when the resolver follows
// it after its confirm time, the plan still refuses to empty the group.
func TestELBv2HeldEmptySet(t *testing.T) {
	t.Parallel()
	f := newELBFixture(t, 4, elbOpts{})
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	mustSync(t, f.s)
	for i := range f.eps {
		f.eps[i].state = resolver.StateIneligible
	}
	if err := f.publish(t, nil); err == nil {
		t.Fatal("the resolver took an empty view")
	}
	rep := mustSync(t, f.s)[0]
	if rep.Hold == nil || rep.Version != 1 || f.metric(f.s.m.held) != 1 {
		t.Fatalf("no hold: %+v", rep)
	}
	if got := f.registered(); len(got) != 4 {
		t.Fatalf("held: %v", got)
	}
	f.clk.Advance(61 * time.Second)
	f.src.Sweep() // the resolver follows the empty set muster stood by
	rep = mustSync(t, f.s)[0]
	if rep.Hold != nil || rep.Version != 2 || rep.Plan.Held != HeldEmpty || f.metric(f.s.m.held) != 1 {
		t.Fatalf("after the confirm time: %+v %s", rep, rep.Plan.Describe())
	}
	if got := f.registered(); len(got) != 4 {
		t.Fatalf("emptied: %v", got)
	}
}

// TestELBv2ThrottlingRetried: the stand-in answers Throttling three times;
// the SDK's retryer retries and the cycle succeeds.
func TestELBv2ThrottlingRetried(t *testing.T) {
	t.Parallel()
	f := newELBFixture(t, 3, elbOpts{})
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	f.standin.Throttle("DescribeTargetHealth", 3)
	f.standin.Throttle("RegisterTargets", 3)
	mustSync(t, f.s)
	if got := f.registered(); len(got) != 3 {
		t.Fatalf("registered %v", got)
	}
	calls, _ := f.standin.Calls()
	if calls["DescribeTargetHealth"] != 4 || calls["RegisterTargets"] != 4 {
		t.Fatalf("calls %v: want 4 each (3 throttled + 1)", calls)
	}
	if n := testutil.ToFloat64(f.s.m.apiErrors.WithLabelValues("alb")); n != 0 {
		t.Fatalf("api errors %v", n)
	}
}

// TestELBv2FailedCallKeepsTheDesiredState: a call that fails for good
// fails the cycle (metered), and the next cycle after the backoff applies
// the same desired state.
func TestELBv2FailedCallKeepsTheDesiredState(t *testing.T) {
	t.Parallel()
	f := newELBFixture(t, 3, elbOpts{})
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	f.standin.Fail("RegisterTargets", 1)
	rep := f.s.RunOnce(context.Background())[0]
	if rep.Err == nil || !strings.Contains(rep.Err.Error(), "ValidationError") {
		t.Fatalf("cycle: %v", rep.Err)
	}
	if n := testutil.ToFloat64(f.s.m.apiErrors.WithLabelValues("alb")); n != 1 {
		t.Fatalf("api errors %v", n)
	}
	if reps := f.s.RunOnce(context.Background()); len(reps) != 0 {
		t.Fatalf("retried inside the backoff: %+v", reps)
	}
	f.clk.Advance(time.Second)
	mustSync(t, f.s)
	if got := f.registered(); len(got) != 3 {
		t.Fatalf("after the retry: %v", got)
	}
}

// TestELBv2DryRunChangesNothing: a dry run plans and reports, and the
// group stays as it was.
func TestELBv2DryRunChangesNothing(t *testing.T) {
	t.Parallel()
	f := newELBFixture(t, 3, elbOpts{dryRun: true})
	f.standin.Put(testARN, "10.0.0.1", 8080) // endpoint 0, registered already
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	rep := mustSync(t, f.s)[0]
	if len(rep.Plan.Register) != 1 || len(rep.Plan.DeferredRegister) != 1 || rep.Applied { // one step of the group of one
		t.Fatalf("plan %s applied %v", rep.Plan.Describe(), rep.Applied)
	}
	if got := f.registered(); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
		t.Fatalf("a dry run changed the group: %v", got)
	}
	calls, _ := f.standin.Calls()
	if calls["RegisterTargets"]+calls["DeregisterTargets"] != 0 {
		t.Fatalf("a dry run called %v", calls)
	}
}

// TestELBv2SlowStart: a group without slow start takes additions in
// steps of a quarter of the group per interval; one with slow start
// (ALB ramps them) takes them at once.
func TestELBv2SlowStart(t *testing.T) {
	t.Parallel()
	for _, slow := range []int{0, 60} {
		f := newELBFixture(t, 8, elbOpts{slowStart: slow})
		f.eps = f.eps[:4]
		if err := f.publish(t, nil); err != nil {
			t.Fatal(err)
		}
		mustSync(t, f.s)
		f.eps = append(f.eps, ep{addr: "10.0.5.1", port: 8080, zone: "az1"}, ep{addr: "10.0.5.2", port: 8080, zone: "az1"},
			ep{addr: "10.0.5.3", port: 8080, zone: "az2"}, ep{addr: "10.0.5.4", port: 8080, zone: "az2"})
		if err := f.publish(t, nil); err != nil {
			t.Fatal(err)
		}
		mustSync(t, f.s)
		want := 5 // 4 + max(1, 25% of 4)
		if slow > 0 {
			want = 8
		}
		if got := len(f.registered()); got != want {
			t.Fatalf("slow start %d: %d registered, want %d", slow, got, want)
		}
		if slow == 0 {
			f.clk.Advance(30 * time.Second)
			mustSync(t, f.s) // 5 + 1
			f.clk.Advance(30 * time.Second)
			mustSync(t, f.s) // 6 + 1
			if got := len(f.registered()); got != 7 {
				t.Fatalf("two steps later: %d", got)
			}
		}
	}
}

// TestELBv2Refusals: a group of type instance is refused, and so is a
// request signed with other credentials (the stand-in checks SigV4's
// credential scope).
func TestELBv2Refusals(t *testing.T) {
	t.Parallel()
	st := elbv2standin.New("AKIDSTANDIN")
	st.AddGroup(testARN, "instance", 80, 0)
	srv := httptest.NewServer(st)
	t.Cleanup(srv.Close)
	for _, c := range []struct{ key, want string }{{"AKIDSTANDIN", "of type \"instance\""}, {"AKIDOTHER", "InvalidClientTokenId"}} {
		api := NewELBv2Client(aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider(c.key, "s", "")},
			AWSConfig{EndpointURL: srv.URL, MaxAttempts: 1})
		_, err := NewELBv2(context.Background(), api, ELBv2Target{TargetGroupARN: testARN})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.key, err, c.want)
		}
	}
}

// TestELBv2ReadEvery: with ReadEvery, cycles on view changes inside it
// plan against the state last read plus tgsync's own changes (no
// DescribeTargetHealth), and still converge; a target someone removed
// by hand is put back once the state is read again; a failed call makes
// the next cycle read.
func TestELBv2ReadEvery(t *testing.T) {
	t.Parallel()
	f := newELBFixture(t, 6, elbOpts{readEvery: 30 * time.Second})
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	mustSync(t, f.s)
	describes := func() int { c, _ := f.standin.Calls(); return c["DescribeTargetHealth"] }
	if describes() != 1 {
		t.Fatalf("first cycle: %d reads", describes())
	}
	for step := range 3 {
		f.clk.Advance(time.Second)
		f.eps[step].state = resolver.StateIneligible
		if err := f.publish(t, nil); err != nil {
			t.Fatal(err)
		}
		mustSync(t, f.s)
		f.clk.Advance(8 * time.Second) // the cap: one deregistration per 30 s (10% of 6, at least 1)
	}
	if describes() != 1 {
		t.Fatalf("view-change cycles read the group: %d reads", describes())
	}
	if got := f.registered(); len(got) != 5 {
		t.Fatalf("after three withdrawals inside 30 s with a cap of 1: %v", got)
	}
	// Someone removes a target the view routes to by hand: a cycle
	// inside ReadEvery does not know; the next read does, and puts it
	// back (with the next interval's deregistration).
	f.standin.Remove(testARN, f.eps[5].addr, 8080)
	mustSync(t, f.s)
	if describes() != 1 || slices.Contains(f.registered(), f.eps[5].addr+":8080") {
		t.Fatalf("inside ReadEvery: %d reads, %v", describes(), f.registered())
	}
	f.clk.Advance(31 * time.Second)
	mustSync(t, f.s)
	if describes() != 2 {
		t.Fatalf("after ReadEvery: %d reads", describes())
	}
	// 10.0.0.1 (0) went first, 10.0.0.3 (2) now; 10.0.1.2 (1) waits.
	if got, want := f.registered(), addrs(f, 1, 3, 4, 5); !slices.Equal(got, want) {
		t.Fatalf("after the read: %v, want %v", got, want)
	}
	f.standin.Fail("RegisterTargets", 1)
	f.eps[0].state = ""
	if err := f.publish(t, nil); err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(31 * time.Second) // the next slow-start step (and a read)
	if rep := f.s.RunOnce(context.Background())[0]; rep.Err == nil {
		t.Fatal("the failed register did not fail the cycle")
	}
	f.clk.Advance(2 * time.Second)
	mustSync(t, f.s)
	if got := f.registered(); describes() != 4 || !slices.Contains(got, f.eps[0].addr+":8080") { // the retry reads again
		t.Fatalf("after a failure: %d reads, %v", describes(), got)
	}
}
