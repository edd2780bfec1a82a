package routingcontrol

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/testclock"
	"github.com/musterhq/muster/internal/wait"
)

// fakeSource answers what the test set last.
type fakeSource struct {
	mu      sync.Mutex
	reading Reading
	err     error
	reads   atomic.Int64
}

func (s *fakeSource) Kind() string     { return "fake" }
func (s *fakeSource) Location() string { return "test" }
func (s *fakeSource) Read(context.Context, string) (Reading, error) {
	s.reads.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reading, s.err
}

func (s *fakeSource) set(regions map[string]State, rev string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reading, s.err = Reading{Regions: regions, Revision: rev}, err
}

// fakeAudit keeps the rows; it fails while down.
type fakeAudit struct {
	mu   sync.Mutex
	rows []audit.Entry
	down bool
}

func (a *fakeAudit) Append(_ context.Context, _ time.Time, e audit.Entry) (audit.Event, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		return audit.Event{}, errors.New("database unreachable")
	}
	a.rows = append(a.rows, e)
	return audit.Event{}, nil
}

func (a *fakeAudit) entries() []audit.Entry {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]audit.Entry(nil), a.rows...)
}

func (a *fakeAudit) setDown(down bool) { a.mu.Lock(); a.down = down; a.mu.Unlock() }

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func newControls(t *testing.T, src Source, aud Auditor, reg prometheus.Registerer) (*Controls, *testclock.Clock) {
	t.Helper()
	clock := testclock.New(t0)
	c, err := New(Config{Source: src, Interval: 5 * time.Second, Regions: []string{"us-east-1", "eu-west-1"}, Replica: "r1",
		Audit: aud, Registerer: reg, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return c, clock
}

func kinds(c *Controls) []string {
	var out []string
	for _, a := range c.Alarms() {
		out = append(out, a.Kind)
	}
	return out
}

// TestFailStatic: a source that fails, answers junk or is missing leaves
// the last good controls in force; stale only after StaleAfter; a read
// that comes back clears it.
func TestFailStatic(t *testing.T) {
	t.Parallel()
	src, aud, reg := &fakeSource{}, &fakeAudit{}, prometheus.NewRegistry()
	c, clock := newControls(t, src, aud, reg)
	ctx := context.Background()
	if !c.On("us-east-1") || !c.On("nowhere") {
		t.Fatal("before any reading every region is On")
	}
	src.set(map[string]State{"eu-west-1": Off}, "r1", nil)
	c.RunOnce(ctx)
	if c.On("eu-west-1") || !c.On("us-east-1") || !c.On("ap-south-1") {
		t.Fatalf("after eu-west-1=off: %+v", c.Status().Regions)
	}
	for _, err := range []error{
		&ReadError{Reason: ReasonUnreachable, Err: errors.New("connection refused")},
		&ReadError{Reason: ReasonMalformed, Err: ErrMalformed},
		&ReadError{Reason: ReasonTimeout, Err: context.DeadlineExceeded},
	} {
		src.set(nil, "", err)
		clock.Advance(5 * time.Second)
		c.RunOnce(ctx)
		if c.On("eu-west-1") || !c.On("us-east-1") {
			t.Fatalf("a failed read (%v) changed the controls: %+v", err, c.Status().Regions)
		}
	}
	if st := c.Status(); st.Stale || st.LastError == "" || st.Revision != "r1" {
		t.Fatalf("15 s without a good read: %+v, want not yet stale, the error stated", st)
	}
	clock.Advance(5 * time.Second)
	c.RunOnce(ctx)
	if !c.Status().Stale || !cmp.Equal(kinds(c), []string{AlarmStale}) {
		t.Fatalf("20 s without a good read: stale %v, alarms %v", c.Status().Stale, kinds(c))
	}
	if v := testutil.ToFloat64(c.metrics.stale); v != 1 {
		t.Errorf("muster_routing_control_stale %v, want 1", v)
	}
	if v := testutil.ToFloat64(c.metrics.failures.WithLabelValues(ReasonTimeout)); v != 2 {
		t.Errorf("timeouts counted %v, want 2", v)
	}
	if c.On("eu-west-1") {
		t.Fatal("stale turned eu-west-1 back on")
	}
	src.set(map[string]State{"eu-west-1": Off}, "r1", nil)
	clock.Advance(5 * time.Second)
	c.RunOnce(ctx)
	if st := c.Status(); st.Stale || st.LastError != "" || len(c.Alarms()) != 0 {
		t.Fatalf("after a good read: %+v, alarms %v", st, kinds(c))
	}
	if n := len(aud.entries()); n != 1 {
		t.Errorf("%d audit rows, want the one change", n)
	}
}

// TestUnnamedIsOn: a region the source stops naming is On again; that is
// a change, audited.
func TestUnnamedIsOn(t *testing.T) {
	t.Parallel()
	src, aud := &fakeSource{}, &fakeAudit{}
	c, clock := newControls(t, src, aud, nil)
	var got []Change
	c.OnChange(func(ch Change) { got = append(got, ch) })
	src.set(map[string]State{"eu-west-1": Off, "ap-south-1": On}, "a", nil)
	c.RunOnce(context.Background())
	clock.Advance(time.Minute)
	src.set(map[string]State{}, "b", nil)
	c.RunOnce(context.Background())
	want := []Change{
		{Region: "eu-west-1", From: On, To: Off, At: t0, Revision: "a"},
		{Region: "eu-west-1", From: Off, To: On, At: t0.Add(time.Minute), Revision: "b"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
	rows := aud.entries()
	if len(rows) != 2 || rows[0].Action != ActionChange || rows[0].ActorKind != "system" || rows[0].Actor != auditActor ||
		rows[0].Target != "eu-west-1" || !strings.Contains(rows[0].Reason, "turned region eu-west-1 off") ||
		!strings.Contains(rows[0].Reason, "replica r1") || !strings.Contains(rows[1].Reason, "turned region eu-west-1 on") {
		t.Fatalf("audit rows %+v", rows)
	}
	st := c.Status()
	want2 := []RegionStatus{
		{Region: "ap-south-1", State: On, Since: t0},
		{Region: "eu-west-1", State: On, Since: t0.Add(time.Minute)},
		{Region: "us-east-1", State: On, Since: t0},
	}
	if d := cmp.Diff(want2, st.Regions); d != "" {
		t.Errorf("regions (-want +got):\n%s", d)
	}
}

// TestAllOffRefused: a reading that leaves no known region On is refused
// (safety rule): the previous controls stay, the alarm is raised, one
// refused row is audited, and a reading with a region On clears it.
func TestAllOffRefused(t *testing.T) {
	t.Parallel()
	src, aud := &fakeSource{}, &fakeAudit{}
	c, clock := newControls(t, src, aud, nil)
	ctx := context.Background()
	src.set(map[string]State{"eu-west-1": Off}, "a", nil)
	c.RunOnce(ctx)
	// us-east-1 is a configured region: naming only eu-west-1 and
	// us-east-1 off leaves nothing on.
	src.set(map[string]State{"eu-west-1": Off, "us-east-1": Off}, "b", nil)
	for range 3 {
		clock.Advance(5 * time.Second)
		c.RunOnce(ctx)
	}
	if !c.On("us-east-1") || c.On("eu-west-1") {
		t.Fatalf("the all-off reading was applied: %+v", c.Status().Regions)
	}
	st := c.Status()
	if !st.AllOffRefused || st.Revision != "a" || !strings.Contains(st.LastError, "every region is off") {
		t.Fatalf("status %+v", st)
	}
	if !cmp.Equal(kinds(c), []string{AlarmAllOff}) {
		t.Fatalf("alarms %v, want %s", kinds(c), AlarmAllOff)
	}
	rows := aud.entries()
	if len(rows) != 2 || rows[1].Action != ActionRefused || rows[1].Outcome != audit.Refused {
		t.Fatalf("audit rows %+v, want the change and one refusal", rows)
	}
	src.set(map[string]State{"eu-west-1": On, "us-east-1": Off}, "c", nil)
	clock.Advance(5 * time.Second)
	c.RunOnce(ctx)
	if c.On("us-east-1") || !c.On("eu-west-1") || len(c.Alarms()) != 0 {
		t.Fatalf("after a reading with a region on: %+v, alarms %v", c.Status().Regions, kinds(c))
	}
}

// TestAuditHeldWhileDatabaseDown: rows that cannot be written are kept
// and written, in order, at a later read.
func TestAuditHeldWhileDatabaseDown(t *testing.T) {
	t.Parallel()
	src, aud := &fakeSource{}, &fakeAudit{down: true}
	c, clock := newControls(t, src, aud, nil)
	src.set(map[string]State{"eu-west-1": Off}, "a", nil)
	c.RunOnce(context.Background())
	clock.Advance(5 * time.Second)
	src.set(map[string]State{"eu-west-1": On}, "b", nil)
	c.RunOnce(context.Background())
	if len(aud.entries()) != 0 {
		t.Fatal("written while down")
	}
	aud.setDown(false)
	c.RunOnce(context.Background())
	rows := aud.entries()
	if len(rows) != 2 || !strings.Contains(rows[0].Reason, " off") || !strings.Contains(rows[1].Reason, " on") {
		t.Fatalf("rows %+v", rows)
	}
}

// TestWorkerReadsEveryInterval: the worker reads at once and then every
// interval, and stops.
func TestWorkerReadsEveryInterval(t *testing.T) {
	t.Parallel()
	src := &fakeSource{}
	src.set(map[string]State{"eu-west-1": Off}, "a", nil)
	c, err := New(Config{Source: src, Interval: 10 * time.Millisecond, Regions: []string{"us-east-1"}})
	if err != nil {
		t.Fatal(err)
	}
	c.Stop() // before Start: nothing
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 5*time.Second, "eu-west-1 off", func() bool { return !c.On("eu-west-1") })
	wait.For(t, 5*time.Second, "three reads", func() bool { return src.reads.Load() >= 3 })
	c.Stop()
	c.Stop()
	n := src.reads.Load()
	if m := src.reads.Load(); m != n {
		t.Fatalf("reads after Stop: %d then %d", n, m)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}); err == nil {
		t.Error("no source: accepted")
	}
	if _, err := New(Config{Source: &fakeSource{}, Regions: []string{"Bad_Region"}}); err == nil {
		t.Error("bad region: accepted")
	}
	c, err := New(Config{Source: &fakeSource{}, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Timeout != time.Second || c.cfg.StaleAfter != 15*time.Second {
		t.Errorf("defaults: timeout %s, stale after %s", c.cfg.Timeout, c.cfg.StaleAfter)
	}
}

// TestWorkerGoesStale: the running worker, its clock injected, marks the
// state stale once the clock passes StaleAfter without a good reading,
// keeps the last good controls, and recovers when the source answers.
func TestWorkerGoesStale(t *testing.T) {
	t.Parallel()
	src := &fakeSource{}
	src.set(map[string]State{"eu-west-1": Off}, "a", nil)
	clock := testclock.New(t0)
	c, err := New(Config{Source: src, Interval: 10 * time.Millisecond, StaleAfter: 30 * time.Second, Regions: []string{"us-east-1"}, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	wait.For(t, 5*time.Second, "eu-west-1 off", func() bool { return !c.On("eu-west-1") })
	src.set(nil, "", &ReadError{Reason: ReasonUnreachable, Err: errors.New("connection refused")})
	wait.For(t, 5*time.Second, "the failure noticed", func() bool { return c.Status().LastError != "" })
	if c.Status().Stale {
		t.Fatal("stale before StaleAfter")
	}
	clock.Advance(31 * time.Second)
	wait.For(t, 5*time.Second, "stale", func() bool { return cmp.Equal(kinds(c), []string{AlarmStale}) })
	if c.On("eu-west-1") {
		t.Fatal("stale turned eu-west-1 on")
	}
	src.set(map[string]State{"eu-west-1": On}, "b", nil)
	wait.For(t, 5*time.Second, "fresh again", func() bool { return !c.Status().Stale && c.On("eu-west-1") })
}

// TestOnlyTheOwnerAudits: of the replicas reading one source, only the
// owner of AuditOwnershipKey writes a change's row; a row waits up to a
// minute for this replica to own the key, then is left to the owner.
func TestOnlyTheOwnerAudits(t *testing.T) {
	t.Parallel()
	src, aud := &fakeSource{}, &fakeAudit{}
	clock := testclock.New(t0)
	var owns atomic.Bool
	c, err := New(Config{Source: src, Interval: 5 * time.Second, Regions: []string{"us-east-1", "eu-west-1"}, Replica: "r2",
		Audit: aud, Now: clock.Now, Owns: func(key string) bool { return key == AuditOwnershipKey && owns.Load() }})
	if err != nil {
		t.Fatal(err)
	}
	src.set(map[string]State{"eu-west-1": Off}, "a", nil)
	c.RunOnce(context.Background())
	if n := len(aud.entries()); n != 0 {
		t.Fatalf("%d rows written without owning the key", n)
	}
	// It becomes the owner within the minute: the row is written.
	clock.Advance(30 * time.Second)
	owns.Store(true)
	c.RunOnce(context.Background())
	if rows := aud.entries(); len(rows) != 1 || !strings.Contains(rows[0].Reason, " off") {
		t.Fatalf("rows once owned: %+v", rows)
	}
	// Another change while it does not own the key, for over a minute:
	// left to the owner, not written later.
	owns.Store(false)
	src.set(map[string]State{"eu-west-1": On}, "b", nil)
	c.RunOnce(context.Background())
	clock.Advance(61 * time.Second)
	c.RunOnce(context.Background())
	owns.Store(true)
	c.RunOnce(context.Background())
	if n := len(aud.entries()); n != 1 {
		t.Fatalf("%d rows: a change left to the owner was written later", n)
	}
}
