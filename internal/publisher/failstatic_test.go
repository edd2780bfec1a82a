package publisher_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/publisher"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/testclock"
	"github.com/musterhq/muster/internal/wait"
)

// outage takes the test database away the way a failed PostgreSQL looks to
// muster: every open connection is ended and new ones are refused. The
// returned function brings it back.
func outage(t *testing.T, pool *pgxpool.Pool) (restore func()) {
	t.Helper()
	ctx := context.Background()
	cfg := pool.Config().ConnConfig.Copy()
	name := cfg.Database
	cfg.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(ctx) })
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	ident := pgx.Identifier{name}.Sanitize()
	exec("ALTER DATABASE " + ident + " WITH ALLOW_CONNECTIONS false")
	exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", name)
	if err := pool.Ping(ctx); err == nil {
		t.Fatal("the database still answers during the outage")
	}
	return func() { exec("ALTER DATABASE " + ident + " WITH ALLOW_CONNECTIONS true") }
}

// input is a settable evaluator output: each service's instances with
// their verdicts.
type input struct {
	mu  sync.Mutex
	svc map[string][]assembler.InstanceInput
}

func (in *input) set(service string, eps []assembler.InstanceInput) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.svc == nil {
		in.svc = map[string][]assembler.InstanceInput{}
	}
	in.svc[service] = eps
}

func (in *input) snapshot(service string) (assembler.ServiceInput, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	eps, ok := in.svc[service]
	if !ok {
		return assembler.ServiceInput{}, false
	}
	return assembler.ServiceInput{Name: service, MinHealthyFraction: 0.5, Capabilities: []string{"probe"},
		Instances: append([]assembler.InstanceInput(nil), eps...)}, true
}

func endpoints(n int, st eligibility.State) []assembler.InstanceInput {
	out := make([]assembler.InstanceInput, n)
	for i := range out {
		out[i] = assembler.InstanceInput{ID: uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "i%d", i)), Address: fmt.Sprintf("10.1.0.%d", i),
			Port: 8080, Zone: fmt.Sprintf("az%d", i%2+1), State: st, Weight: 1, HealthKnown: true}
		if st == eligibility.Ineligible {
			out[i].Weight = 0
		}
	}
	return out
}

type rig struct {
	*publisher.Publisher
	clk     *testclock.Clock
	in      *input
	hub     *stream.Hub
	metrics *prometheus.Registry
}

func newRig(t *testing.T, pool *pgxpool.Pool, clk *testclock.Clock, in *input, cfg func(*publisher.Config)) *rig {
	t.Helper()
	r := &rig{clk: clk, in: in, hub: stream.NewHub(stream.Config{Now: clk.Now}), metrics: prometheus.NewRegistry()}
	c := publisher.Config{Snapshot: in.snapshot, Hub: r.hub, Pool: pool, Now: clk.Now, Registerer: r.metrics}
	if cfg != nil {
		cfg(&c)
	}
	p, err := publisher.New(c)
	if err != nil {
		t.Fatal(err)
	}
	r.Publisher = p
	return r
}

// publish tells the publisher service changed and steps it past the
// addition window.
func (r *rig) publish(t *testing.T, service string) *assembler.View {
	t.Helper()
	r.ServicesChanged([]string{service})
	r.RunOnce()
	r.clk.Advance(1100 * time.Millisecond)
	r.RunOnce()
	v, ok := r.View(service)
	if !ok {
		t.Fatalf("no view of %s", service)
	}
	return v
}

