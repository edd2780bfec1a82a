package ownership_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/testclock"
	"github.com/musterhq/muster/internal/wait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Short leases keep the tests that wait for the database's clock short;
// they satisfy Config.Validate (two renewals before the local deadline).
const (
	testTTL      = 1500 * time.Millisecond
	testInterval = 300 * time.Millisecond
	testMargin   = 300 * time.Millisecond
	shards       = 64 // migration 000026 seeds 64
	patience     = 30 * time.Second
)

// replica is a Manager under test with its metrics registry.
type replica struct {
	*ownership.Manager
	reg *prometheus.Registry
}

type option func(*ownership.Config)

func withClock(now func() time.Time) option { return func(c *ownership.Config) { c.Now = now } }
func withTiming(ttl, interval, margin time.Duration) option {
	return func(c *ownership.Config) { c.TTL, c.Interval, c.Margin = ttl, interval, margin }
}

func newReplica(t *testing.T, pool *pgxpool.Pool, id string, opts ...option) replica {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := ownership.Config{Pool: pool, ID: id, Address: id + ":8080", Region: "test",
		TTL: testTTL, Interval: testInterval, Margin: testMargin, Registerer: reg}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := ownership.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	return replica{m, reg}
}

// metric reads a counter or gauge of r's registry (0 when absent).
func (r replica) metric(t *testing.T, name, change string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() != change {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// rounds runs one RunOnce of each replica in turn.
func rounds(t *testing.T, rs ...replica) {
	t.Helper()
	for _, r := range rs {
		if err := r.RunOnce(t.Context()); err != nil {
			t.Fatalf("%s: %v", r.ID(), err)
		}
	}
}

// dbLease is a shard's lease as the database holds it now.
type dbLease struct {
	owner string // "" unless held (by the database's clock)
	epoch uint64
}

func leases(t *testing.T, pool *pgxpool.Pool) []dbLease {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT CASE WHEN owner IS NOT NULL AND expires_at > clock_timestamp() THEN owner ELSE '' END, epoch FROM shard_leases ORDER BY shard`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []dbLease
	for rows.Next() {
		var l dbLease
		var e int64
		if err := rows.Scan(&l.owner, &e); err != nil {
			t.Fatal(err)
		}
		l.epoch = uint64(e)
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// expireLeases moves the leases of owner to their expiry by the
// database's clock: what TTL without a renewal does, without the wait.
func expireLeases(t *testing.T, pool *pgxpool.Pool, owner string) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `UPDATE shard_leases SET expires_at = clock_timestamp() WHERE owner = $1`, owner); err != nil {
		t.Fatal(err)
	}
}

// exclusive reports (as an error) any shard two replicas both count as
// their own, and any shard a replica counts as its own under an epoch the
// database does not give it. The replicas are read before the database
// (a tenure a replica holds was in the database before it held it) and
// again after: only a claim a replica made in both readings, under the
// same epoch, spans the database's reading. A claim that ended between
// them (a renewal starved past its local deadline on a loaded machine,
// then the shard taken by another) is no conflict; one that spans the
// reading while the database names another owner is.
func exclusive(t *testing.T, pool *pgxpool.Pool, rs ...replica) error {
	t.Helper()
	before := make([]map[int]uint64, len(rs))
	for i, r := range rs {
		before[i] = r.Owned()
	}
	inDB := leases(t, pool)
	owned := make([]map[int]uint64, len(rs))
	for i, r := range rs {
		owned[i] = map[int]uint64{}
		for s, e := range r.Owned() {
			if b, ok := before[i][s]; ok && b == e {
				owned[i][s] = e
			}
		}
	}
	who := map[int]string{}
	for i, r := range rs {
		for s, e := range owned[i] {
			if other, ok := who[s]; ok {
				return fmt.Errorf("shard %d owned by both %s and %s", s, other, r.ID())
			}
			who[s] = r.ID()
			if inDB[s].owner != r.ID() || inDB[s].epoch != e {
				return fmt.Errorf("%s holds shard %d at epoch %d, the database gives it to %q at %d", r.ID(), s, e, inDB[s].owner, inDB[s].epoch)
			}
		}
	}
	return nil
}

// balanced reports whether the replicas' own counts are their targets
// and the database agrees with each of them.
func balanced(t *testing.T, pool *pgxpool.Pool, rs ...replica) bool {
	t.Helper()
	ids := make([]string, len(rs))
	got := map[string]int{}
	for i, r := range rs {
		ids[i] = r.ID()
		got[r.ID()] = len(r.Owned())
	}
	if !maps.Equal(got, ownership.Targets(ids, shards)) {
		return false
	}
	inDB := map[string]int{}
	for _, l := range leases(t, pool) {
		if l.owner != "" {
			inDB[l.owner]++
		}
	}
	return maps.Equal(got, inDB)
}

// history records every replica's OnChange callbacks in the order they
// ran, so that a test can check that no shard was ever held by two
// replicas at once: a replica reports a loss before the database lets
// anyone else take the shard, and a gain after the database gave it.
type history struct {
	mu     sync.Mutex
	events []change
}

type change struct {
	replica string
	shard   int
	gained  bool
}

func (h *history) watch(r replica) {
	r.OnChange(func(gained, lost []int) {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, s := range lost {
			h.events = append(h.events, change{r.ID(), s, false})
		}
		for _, s := range gained {
			h.events = append(h.events, change{r.ID(), s, true})
		}
	})
}

// check fails t if, in the order the callbacks ran, a shard was gained by
// one replica while another held it, or lost by one that did not hold it.
func (h *history) check(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	holder := map[int]string{}
	for i, c := range h.events {
		switch {
		case c.gained && holder[c.shard] != "":
			t.Errorf("event %d: %s gained shard %d while %s held it", i, c.replica, c.shard, holder[c.shard])
		case c.gained:
			holder[c.shard] = c.replica
		case holder[c.shard] != c.replica:
			t.Errorf("event %d: %s lost shard %d held by %q", i, c.replica, c.shard, holder[c.shard])
		default:
			delete(holder, c.shard)
		}
	}
}

// TestManagersBalance: two and three replicas running their own loops on
// one database share the 64 shards by their targets, and no shard is
// ever held by two of them, by what each believes or by the order of
// their callbacks.
func TestManagersBalance(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d replicas", n), func(t *testing.T) {
			t.Parallel()
			pool := dbtest.New(t)
			var h history
			rs := make([]replica, n)
			for i := range rs {
				rs[i] = newReplica(t, pool, fmt.Sprintf("r%d", i))
				h.watch(rs[i])
			}
			for _, r := range rs {
				if err := r.Start(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			wait.For(t, patience, "balanced ownership", func() bool {
				if err := exclusive(t, pool, rs...); err != nil {
					t.Fatal(err)
				}
				return balanced(t, pool, rs...)
			})
			// Every service has exactly one owner.
			for i := range 500 {
				svc := fmt.Sprintf("svc-%d", i)
				owners := 0
				for _, r := range rs {
					if _, ok := r.Owns(svc); ok {
						owners++
					}
				}
				if owners != 1 {
					t.Fatalf("%s has %d owners", svc, owners)
				}
			}
			for _, r := range rs {
				r.Stop()
			}
			h.check(t)
		})
	}
}

// TestKilledReplicaShardsMove: a replica that stops without a word (its
// process killed: no release, no more rounds) keeps its shards until the
// database's clock expires them; then the survivors' next rounds take
// them, each under the next epoch, and the killed one's local deadline
// had already passed for every shard a survivor holds.
func TestKilledReplicaShardsMove(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	a, b, c := newReplica(t, pool, "a"), newReplica(t, pool, "b"), newReplica(t, pool, "c")
	wait.For(t, patience, "three replicas balanced", func() bool {
		rounds(t, a, b, c)
		return balanced(t, pool, a, b, c)
	})
	killed := c.Owned()
	if len(killed) != 21 {
		t.Fatalf("c holds %d shards, want 21", len(killed))
	}
	var h history
	h.watch(a)
	h.watch(b)
	// c is killed: it runs no more rounds. a and b go on.
	wait.For(t, patience, "the survivors hold every shard", func() bool {
		rounds(t, a, b)
		if err := exclusive(t, pool, a, b); err != nil {
			t.Fatal(err)
		}
		held := c.Owned() // by c's own clock, as c would see it if it woke
		for _, r := range []replica{a, b} {
			for s := range r.Owned() {
				if _, ok := held[s]; ok {
					t.Fatalf("%s took shard %d before c's local deadline passed", r.ID(), s)
				}
			}
		}
		return len(a.Owned())+len(b.Owned()) == shards
	})
	if !balanced(t, pool, a, b) {
		t.Errorf("survivors hold %d and %d shards, want 32 each", len(a.Owned()), len(b.Owned()))
	}
	after := leases(t, pool)
	for s, e := range killed {
		if after[s].epoch != e+1 {
			t.Errorf("shard %d: epoch %d after the move, want %d", s, after[s].epoch, e+1)
		}
	}
	h.check(t)
}

// TestMoveTakesOneRoundAfterExpiry: once the database's clock has
// expired a dead replica's leases, one round of each survivor takes all
// of them: the dead replica stopped counting as live no later than its
// leases expired, so the survivors' targets already include its share.
// (In time, that is TTL after its last renewal plus at most one
// Interval.)
func TestMoveTakesOneRoundAfterExpiry(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	a, b := newReplica(t, pool, "a"), newReplica(t, pool, "b")
	wait.For(t, patience, "two replicas balanced", func() bool {
		rounds(t, a, b)
		return balanced(t, pool, a, b)
	})
	// b dies; wait for its leases to expire by the database's clock,
	// keeping a's leases renewed.
	wait.For(t, patience, "b's leases expired", func() bool {
		for _, l := range leases(t, pool) {
			if l.owner == "b" {
				rounds(t, a)
				return false
			}
		}
		return true
	})
	rounds(t, a)
	if n := len(a.Owned()); n != shards {
		t.Fatalf("after one round a holds %d shards, want %d", n, shards)
	}
}

// TestDeposedOwnerFenceFails: a replica whose leases expired while it
// was frozen (its local clock stands still: it has not noticed) still
// believes it holds its shards, but once another replica has taken them
// its Fence fails in the database, and its next round hears that its
// renewal was refused.
func TestDeposedOwnerFenceFails(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	clock := testclock.New(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	a := newReplica(t, pool, "a", withClock(clock.Now))
	rounds(t, a)
	epoch, ok := a.Owns("api")
	if !ok {
		t.Fatal("a does not own api after taking every shard")
	}
	shard := ownership.ShardOf("api", shards)
	fence := func(r replica, epoch uint64) error {
		return db.WithTx(t.Context(), pool, func(q *db.Queries) error { return r.Fence(t.Context(), q, shard, epoch) })
	}
	if err := fence(a, epoch); err != nil {
		t.Fatalf("the owner's fence: %v", err)
	}
	if err := fence(a, epoch+1); !errors.Is(err, ownership.ErrNotOwner) {
		t.Fatalf("fence at an epoch a does not hold: %v", err)
	}
	var lost []int
	a.OnChange(func(_, l []int) { lost = append(lost, l...) })

	expireLeases(t, pool, "a")
	b := newReplica(t, pool, "b")
	wait.For(t, patience, "b holds every shard", func() bool {
		rounds(t, b)
		return len(b.Owned()) == shards
	})
	if got, ok := a.Owns("api"); !ok || got != epoch {
		t.Fatalf("a's own view changed without a round: %d %v", got, ok)
	}
	if err := fence(a, epoch); !errors.Is(err, ownership.ErrNotOwner) {
		t.Fatalf("the deposed owner's fence: %v, want ErrNotOwner", err)
	}
	bEpoch, _ := b.Owns("api")
	if bEpoch != epoch+1 {
		t.Fatalf("b took api's shard at epoch %d, want %d", bEpoch, epoch+1)
	}
	if err := fence(b, bEpoch); err != nil {
		t.Fatalf("the new owner's fence: %v", err)
	}

	rounds(t, a)
	if len(a.Owned()) != 0 || len(lost) != shards {
		t.Fatalf("after its round a holds %d and heard of %d lost, want 0 and %d", len(a.Owned()), len(lost), shards)
	}
	if got := a.metric(t, "muster_shard_ownership_changes_total", "deposed"); got != shards {
		t.Errorf("deposed changes %v, want %d", got, shards)
	}
}

// TestFenceHoldsOffTakeover: a writer that fenced inside its transaction
// holds the lease row until the transaction ends; a replica that would
// take the expired lease meanwhile skips it, and takes it only once the
// writer is done, after which the writer's fence fails.
func TestFenceHoldsOffTakeover(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	clock := testclock.New(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	a := newReplica(t, pool, "a", withClock(clock.Now))
	rounds(t, a)
	shard := 7
	epoch := a.Owned()[shard]

	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(t.Context()))
	if err := a.Fence(t.Context(), db.New(tx), shard, epoch); err != nil {
		t.Fatalf("fence: %v", err)
	}
	// The lease runs out (a plain read is not held up by FOR SHARE).
	wait.For(t, patience, "a's leases expired by the database's clock", func() bool {
		for _, l := range leases(t, pool) {
			if l.owner == "a" {
				return false
			}
		}
		return true
	})
	b := newReplica(t, pool, "b")
	rounds(t, b)
	if _, ok := b.Owned()[shard]; ok {
		t.Fatal("b took the shard while a's fenced transaction was open")
	}
	if n := len(b.Owned()); n != shards-1 {
		t.Fatalf("b holds %d shards, want all but the fenced one", n)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatalf("the fenced writer's commit: %v", err)
	}
	rounds(t, b)
	if got, ok := b.Owned()[shard]; !ok || got != epoch+1 {
		t.Fatalf("b holds shard %d: %v at epoch %d, want epoch %d", shard, ok, got, epoch+1)
	}
	err = db.WithTx(t.Context(), pool, func(q *db.Queries) error { return a.Fence(t.Context(), q, shard, epoch) })
	if !errors.Is(err, ownership.ErrNotOwner) {
		t.Fatalf("a's fence after the takeover: %v, want ErrNotOwner", err)
	}
}

// gate dials PostgreSQL for one pool and can cut it off: when closed, it
// refuses new connections and its open ones swallow what they are sent,
// so every query waits for a reply that never comes, as with a frozen
// server or a network path that drops packets.
type gate struct {
	closed atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func (g *gate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if g.closed.Load() {
		return nil, errors.New("gate closed: database unreachable")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.conns = append(g.conns, c)
	g.mu.Unlock()
	return &gatedConn{Conn: c, g: g}, nil
}

// sever closes every connection the gate opened, so that closing the
// pool does not wait for a server that will never answer.
func (g *gate) sever() {
	g.closed.Store(true)
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		c.Close()
	}
}

type gatedConn struct {
	net.Conn
	g *gate
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if c.g.closed.Load() {
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// gatedPool opens a pool on the database at url through a gate.
func gatedPool(t *testing.T, url string) (*pgxpool.Pool, *gate) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{}
	cfg.ConnConfig.DialFunc = g.dial
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(g.sever) // first: the pool's close would wait for replies
	return pool, g
}

// TestUnreachableDatabaseLosesByLocalDeadline: a replica cut off from the
// database keeps its shards until its local deadline (the moment it sent
// its last renewal, plus TTL, minus Margin, on its own clock) and not a
// moment longer: Owns says no at the deadline, and the deadline watch
// tells the callbacks while every round hangs on the database.
func TestUnreachableDatabaseLosesByLocalDeadline(t *testing.T) {
	t.Parallel()
	pool, g := gatedPool(t, dbtest.URL(t))
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := testclock.New(t0)
	a := newReplica(t, pool, "a", withClock(clock.Now))
	rounds(t, a)
	deadline := t0.Add(testTTL - testMargin)
	st := a.Status()
	if len(st.Owned) != shards || st.Shards != shards || !st.LastRenew.Equal(t0) {
		t.Fatalf("status after the first round: %d owned of %d, last renew %v", len(st.Owned), st.Shards, st.LastRenew)
	}
	for _, s := range st.Owned {
		if !s.Deadline.Equal(deadline) || s.Since.IsZero() || !s.Expires.After(s.Since) || s.Epoch != 1 {
			t.Fatalf("shard status %+v, want deadline %v", s, deadline)
		}
	}
	var lost atomic.Int64
	a.OnChange(func(_, l []int) { lost.Add(int64(len(l))) })

	g.closed.Store(true)
	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	clock.Set(deadline.Add(-time.Millisecond))
	if _, ok := a.Owns("api"); !ok || len(a.Owned()) != shards {
		t.Fatal("a let go of its shards before its local deadline")
	}
	clock.Set(deadline)
	if _, ok := a.Owns("api"); ok || len(a.Owned()) != 0 {
		t.Fatal("a still counts its shards as its own at its local deadline")
	}
	wait.For(t, patience, "the callbacks told of every shard lost", func() bool { return lost.Load() == shards })
	a.Stop() // its release fails too: the leases will expire in the database
	if got := a.metric(t, "muster_shard_ownership_changes_total", "expired"); got != shards {
		t.Errorf("expired changes %v, want %d", got, shards)
	}
	if got := a.metric(t, "muster_shard_lease_renew_failures_total", ""); got < 1 {
		t.Errorf("renew failures %v, want at least 1", got)
	}
	if got := a.metric(t, "muster_shards_owned", ""); got != 0 {
		t.Errorf("shards owned %v, want 0", got)
	}
}

// TestLocalDeadlineBeforeDatabaseExpiry: on one machine's clock, a
// tenure's local deadline falls at least Margin before the expiry the
// database stamped, after a take and after a renewal: the fencing
// argument of doc.go, measured.
func TestLocalDeadlineBeforeDatabaseExpiry(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	a := newReplica(t, pool, "a")
	check := func(when string) {
		st := a.Status()
		if len(st.Owned) != shards {
			t.Fatalf("%s: %d shards owned", when, len(st.Owned))
		}
		for _, s := range st.Owned {
			if s.Deadline.Add(testMargin).After(s.Expires) {
				t.Fatalf("%s: shard %d's local deadline %v is not Margin before its expiry %v", when, s.Shard, s.Deadline, s.Expires)
			}
		}
	}
	rounds(t, a)
	check("after the take")
	rounds(t, a)
	check("after a renewal")
}

// TestPartitionedReplicaLetsGoFirst: three replicas running their loops;
// one is cut off from the database. The others take its shards once the
// database's clock expires them, and by the order of the callbacks it
// had let go of every one before anyone took it.
func TestPartitionedReplicaLetsGoFirst(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	pool, err := db.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cut, g := gatedPool(t, url)
	// Roomier timing than the other tests: the order is guaranteed by
	// Margin, which must cover this machine's scheduling under -race.
	timing := withTiming(3*time.Second, 500*time.Millisecond, time.Second)
	a, b := newReplica(t, pool, "a", timing), newReplica(t, pool, "b", timing)
	c := newReplica(t, cut, "c", timing)
	var h history
	for _, r := range []replica{a, b, c} {
		h.watch(r)
		if err := r.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, patience, "three replicas balanced", func() bool { return balanced(t, pool, a, b, c) })
	g.closed.Store(true)
	wait.For(t, patience, "a and b hold every shard", func() bool {
		return len(a.Owned())+len(b.Owned()) == shards && balanced(t, pool, a, b)
	})
	a.Stop()
	b.Stop()
	c.Stop()
	h.check(t)
}

// TestGracefulStopHandsOverAtOnce: a replica that stops releases its
// shards, telling its callbacks while the database still names it, and
// leaves the region; the shards are free at once and the remaining
// replica takes all of them in its next round.
func TestGracefulStopHandsOverAtOnce(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	a, b := newReplica(t, pool, "a"), newReplica(t, pool, "b")
	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, patience, "two replicas balanced", func() bool {
		rounds(t, b)
		return balanced(t, pool, a, b)
	})
	// The callback runs on a's goroutine: it records, and the test
	// goroutine judges.
	var stillNamed, told atomic.Int64
	var queryErr atomic.Value
	a.OnChange(func(_, lost []int) {
		told.Add(int64(len(lost)))
		for _, s := range lost {
			var named bool
			err := pool.QueryRow(context.Background(), `SELECT owner = 'a' AND expires_at > clock_timestamp() FROM shard_leases WHERE shard = $1`, s).Scan(&named)
			if err != nil {
				queryErr.Store(err)
			}
			if named {
				stillNamed.Add(1)
			}
		}
	})
	a.Stop()
	if err, _ := queryErr.Load().(error); err != nil {
		t.Fatal(err)
	}
	if told.Load() != 32 || stillNamed.Load() != 32 {
		t.Fatalf("a told of %d shards lost, %d while the database still named it; want 32 and 32", told.Load(), stillNamed.Load())
	}
	for s, l := range leases(t, pool) {
		if l.owner == "a" {
			t.Fatalf("shard %d still held by a after its Stop", s)
		}
	}
	var live int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM replicas WHERE id = 'a'`).Scan(&live); err != nil || live != 0 {
		t.Fatalf("a's replicas row: %d (%v), want gone", live, err)
	}
	rounds(t, b)
	if n := len(b.Owned()); n != shards {
		t.Fatalf("after one round b holds %d shards, want %d", n, shards)
	}
	if got := a.metric(t, "muster_shard_ownership_changes_total", "released"); got < 32 {
		t.Errorf("released changes %v, want at least 32", got)
	}
}

// TestSameIDDoesNotAdoptEarlierTenures: a process that starts under the
// id of one still running (or just killed) does not renew, release or
// take the tenures the other took: it waits, like everyone, for the
// database's clock, and then takes them under new epochs.
func TestSameIDDoesNotAdoptEarlierTenures(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	clock := testclock.New(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	first := newReplica(t, pool, "a", withClock(clock.Now))
	rounds(t, first)
	before := first.Owned()
	second := newReplica(t, pool, "a")
	rounds(t, second)
	if n := len(second.Owned()); n != 0 {
		t.Fatalf("the second process under id a holds %d shards", n)
	}
	for s, l := range leases(t, pool) {
		if l.owner != "a" || l.epoch != before[s] {
			t.Fatalf("shard %d: %+v after the second process's round, want a's tenure %d untouched", s, l, before[s])
		}
	}
	expireLeases(t, pool, "a")
	rounds(t, second)
	if n := len(second.Owned()); n != shards {
		t.Fatalf("after the expiry the second process holds %d shards", n)
	}
	for s, e := range second.Owned() {
		if e != before[s]+1 {
			t.Fatalf("shard %d taken at epoch %d, want %d", s, e, before[s]+1)
		}
	}
	err := db.WithTx(t.Context(), pool, func(q *db.Queries) error { return first.Fence(t.Context(), q, 0, before[0]) })
	if !errors.Is(err, ownership.ErrNotOwner) {
		t.Fatalf("the first process's fence: %v, want ErrNotOwner", err)
	}
}

// TestRunOnceNeedsNoStart: Stop before Start and twice is safe, a second
// Start is refused, and Owns knows nothing before the first round.
func TestRunOnceNeedsNoStart(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	a := newReplica(t, pool, "a")
	a.Stop()
	if _, ok := a.Owns("api"); ok || a.Shards() != 0 {
		t.Fatal("a owns api before its first round")
	}
	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(t.Context()); err == nil {
		t.Fatal("a second Start was accepted")
	}
	wait.For(t, patience, "a owns every shard", func() bool { return len(a.Owned()) == shards })
	a.Stop()
	a.Stop()
	if len(a.Owned()) != 0 {
		t.Fatal("a still holds shards after Stop")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	for _, c := range []struct {
		name string
		cfg  ownership.Config
		ok   bool
	}{
		{"defaults", ownership.Config{Pool: pool, ID: "a"}, true},
		{"no pool", ownership.Config{ID: "a"}, false},
		{"no id", ownership.Config{Pool: pool}, false},
		{"NUL in id", ownership.Config{Pool: pool, ID: "a\x00"}, false},
		{"negative", ownership.Config{Pool: pool, ID: "a", Margin: -1}, false},
		{"one renewal before the deadline", ownership.Config{Pool: pool, ID: "a", TTL: 5 * time.Second, Interval: 2 * time.Second, Margin: 2 * time.Second}, false},
		{"sub-millisecond TTL", ownership.Config{Pool: pool, ID: "a", TTL: 7*time.Second + time.Microsecond}, false},
	} {
		err := c.cfg.Validate()
		if (err == nil) != c.ok {
			t.Errorf("%s: Validate() = %v", c.name, err)
		}
	}
	cfg := ownership.Config{Pool: pool, ID: "a"}
	if err := cfg.Validate(); err != nil || cfg.TTL != ownership.DefaultTTL || cfg.Interval != ownership.DefaultInterval || cfg.Margin != ownership.DefaultMargin {
		t.Fatalf("defaults: %+v %v", cfg, err)
	}
}

// TestShardCountChangeGivesUpEverything: a shard count that changes
// under a running replica would hash every service elsewhere, so the
// replica gives up what it holds and takes nothing until restarted.
func TestShardCountChangeGivesUpEverything(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	a := newReplica(t, pool, "a")
	rounds(t, a)
	if _, err := pool.Exec(t.Context(), `INSERT INTO shard_leases (shard, expires_at) VALUES (64, clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	if err := a.RunOnce(t.Context()); err == nil {
		t.Fatal("a round after the shard count changed succeeded")
	}
	if n := len(a.Owned()); n != 0 {
		t.Fatalf("a still holds %d shards", n)
	}
	for s, l := range leases(t, pool) {
		if l.owner != "" {
			t.Fatalf("shard %d still held by %q", s, l.owner)
		}
	}
}

// TestStuckReplicaRaisesShardUnowned (issue 27): a replica that
// heartbeats but never takes its share (stuck) leaves its shards unowned:
// the region's reading shows them, and once they have been unowned for
// longer than a move takes (TTL plus two rounds) shard_unowned names
// them. When the stuck replica is gone, the others take its share and
// the alarm clears.
func TestStuckReplicaRaisesShardUnowned(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	clk := testclock.New(time.Now())
	// A replica that leaves what it is dealt untaken is dealt nothing
	// after OfferTimeout (TestFreeShardsDealtAndNotTakenComeBack): held
	// off here, so that its share stays unowned long enough to alarm.
	a := newReplica(t, pool, "a", withClock(clk.Now), func(c *ownership.Config) { c.OfferTimeout = time.Hour })
	stuck := func() {
		t.Helper()
		if _, err := pool.Exec(t.Context(), `INSERT INTO replicas (id, started_at, last_seen, address, region)
			VALUES ('z', clock_timestamp(), clock_timestamp(), '', 'test')
			ON CONFLICT (id) DO UPDATE SET last_seen = clock_timestamp()`); err != nil {
			t.Fatal(err)
		}
	}
	stuck()
	rounds(t, a)
	r := a.Region()
	if len(r.Replicas) != 2 || r.Shards != shards || len(r.Owned) != shards/2 || len(r.Unowned) != shards/2 || r.Self != "a" {
		t.Fatalf("region with a stuck replica: %d replicas, %d shards, %d owned, %d unowned", len(r.Replicas), r.Shards, len(r.Owned), len(r.Unowned))
	}
	if al := a.Alarms(); len(al) != 0 {
		t.Fatalf("alarms at once: %+v", al)
	}
	// Rounds every interval, a little past TTL plus two rounds.
	for range int((testTTL+2*testInterval)/testInterval) + 1 {
		clk.Advance(testInterval)
		stuck()
		rounds(t, a)
	}
	al := a.Alarms()
	if len(al) != 1 || al[0].Kind != ownership.AlarmShardUnowned || !strings.Contains(al[0].Detail, "32 of 64 shards") {
		t.Fatalf("alarms after the stuck replica's share stayed unowned: %+v", al)
	}
	// The stuck replica goes: a takes the whole region, the alarm clears.
	if _, err := pool.Exec(t.Context(), `DELETE FROM replicas WHERE id = 'z'`); err != nil {
		t.Fatal(err)
	}
	clk.Advance(testInterval)
	rounds(t, a)
	if r := a.Region(); len(r.Unowned) != 0 || len(r.Owned) != shards || len(a.Alarms()) != 0 {
		t.Fatalf("after the stuck replica left: %d unowned, %d owned, alarms %+v", len(r.Unowned), len(r.Owned), a.Alarms())
	}
}

// TestALapsedTenureGoesOnPublishing: a replica cut off from the database
// stops owning its shards at the local deadline (nothing may be expired
// or written) but goes on publishing them until a reading of the leases
// tells it more; a round that takes the shards back ends the lapse as a
// gain (a fresh adoption), with no loss in between.
func TestALapsedTenureGoesOnPublishing(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	cut, g := gatedPool(t, url)
	clk := testclock.New(time.Now())
	r := newReplica(t, cut, "a", func(c *ownership.Config) { c.Now = clk.Now })
	var (
		mu     sync.Mutex
		events []string
	)
	r.OnChange(func(gained, lost []int) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, fmt.Sprintf("gained %d lost %d", len(gained), len(lost)))
	})
	r.OnLapseEnd(func(shards []int) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, fmt.Sprintf("lapse ended %d", len(shards)))
	})
	rounds(t, r)
	if _, ok := r.Owns("web"); !ok || !r.Publishes("web") {
		t.Fatal("the only replica does not own web")
	}
	g.sever()
	clk.Advance(testTTL)
	if err := r.RunOnce(t.Context()); err == nil {
		t.Fatal("a round without the database succeeded")
	}
	if _, ok := r.Owns("web"); ok {
		t.Fatal("web is still owned past the local deadline")
	}
	if !r.Publishes("web") {
		t.Fatal("a lapsed tenure stopped publishing before anything was known of the shard")
	}
	g.closed.Store(false)
	rounds(t, r)
	if _, ok := r.Owns("web"); !ok {
		t.Fatal("web was not taken again once the database answered")
	}
	mu.Lock()
	defer mu.Unlock()
	// Taken back in the round that read the leases: the lapse ends
	// without a loss, as a gain.
	want := fmt.Sprint([]string{"gained 64 lost 0", "gained 0 lost 64", "gained 64 lost 0"})
	if got := fmt.Sprint(events); got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
}

// TestARestartedReplicaTakesItsShardsAtOnce: a replica killed without a
// release and started again under the same id holds its shards after its
// first round, not after their TTL.
func TestARestartedReplicaTakesItsShardsAtOnce(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	long := withTiming(time.Minute, 10*time.Second, 5*time.Second)
	first := newReplica(t, pool, "a", long)
	rounds(t, first)
	if len(first.Owned()) != 64 {
		t.Fatalf("the first process holds %d shards", len(first.Owned()))
	}
	// Killed: no release, and no heartbeat for longer than a round and a
	// half. The next process under the same id.
	if _, err := pool.Exec(t.Context(), `UPDATE replicas SET last_seen = last_seen - interval '20 seconds' WHERE id = 'a'`); err != nil {
		t.Fatal(err)
	}
	second := newReplica(t, pool, "a", long)
	rounds(t, second)
	if n := len(second.Owned()); n != 64 {
		t.Fatalf("the restarted replica holds %d shards after its first round, want 64", n)
	}
	// The dead process's tenures are fenced: their epochs moved on.
	for s, e := range first.Owned() {
		if second.Owned()[s] == e {
			t.Fatalf("shard %d kept epoch %d across the restart", s, e)
		}
	}
}
