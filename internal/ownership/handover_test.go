package ownership_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/testclock"
	"github.com/musterhq/muster/internal/wait"
)

// withReady makes a replica's readiness ready's value, and looks at offers
// every 20 ms.
func withReady(ready *atomic.Bool) option {
	return func(c *ownership.Config) {
		c.Ready = ready.Load
		c.OfferPoll = 20 * time.Millisecond
	}
}

// serviceOfEachShard returns a service name hashing to each shard.
func serviceOfEachShard(t *testing.T) []string {
	t.Helper()
	out := make([]string, shards)
	left := shards
	for i := 0; left > 0; i++ {
		name := fmt.Sprintf("svc-%d", i)
		if s := ownership.ShardOf(name, shards); out[s] == "" {
			out[s] = name
			left--
		}
	}
	return out
}

// published checks that every shard's service is published by one of
// rs at least (Publishes), and owned (Owns) by at most one: the moment
// between two owners leaves nothing unpublished and nothing with two
// writers.
func published(t *testing.T, svcs []string, rs ...replica) {
	t.Helper()
	for s, svc := range svcs {
		pub, own := 0, 0
		for _, r := range rs {
			if r.Publishes(svc) {
				pub++
			}
			if _, ok := r.Owns(svc); ok {
				own++
			}
		}
		if pub == 0 {
			t.Fatalf("shard %d (%s) is published by nobody", s, svc)
		}
		if own > 1 {
			t.Fatalf("shard %d (%s) is owned by %d replicas", s, svc, own)
		}
	}
}

// TestAJoinerTakesShardsOnlyOnceReady: a replica that joins while it
// cannot publish (rebuilding) is dealt nothing; once ready it is handed
// its share, and at no moment is a shard's service published by nobody
// or owned by two.
func TestAJoinerTakesShardsOnlyOnceReady(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	var aReady, bReady atomic.Bool
	aReady.Store(true)
	a := newReplica(t, pool, "a", withReady(&aReady))
	b := newReplica(t, pool, "b", withReady(&bReady))
	var h history
	h.watch(a)
	h.watch(b)
	svcs := serviceOfEachShard(t)
	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, patience, "a holding every shard", func() bool { return len(a.Owned()) == shards })
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Several rounds of b, not ready: it holds nothing, a keeps all.
	for range 3 {
		rounds(t, b, a)
		published(t, svcs, a, b)
	}
	if n := len(b.Owned()); n != 0 {
		t.Fatalf("b holds %d shards before it is ready", n)
	}
	if n := len(a.Owned()); n != shards {
		t.Fatalf("a holds %d shards while b is not ready, want all %d", n, shards)
	}
	bReady.Store(true)
	deadline := time.Now().Add(patience)
	for !balanced(t, pool, a, b) {
		published(t, svcs, a, b)
		if err := exclusive(t, pool, a, b); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("not balanced within %s: a %d, b %d", patience, len(a.Owned()), len(b.Owned()))
		}
		time.Sleep(5 * time.Millisecond) // sampling the handover as it goes, bounded by the deadline
	}
	if got := b.metric(t, "muster_shard_ownership_changes_total", "gained"); got != shards/2 {
		t.Errorf("b gained %v shards, want %d", got, shards/2)
	}
	// a notices the takes at its next look at the offers.
	wait.For(t, patience, "a noticing b's takes", func() bool {
		return a.metric(t, "muster_shard_ownership_changes_total", "handed") == shards/2
	})
	if got := a.metric(t, "muster_shard_ownership_changes_total", "released"); got != 0 {
		t.Errorf("a released %v shards (let go before a taker held them), want 0", got)
	}
	a.Stop()
	b.Stop()
	h.check(t)
}