func (r *rig) gauge(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := r.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// savedVersion reads the version of a service's saved view.
func savedVersion(t *testing.T, pool *pgxpool.Pool, service string) uint64 {
	t.Helper()
	var v int64
	err := pool.QueryRow(context.Background(), "SELECT version FROM published_views WHERE service = $1", service).Scan(&v)
	if err == pgx.ErrNoRows {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return uint64(v)
}

// TestPublishesThroughADatabaseOutage: with PostgreSQL gone after start,
// more versions than a whole old reservation block (1,000) are published,
// withdrawals included, strictly increasing; the views to save wait, one
// per service, and are saved once PostgreSQL is back.
func TestPublishesThroughADatabaseOutage(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	in := &input{}
	eps := endpoints(4, eligibility.Eligible)
	in.set("web", eps)
	in.set("api", endpoints(2, eligibility.Eligible))
	r := newRig(t, pool, clk, in, nil)
	if err := r.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	r.ServicesChanged([]string{"api"})
	first := r.publish(t, "web")
	if err := r.SaveOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := savedVersion(t, pool, "web"); got != first.Version {
		t.Fatalf("saved version %d, published %d", got, first.Version)
	}

	restore := outage(t, pool)
	last := first.Version
	withdrawals := 0
	const n = 1200
	for i := range n {
		// Instance 0 fails and recovers in turn: a withdrawal, then an
		// addition.
		eps = append([]assembler.InstanceInput(nil), eps...)
		if i%2 == 0 {
			eps[0].State, eps[0].Weight = eligibility.Ineligible, 0
		} else {
			eps[0].State, eps[0].Weight = eligibility.Eligible, 1
		}
		in.set("web", eps)
		r.ServicesChanged([]string{"web"})
		r.RunOnce()
		if i%2 == 0 {
			clk.Advance(60 * time.Millisecond) // the withdrawal window
		} else {
			clk.Advance(1100 * time.Millisecond) // the addition window
		}
		r.RunOnce()
		v, _ := r.View("web")
		if v.Version <= last {
			t.Fatalf("step %d: version %d after %d: not published, or not increasing", i, v.Version, last)
		}
		if got := len(v.Endpoints); (i%2 == 0) != (got == 3) {
			t.Fatalf("step %d: %d endpoints published", i, got)
		}
		if f, ok := r.hub.View("web"); !ok || f.Version != v.Version {
			t.Fatalf("step %d: the hub holds %+v, the publisher %d", i, f, v.Version)
		}
		if i%2 == 0 {
			withdrawals++
		}
		last = v.Version
		if i%100 == 0 {
			if err := r.SaveOnce(ctx); err == nil {
				t.Fatal("saved with the database away")
			}
		}
	}
	if withdrawals != n/2 {
		t.Fatalf("%d withdrawals published", withdrawals)
	}
	// One view waits per service, whatever was published meanwhile.
	if got := r.gauge(t, "muster_published_views_unsaved"); got != 1 {
		t.Fatalf("%v views waiting to be saved, want 1 (web's newest)", got)
	}
	if got := r.gauge(t, "muster_view_version_epoch"); uint64(got) != first.Version>>assembler.CounterBits {
		t.Fatalf("epoch gauge %v", got)
	}

	restore()
	if err := r.SaveOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := savedVersion(t, pool, "web"); got != last {
		t.Fatalf("saved version after the outage %d, want the last published %d", got, last)
	}
	if got := r.gauge(t, "muster_published_views_unsaved"); got != 0 {
		t.Fatalf("%v views still waiting", got)
	}
}

// TestRestartComparesWithWhatClientsHold: publisher A publishes and is
// stopped; publisher B on the same database restores A's views, numbers
// its versions above A's, and raises last_instance for a service A
// published with instances in rotation when B's input has none.
func TestRestartComparesWithWhatClientsHold(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	in := &input{}
	in.set("web", endpoints(4, eligibility.Eligible))
	in.set("api", endpoints(2, eligibility.Ineligible)) // never in rotation
	a := newRig(t, pool, clk, in, nil)
	if err := a.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	a.ServicesChanged([]string{"api"})
	held := a.publish(t, "web")
	if _, ok := a.View("api"); !ok {
		t.Fatal("api not published")
	}
	if err := a.SaveOnce(ctx); err != nil {
		t.Fatal(err)
	}
	a.Stop()

	// After the restart every web instance is failing.
	in.set("web", endpoints(4, eligibility.Ineligible))
	b := newRig(t, pool, clk, in, nil)
	if v, ok := b.View("web"); ok {
		t.Fatalf("a view before Prepare: %+v", v)
	}
	b.ServicesChanged([]string{"web", "api"})
	b.RunOnce() // not prepared: nothing happens, web stays dirty
	if _, ok := b.hub.View("web"); ok || len(b.Alarms()) != 0 {
		t.Fatal("published or alarmed before Prepare")
	}
	if err := b.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if v, ok := b.View("web"); !ok || v.Version != held.Version || string(v.Encoded()) != string(held.Encoded()) {
		t.Fatalf("restored view %+v, A published %+v", v, held)
	}
	if _, ok := b.hub.View("web"); ok {
		t.Fatal("the restored view was handed to the hub")
	}
	b.RunOnce()
	var alarms []string
	for _, al := range b.Alarms() {
		alarms = append(alarms, al.Kind+":"+al.Service+":"+al.Zone)
	}
	if got := strings.Join(alarms, ","); got != "fraction_guard:api:az1,fraction_guard:api:az2,fraction_guard:web:az1,fraction_guard:web:az2,last_instance:web:" {
		t.Fatalf("alarms after the restart: %s", got)
	}
	clk.Advance(1100 * time.Millisecond)
	b.RunOnce()
	v, _ := b.View("web")
	if v.Version <= held.Version || v.Version>>assembler.CounterBits <= held.Version>>assembler.CounterBits {
		t.Fatalf("B's first version %d is not in an epoch above A's %d", v.Version, held.Version)
	}
	// The guard keeps all four published, now showing ineligible.
	if len(v.Endpoints) != 4 || v.Endpoints[0].State != "ineligible" {
		t.Fatalf("B's view: %+v", v.Endpoints)
	}
	f, ok := b.hub.View("web")
	if !ok || f.Version != v.Version {
		t.Fatalf("hub: %+v", f)
	}
	var wire assembler.View
	if err := json.Unmarshal(f.JSON, &wire); err != nil || wire.Checksum != assembler.Checksum(wire.Endpoints) {
		t.Fatalf("the hub's view does not check: %v", err)
	}
	// api never had an instance in rotation and its view is unchanged:
	// republished (the hub needs it), but no incident.
	if av, ok := b.hub.View("api"); !ok || av.Version <= held.Version {
		t.Fatalf("api after the restart: %+v", av)
	}
}

// TestSavedWhileUpCaughtUpAfter: the running publisher (its own loops,
// real time) saves views while PostgreSQL is up, keeps publishing while it
// is away, and saves the newest once it is back.
func TestSavedWhileUpCaughtUpAfter(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	in := &input{}
	eps := endpoints(4, eligibility.Eligible)
	in.set("web", eps)
	r := newRig(t, pool, testclock.New(time.Time{}), in, func(c *publisher.Config) {
		c.Now, c.SaveEvery, c.MaxSaveBackoff = time.Now, 10*time.Millisecond, 200*time.Millisecond
		c.Options = assembler.Options{AdditionWindow: 20 * time.Millisecond, WithdrawalWindow: 5 * time.Millisecond}
	})
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	r.ServicesChanged([]string{"web"})
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		wait.For(t, 20*time.Second, what, cond)
	}
	version := func() uint64 {
		v, ok := r.View("web")
		if !ok {
			return 0
		}
		return v.Version
	}
	waitFor("the first view", func() bool { return version() != 0 })
	first := version()
	waitFor("the first view saved", func() bool { return savedVersion(t, pool, "web") == first })

	restore := outage(t, pool)
	last := first
	for i := range 4 { // one instance after the other fails
		eps = append([]assembler.InstanceInput(nil), eps...)
		eps[i].State, eps[i].Weight = eligibility.Ineligible, 0
		in.set("web", eps)
		r.ServicesChanged([]string{"web"})
		waitFor("a version published", func() bool { return version() > last })
		last = version()
	}
	if v, _ := r.View("web"); len(v.Endpoints) != 4 || v.Zones["az1"].Guard != "tripped" {
		t.Fatalf("view during the outage: %+v", v)
	}
	restore()
	waitFor("the newest view saved after the outage", func() bool { return savedVersion(t, pool, "web") == last })
}

// TestNextEpochOffThePublishingPath: past half an epoch the save loop takes
// the next epoch, and publication moves to it when the counter runs out.
// If it could not be taken (PostgreSQL away for the whole second half of
// an epoch), publication stops with the changes queued, withdrawals
// included, and resumes in the new epoch once one is taken.
func TestNextEpochOffThePublishingPath(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	in := &input{}
	eps := endpoints(8, eligibility.Eligible) // four per zone: three can go without tripping the guard
	in.set("web", eps)
	r := newRig(t, pool, clk, in, nil)
	if err := r.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	epoch := uint64(r.gauge(t, "muster_view_version_epoch"))
	// Two versions left in the epoch.
	vs, err := assembler.NewVersions(epoch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vs.Next(1<<assembler.CounterBits - 2); err != nil {
		t.Fatal(err)
	}
	r.SetVersions(vs)

	restore := outage(t, pool)
	step := func(i int) (uint64, bool) {
		t.Helper()
		eps = append([]assembler.InstanceInput(nil), eps...)
		eps[i].State, eps[i].Weight = eligibility.Ineligible, 0 // a withdrawal
		in.set("web", eps)
		r.ServicesChanged([]string{"web"})
		clk.Advance(time.Second)
		r.RunOnce()
		clk.Advance(time.Second)
		r.RunOnce()
		v, ok := r.View("web")
		if !ok {
			return 0, false
		}
		return v.Version, true
	}
	if v, _ := step(0); v != epoch<<32|(1<<32-2) { // the first view
		t.Fatalf("first view at %d", v)
	}
	if err := r.SaveOnce(ctx); err == nil {
		t.Fatal("took an epoch with the database away")
	}
	last, _ := step(1)
	if last != epoch<<32|(1<<32-1) {
		t.Fatalf("the epoch's last version is %d", last)
	}
	// The epoch is used up and no next one could be taken: the withdrawal
	// of instance 2 stays queued.
	if v, _ := step(2); v != last {
		t.Fatalf("published %d with the epoch used up", v)
	}
	if n := r.Stats().QueuedWithdrawals; n != 1 {
		t.Fatalf("%d withdrawals queued, want 1", n)
	}
	restore()
	if err := r.SaveOnce(ctx); err != nil {
		t.Fatal(err)
	}
	r.RunOnce()
	v, _ := r.View("web")
	if v.Version>>assembler.CounterBits <= epoch || v.Version&(1<<32-1) != 0 || len(v.Endpoints) != 5 {
		t.Fatalf("after the next epoch was taken: version %d (epoch %d), %+v", v.Version, epoch, v.Zones)
	}
}

// TestPrepareRetriesKeepTheirEpoch (issue 27): a start whose load of the
// saved views fails (the database went away after the epoch was taken)
// retries with the epoch it already took, so an outage at start spends
// one epoch, not one per retry; the epochs left are reported.
func TestPrepareRetriesKeepTheirEpoch(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	r := newRig(t, pool, clk, &input{}, nil)
	var first int64
	var called bool
	if err := pool.QueryRow(ctx, `SELECT last_value, is_called FROM publisher_epochs`).Scan(&first, &called); err != nil {
		t.Fatal(err)
	}
	if called {
		first++ // the next nextval
	}
	fails := 3
	r.SetBeforeLoad(func() error {
		if fails > 0 {
			fails--
			return errors.New("the database went away")
		}
		return nil
	})
	for range 3 {
		if err := r.Prepare(ctx); err == nil {
			t.Fatal("Prepare succeeded while the load fails")
		}
	}
	if r.EpochsLeft() != 0 {
		t.Fatalf("epochs left before a success: %d, want 0 (none held)", r.EpochsLeft())
	}
	if err := r.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	var last int64
	if err := pool.QueryRow(ctx, `SELECT last_value FROM publisher_epochs`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if want := assembler.MaxEpoch - uint64(last); r.EpochsLeft() != want || last != first {
		t.Fatalf("after four tries the sequence is at %d and %d epochs are left; want %d (one epoch taken) and %d", last, r.EpochsLeft(), first, want)
	}
	for _, a := range r.Alarms() {
		if a.Kind == publisher.AlarmEpochsLow {
			t.Fatalf("version_epochs_low with %d left", r.EpochsLeft())
		}
	}
}
