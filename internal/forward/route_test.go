package forward_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/wait"
)

// routeTable stands in for the ownership manager's evidence routes: one
// shard per service name "svc-<shard>".
type routeTable struct {
	mu sync.Mutex
	to map[int][]string
}

func (r *routeTable) set(shard int, to ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.to[shard] = to
}

func (r *routeTable) route(service string) (int, []string, bool) {
	var shard int
	if _, err := fmt.Sscanf(service, "svc-%d", &shard); err != nil {
		return -1, nil, false
	}
	to, ok := r.shard(shard)
	return shard, to, ok
}

func (r *routeTable) shard(shard int) ([]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if shard < 0 || shard >= len(r.to) {
		return nil, false
	}
	return slices.Clone(r.to[shard]), true
}

func services(n int, service string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = service
	}
	return out
}

// TestEvidenceGoesOnlyWhereItsShardRoutes: with four replicas (this one
// and b, c, d), each report reaches only the replicas its shard's route
// names (the owner, and during a move the replica offered the shard),
// never this replica itself and never another peer. A report with no
// known service goes to every peer.
func TestEvidenceGoesOnlyWhereItsShardRoutes(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	b, c, d := newFakePeerAs(t, k, "b"), newFakePeerAs(t, k, "c"), newFakePeerAs(t, k, "d")
	rt := &routeTable{to: map[int][]string{0: {"b", "c"}, 1: {"a", "d"}, 2: {"c", "b"}}}
	h := newHarness(t, k, func(c *forward.Config) { c.Route, c.ShardRoute = rt.route, rt.shard },
		forward.Peer{ID: "b", Address: b.URL}, forward.Peer{ID: "c", Address: c.URL}, forward.Peer{ID: "d", Address: d.URL})
	wait.For(t, 10*time.Second, "the forwarder to know its peers", func() bool { return hasSeries(h, "b") && hasSeries(h, "c") && hasSeries(h, "d") })

	s0, s1, s2, none := items(10), items(7), items(5), items(3)
	h.f.Offer(prober, s0, services(10, "svc-0"))
	h.f.Offer(prober, s1, services(7, "svc-1"))
	h.f.Offer(prober, s2, services(5, "svc-2"))
	h.f.Offer(prober, none, nil)
	wait.For(t, 10*time.Second, "every routed report delivered", func() bool {
		return len(b.reports()) == 10+5+3 && len(c.reports()) == 10+5+3 && len(d.reports()) == 7+3
	})
	has := func(p *fakePeer, want []evaluator.Report) bool {
		got := p.reports()
		for _, w := range want {
			if !slices.ContainsFunc(got, func(r evaluator.Report) bool { return r.InstanceID == w.InstanceID }) {
				return false
			}
		}
		return true
	}
	for _, tc := range []struct {
		name string
		p    *fakePeer
		want [][]evaluator.Report
	}{{"b", b, [][]evaluator.Report{s0, s2, none}}, {"c", c, [][]evaluator.Report{s0, s2, none}}, {"d", d, [][]evaluator.Report{s1, none}}} {
		for i, w := range tc.want {
			if !has(tc.p, w) {
				t.Errorf("peer %s misses group %d of what is routed to it", tc.name, i)
			}
		}
	}
	// Nothing more arrives: d never gets shard 0's or 2's evidence.
	if n := len(d.reports()); n != 10 {
		t.Errorf("peer d took %d reports, want 10 (shard 1's 7 and 3 unrouted)", n)
	}
}

// TestHardFailuresGoFirst: with a peer down and thousands of successes
// queued for it, a hard failure offered after them reaches the peer,
// once it is back, behind at most the one request in flight (100 items
// here), not behind the 2,000 queued.
func TestHardFailuresGoFirst(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	b := newFakePeer(t, k)
	b.down.Store(true)
	h := newHarness(t, k, func(c *forward.Config) { c.MaxBatch = 100 }, forward.Peer{ID: "b", Address: b.URL})
	wait.For(t, 10*time.Second, "the forwarder to know peer b", func() bool { return hasSeries(h, "b") })
	bulk := items(2000)
	h.f.Offer(prober, bulk, nil)
	wait.For(t, 10*time.Second, "a failed attempt", func() bool { return b.attempts.Load() > 0 })
	hard := items(1)
	hard[0].Outcome = "hard_failure"
	h.f.Offer(prober, hard, nil)
	b.down.Store(false)
	wait.For(t, 10*time.Second, "every report at b", func() bool { return len(b.reports()) == 2001 })
	at := slices.IndexFunc(b.reports(), func(r evaluator.Report) bool { return r.InstanceID == hard[0].InstanceID })
	if at < 0 || at > 100 {
		t.Fatalf("the hard failure arrived %dth of 2001, want within the first 101", at)
	}
}