// TestAJoinerHasItsShareAfterTwoRoundsAndALook: what ShareTakenWithin
// counts. Once a joiner is ready, three steps give it its share, each
// driven by hand here: its own round (the heartbeat says ready), the
// holder's round (it offers the joiner its excess) and the joiner's look
// at the offers (it takes them). Before the last step it holds nothing;
// after it, it holds its share in the database. The workers are not
// started, so no other round or look runs in between.
func TestAJoinerHasItsShareAfterTwoRoundsAndALook(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	var aReady, bReady atomic.Bool
	aReady.Store(true)
	a := newReplica(t, pool, "a", withReady(&aReady))
	b := newReplica(t, pool, "b", withReady(&bReady))
	rounds(t, a)
	if n := len(a.Owned()); n != shards {
		t.Fatalf("a alone holds %d shards after a round, want %d", n, shards)
	}
	rounds(t, b, a) // b known to a, not ready: nothing moves
	bReady.Store(true)
	want := ownership.Targets([]string{"a", "b"}, shards)["b"]
	held := func() int {
		n := 0
		for _, l := range leases(t, pool) {
			if l.owner == "b" {
				n++
			}
		}
		return n
	}
	rounds(t, b) // 1: b's heartbeat says it is ready
	if n := held(); n != 0 {
		t.Fatalf("b holds %d shards after its own round, want 0 (a holds them all, and offered none yet)", n)
	}
	rounds(t, a) // 2: a offers b its excess
	if n := held(); n != 0 {
		t.Fatalf("b holds %d shards after a's round, want 0 until it looks at the offers", n)
	}
	if err := b.HandoverOnce(t.Context()); err != nil { // 3: b takes them
		t.Fatal(err)
	}
	if n, own := held(), len(b.Owned()); n != want || own != want {
		t.Fatalf("after two rounds and a look b holds %d shards in the database and %d by its own account, want its share %d", n, own, want)
	}
	if ownership.ShareTakenWithin != 2*ownership.DefaultInterval+ownership.DefaultOfferPoll {
		t.Errorf("ShareTakenWithin %s is not two rounds and a look at the offers", ownership.ShareTakenWithin)
	}
}

// TestHandoverBeforeStop: a replica about to stop hands every shard to
// the others before it lets go: Handover returns with nothing held, the
// others own everything, no shard was ever free in the database, and the
// stopping replica goes on publishing what it handed over until the
// grace ends.
func TestHandoverBeforeStop(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	var ready atomic.Bool
	ready.Store(true)
	a := newReplica(t, pool, "a", withReady(&ready), func(c *ownership.Config) { c.HandoverGrace = time.Hour })
	b := newReplica(t, pool, "b", withReady(&ready))
	c := newReplica(t, pool, "c", withReady(&ready))
	svcs := serviceOfEachShard(t)
	for _, r := range []replica{a, b, c} {
		if err := r.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, patience, "three replicas balanced", func() bool { return balanced(t, pool, a, b, c) })
	// a has noticed every take of the first balance (its count of
	// handovers is settled).
	wait.For(t, patience, "a's first offers noticed as taken", func() bool { return len(a.Region().Offered) == 0 })
	handed := a.Owned()
	before := a.metric(t, "muster_shard_ownership_changes_total", "handed")
	free := watchFree(t, pool)
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	if left := a.Handover(ctx); left != 0 {
		t.Fatalf("a still holds %d shards after Handover", left)
	}
	if n := free(); n != 0 {
		t.Errorf("%d readings found a shard free during the handover", n)
	}
	// Every service is published by someone the moment Handover
	// returns (a as it hands over, b or c), and b and c own everything
	// (at once, unless a round was so late under load that a tenure
	// lapsed and went the old way, freed and taken).
	published(t, svcs, a, b, c)
	wait.For(t, patience, "b and c owning every shard", func() bool { return len(b.Owned())+len(c.Owned()) == shards })
	for s := range handed {
		if !a.Publishes(svcs[s]) {
			t.Errorf("a stopped publishing shard %d at the handover, before its grace", s)
		}
		if _, ok := a.Owns(svcs[s]); ok {
			t.Errorf("a still owns shard %d after handing it over", s)
		}
	}
	if got := a.metric(t, "muster_shard_ownership_changes_total", "handed") - before; got != float64(len(handed)) {
		t.Errorf("a handed over %v shards, want %d", got, len(handed))
	}
	a.Stop()
	// Leaving released nothing that mattered: b and c still hold all.
	if err := exclusive(t, pool, b, c); err != nil {
		t.Fatal(err)
	}
}

