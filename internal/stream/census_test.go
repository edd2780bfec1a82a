package stream

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/testclock"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// replicaProcess is one muster process's streaming tier: a hub with n
// subscribers, its admission and its census, on a shared clock.
type replicaProcess struct {
	hub    *Hub
	adm    *Admission
	census *Census
}

func startReplica(t *testing.T, pool *pgxpool.Pool, clock *testclock.Clock, name string, subscribers int, logs *bytes.Buffer) *replicaProcess {
	t.Helper()
	hub := NewHub(Config{Now: clock.Now})
	h := &replicaProcess{hub: hub, adm: NewAdmission(AdmissionConfig{Floor: 1, Now: clock.Now})}
	for range subscribers {
		sub, err := hub.Subscribe([]string{"web"}, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sub.Close)
	}
	logger := slog.New(slog.DiscardHandler)
	if logs != nil {
		logger = slog.New(slog.NewTextHandler(logs, nil))
	}
	census, err := NewCensus(CensusConfig{Pool: pool, Replica: name, Hub: hub, Admission: h.adm, Now: clock.Now, Logger: logger, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h.census = census
	if err := census.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(census.Stop)
	return h
}

// heartbeat records replica name as alive now in table replicas, as its
// ownership worker does every round.
func heartbeat(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	if _, err := db.New(pool).ReplicaHeartbeat(context.Background(), db.ReplicaHeartbeatParams{ID: name, Restart: true}); err != nil {
		t.Fatal(err)
	}
}

// TestCensusCarriesThePopulationAcrossARestart: a replica with 400
// subscribers reports them; the process restarts under the same name with
// none, and its admission is sized by the 400 coming back (budget 20, not
// the floor); a second live replica doubles the expected population and
// halves each one's share; a peak not reached again within the horizon
// is forgotten.
func TestCensusCarriesThePopulationAcrossARestart(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	clock := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	heartbeat(t, pool, "muster-0")
	heartbeat(t, pool, "muster-1")
	before := startReplica(t, pool, clock, "muster-0", 400, nil)
	if st := before.adm.Stats(); st.Population.Expected != 400 || st.Budget != 20 {
		t.Fatalf("before the restart: %+v", st)
	}
	before.census.Stop() // a graceful shutdown reports a last time

	clock.Advance(30 * time.Second)
	after := startReplica(t, pool, clock, "muster-0", 0, nil)
	st := after.adm.Stats()
	if !st.PopulationKnown || st.Population.Expected != 400 || st.Population.Replicas != 1 || st.Budget != 20 || st.Peak != 0 {
		t.Fatalf("after the restart: %+v, want the 400 persisted to size a budget of 20", st)
	}

	other := startReplica(t, pool, clock, "muster-1", 400, nil)
	if st := other.adm.Stats(); st.Population.Expected != 800 || st.Population.Live != 2 || st.Budget != 20 {
		t.Fatalf("two live replicas: %+v, want 800 expected, shared by 2", st)
	}

	// 16 minutes later, muster-0 never got its clients back: its old
	// peak is past the horizon and its count (0) stands.
	clock.Advance(16 * time.Minute)
	for _, r := range []*replicaProcess{other, after} {
		if err := r.census.runOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if st := after.adm.Stats(); st.Population.Expected != 400 || st.Population.Live != 2 {
		t.Fatalf("after the horizon: %+v, want muster-1's 400 alone", st)
	}
}

// TestCensusWithoutDatabase: PostgreSQL away at start: Start returns
// within its deadline, admission falls back to this process's peak, and
// the log says so.
func TestCensusWithoutDatabase(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://muster@127.0.0.1:1/muster?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	clock := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	var logs bytes.Buffer
	began := time.Now()
	r := startReplica(t, pool, clock, "muster-0", 0, &logs)
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("Start took %s with the database away", took)
	}
	if st := r.adm.Stats(); st.PopulationKnown || st.Budget != 1 {
		t.Fatalf("admission without a census reading: %+v, want the peak (none) and the floor", st)
	}
	if !strings.Contains(logs.String(), "expected population unknown") {
		t.Fatalf("log does not say admission fell back:\n%s", logs.String())
	}
}

// TestCensusCountsOnlyLiveReplicas: three replicas of 400 subscribers;
// muster-2 dies (its heartbeat in replicas stops; its census row and its
// peak of 400 stay, younger than the horizon) and its clients come back
// through the two live ones, whose peaks rise to 600 each. The expected
// population is 1,200 (the clients that exist), not 1,600 (the dead
// replica's 400 counted a second time), and the budget is 5% of it. A
// replica whose heartbeat has lapsed still counts itself (a restart reads
// before its first heartbeat), and counts again for the others once its
// heartbeat resumes.
func TestCensusCountsOnlyLiveReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	clock := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	for _, name := range []string{"muster-0", "muster-1", "muster-2"} {
		heartbeat(t, pool, name)
	}
	r0 := startReplica(t, pool, clock, "muster-0", 400, nil)
	r1 := startReplica(t, pool, clock, "muster-1", 400, nil)
	r2 := startReplica(t, pool, clock, "muster-2", 400, nil)
	if err := r0.census.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if st := r0.adm.Stats(); st.Population.Expected != 1200 || st.Population.Live != 3 {
		t.Fatalf("three live replicas: %+v, want 1200 expected over 3", st.Population)
	}

	// muster-2 is SIGKILLed: no last report, no more heartbeats. Its
	// heartbeat is now older than the lease TTL (7 s) by the database's
	// clock, which the census's injected clock does not move.
	if _, err := pool.Exec(ctx, `UPDATE replicas SET last_seen = last_seen - interval '1 minute' WHERE id = 'muster-2'`); err != nil {
		t.Fatal(err)
	}
	for range 200 {
		for _, r := range []*replicaProcess{r0, r1} {
			sub, err := r.hub.Subscribe([]string{"web"}, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(sub.Close)
		}
	}
	clock.Advance(10 * time.Second)
	for _, r := range []*replicaProcess{r0, r1, r0} { // r0 again: to read r1's new peak
		if err := r.census.runOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for name, r := range map[string]*replicaProcess{"muster-0": r0, "muster-1": r1} {
		st := r.adm.Stats()
		if st.Population.Expected != 1200 || st.Population.Replicas != 2 || st.Population.Live != 2 || st.Budget != 30 {
			t.Fatalf("%s after muster-2 died: %+v budget %d, want 1200 expected over 2 live (budget 30, not 40 from 1600)", name, st.Population, st.Budget)
		}
	}

	// The dead replica's own census, were it to run (a process whose
	// heartbeats stall but which is not dead), still counts itself.
	if err := r2.census.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if st := r2.adm.Stats(); st.Population.Expected != 1600 || st.Population.Replicas != 3 {
		t.Fatalf("muster-2 reading for itself: %+v, want its own 400 and the others' 1200", st.Population)
	}

	// Back (a restart under the same name): it counts for the others again.
	heartbeat(t, pool, "muster-2")
	if err := r0.census.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if st := r0.adm.Stats(); st.Population.Expected != 1600 || st.Population.Replicas != 3 {
		t.Fatalf("muster-2 back: %+v, want its 400 counted again", st.Population)
	}
}

// TestCensusCountsOnlyBelievedMembers: a row written by hand into table
// replicas (live, a day ahead) with a population row beside it claiming a
// million subscribers is counted by a census that believes every row, and
// not by one given the replicas whose rows the ownership manager believed
// (CensusConfig.Members): the region's admission is not sized by it.
func TestCensusCountsOnlyBelievedMembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	clock := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	for _, name := range []string{"muster-0", "muster-1"} {
		heartbeat(t, pool, name)
	}
	r1 := startReplica(t, pool, clock, "muster-1", 400, nil)
	if err := r1.census.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO replicas (id, started_at, last_seen, address, region, ready)
		VALUES ('rogue', clock_timestamp(), clock_timestamp() + interval '1 day', 'http://203.0.113.66:8080', '', true)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO stream_population (replica, subscribers, peak, peak_at, at) VALUES ('rogue', 1000000, 1000000, $1, $1)`, clock.Now()); err != nil {
		t.Fatal(err)
	}
	read := func(members func() []string) Population {
		t.Helper()
		hub := NewHub(Config{Now: clock.Now})
		for range 400 {
			sub, err := hub.Subscribe([]string{"web"}, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(sub.Close)
		}
		adm := NewAdmission(AdmissionConfig{Floor: 1, Now: clock.Now})
		c, err := NewCensus(CensusConfig{Pool: pool, Replica: "muster-0", Hub: hub, Admission: adm, Now: clock.Now, Timeout: time.Second, Members: members})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.runOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return adm.Stats().Population
	}
	if p := read(nil); p.Expected != 1000800 || p.Replicas != 3 {
		t.Fatalf("a census believing every row: %+v, want the rogue's million counted (the hole Members closes)", p)
	}
	if p := read(func() []string { return []string{"muster-0", "muster-1"} }); p.Expected != 800 || p.Replicas != 2 {
		t.Fatalf("a census of the believed members: %+v, want 800 over 2", p)
	}
	if p := read(func() []string { return nil }); p.Expected != 400 || p.Replicas != 1 {
		t.Fatalf("before the first reading of the members: %+v, want this replica's own 400", p)
	}
}