// TestAGonePeersQueueIsRerouted: evidence queued for an owner that
// stops being live (killed: its requests fail) is not dropped: once the
// routes give its shard to other replicas, it goes there, once, and only
// to replicas that did not have it: by the replay to a new destination
// while the replay buffer holds it, else rerouted from the queue.
func TestAGonePeersQueueIsRerouted(t *testing.T) {
	t.Parallel()
	for _, replay := range []time.Duration{0, -1} {
		t.Run(fmt.Sprintf("replay=%v", replay), func(t *testing.T) {
			t.Parallel()
			goneQueueRerouted(t, replay)
		})
	}
}

func goneQueueRerouted(t *testing.T, replay time.Duration) {
	k := newKey(t)
	b, c, d := newFakePeerAs(t, k, "b"), newFakePeerAs(t, k, "c"), newFakePeerAs(t, k, "d")
	b.down.Store(true)
	rt := &routeTable{to: map[int][]string{0: {"b", "c"}}}
	h := newHarness(t, k, func(c *forward.Config) { c.Route, c.ShardRoute, c.Replay = rt.route, rt.shard, replay },
		forward.Peer{ID: "b", Address: b.URL}, forward.Peer{ID: "c", Address: c.URL}, forward.Peer{ID: "d", Address: d.URL})
	wait.For(t, 10*time.Second, "the forwarder to know its peers", func() bool { return hasSeries(h, "b") && hasSeries(h, "c") && hasSeries(h, "d") })
	sent := items(20)
	sent[3].Outcome = "hard_failure"
	h.f.Offer(prober, sent, services(20, "svc-0"))
	wait.For(t, 10*time.Second, "c, offered the shard, holding the reports", func() bool { return len(c.reports()) == 20 })
	if n := h.f.Queued("b"); n != 20 {
		t.Fatalf("%d items queued for the owner b that is down, want 20", n)
	}
	// b stops heartbeating: it leaves the live list, and its shard goes
	// to every live replica until one takes it.
	rt.set(0, "a", "c", "d")
	h.peers.Store(&[]forward.Peer{{ID: "c", Address: c.URL}, {ID: "d", Address: d.URL}})
	h.f.RunOnce(t.Context())
	wait.For(t, 10*time.Second, "b's queue at d", func() bool { return len(d.reports()) == 20 })
	if n := len(c.reports()); n != 20 {
		t.Errorf("c took %d reports, want 20 (it had them already)", n)
	}
	if !slices.ContainsFunc(d.reports(), func(r evaluator.Report) bool { return r.InstanceID == sent[3].InstanceID }) {
		t.Errorf("the hard failure did not reach d")
	}
	want := 0.0 // replayed
	if replay < 0 {
		want = 20
	}
	if got := counter(t, h, "muster_evidence_forward_rerouted_total"); got != want {
		t.Errorf("muster_evidence_forward_rerouted_total = %v, want %v", got, want)
	}
	// Not twice: give a duplicate the time to arrive behind a marker.
	marker := items(1)
	h.f.Offer(prober, marker, services(1, "svc-0"))
	wait.For(t, 10*time.Second, "the marker at d", func() bool { return len(d.reports()) >= 21 })
	if n := len(d.reports()); n != 21 {
		t.Errorf("d took %d reports, want 21 (b's 20 once, and the marker)", n)
	}
	if got := h.metric(t, "muster_evidence_forward_dropped_total", "b"); got != 0 {
		t.Errorf("dropped for b = %v, want 0 (all rerouted)", got)
	}
}

// TestAReplicaDealtAShardIsSentItsRecentEvidence: a peer that becomes a
// destination of a shard (offered it) is sent the
// evidence of that shard accepted here within Replay, and not that of
// other shards.
func TestAReplicaDealtAShardIsSentItsRecentEvidence(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	b, c := newFakePeerAs(t, k, "b"), newFakePeerAs(t, k, "c")
	rt := &routeTable{to: map[int][]string{0: {"a", "b"}, 1: {"a", "b"}}}
	h := newHarness(t, k, func(c *forward.Config) { c.Route, c.ShardRoute = rt.route, rt.shard },
		forward.Peer{ID: "b", Address: b.URL}, forward.Peer{ID: "c", Address: c.URL})
	wait.For(t, 10*time.Second, "the forwarder to know its peers", func() bool { return hasSeries(h, "b") && hasSeries(h, "c") })
	s0, s1 := items(6), items(4)
	h.f.Offer(prober, s0, services(6, "svc-0"))
	h.f.Offer(prober, s1, services(4, "svc-1"))
	wait.For(t, 10*time.Second, "b holding both shards' reports", func() bool { return len(b.reports()) == 10 })
	if n := len(c.reports()); n != 0 {
		t.Fatalf("c took %d reports of shards it does not keep", n)
	}
	rt.set(1, "a", "c") // shard 1 offered to c
	h.f.RunOnce(t.Context())
	wait.For(t, 10*time.Second, "shard 1's recent reports at c", func() bool { return len(c.reports()) == 4 })
	for _, r := range c.reports() {
		if !slices.ContainsFunc(s1, func(w evaluator.Report) bool { return w.InstanceID == r.InstanceID }) {
			t.Errorf("c was sent %s, not of shard 1", r.InstanceID)
		}
	}
}

// counter reads an unlabelled counter.
func counter(t testing.TB, h *harness, name string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