// TestAnOfferNotTakenIsWithdrawn: an offer to a replica that stops being
// ready before it takes the shard is withdrawn, and the shard is its
// owner's again (a gain its callbacks hear of).
func TestAnOfferNotTakenIsWithdrawn(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	var aReady, bReady atomic.Bool
	aReady.Store(true)
	a := newReplica(t, pool, "a", withReady(&aReady))
	b := newReplica(t, pool, "b", withReady(&bReady))
	var h history
	h.watch(a)
	h.watch(b)
	rounds(t, a)
	if n := len(a.Owned()); n != shards {
		t.Fatalf("a holds %d shards, want all", n)
	}
	bReady.Store(true)
	rounds(t, b, a) // b heartbeats ready; a offers half
	if n := len(a.Owned()); n != shards/2 {
		t.Fatalf("a owns %d shards while offering half, want %d", n, shards/2)
	}
	bReady.Store(false)
	rounds(t, b, a) // b says it is not ready before taking: a withdraws
	if n := len(a.Owned()); n != shards {
		t.Errorf("a owns %d shards after the offers were withdrawn, want %d", n, shards)
	}
	if n := offersIn(t, pool); n != 0 {
		t.Errorf("%d offers left in the database", n)
	}
	if err := b.HandoverOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(b.Owned()); n != 0 {
		t.Errorf("b took %d shards no longer offered", n)
	}
	h.check(t)
}

func offersIn(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM shard_leases WHERE offered_to IS NOT NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// watchFree reads the leases every few milliseconds until the returned
// function is called, which says how many readings found a shard free.
func watchFree(t *testing.T, pool *pgxpool.Pool) func() int {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int)
	go func() {
		n := 0
		for ctx.Err() == nil {
			var free int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM shard_leases WHERE owner IS NULL OR expires_at <= clock_timestamp()`).Scan(&free); err == nil && free > 0 {
				n++
			}
			time.Sleep(2 * time.Millisecond) // sampling rate, not a wait for a condition
		}
		done <- n
	}()
	return func() int { cancel(); return <-done }
}

// TestAnOfferNobodyTakesComesBack: a replica listed as live and ready
// that never takes what it is offered (a release that does not know
// offers, or a row no process stands behind) keeps its shards offered
// only for OfferTimeout: then it is dealt nothing, the offers are
// withdrawn, and the owner owns (and writes for) every shard again.
func TestAnOfferNobodyTakesComesBack(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	clock := testclock.New(time.Now())
	a := newReplica(t, pool, "a", withClock(clock.Now))
	ghost := func() {
		t.Helper()
		if _, err := pool.Exec(t.Context(), `INSERT INTO replicas (id, started_at, last_seen, address, region, ready)
			VALUES ('ghost', clock_timestamp(), clock_timestamp(), 'ghost:8080', 'test', true)
			ON CONFLICT (id) DO UPDATE SET last_seen = clock_timestamp()`); err != nil {
			t.Fatal(err)
		}
	}
	rounds(t, a)
	ghost()
	rounds(t, a)
	if n := len(a.Owned()); n != shards/2 {
		t.Fatalf("a owns %d shards after offering half to a ready replica, want %d", n, shards/2)
	}
	clock.Advance(3*testInterval + time.Millisecond)
	ghost()
	rounds(t, a)
	if n := len(a.Owned()); n != shards {
		t.Errorf("a owns %d shards after its offers went untaken for the timeout, want all %d", n, shards)
	}
	if n := offersIn(t, pool); n != 0 {
		t.Errorf("%d offers left to a replica that takes none", n)
	}
}
