package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/streamcheck"
	"github.com/musterhq/muster/internal/wait"
)

// partition decides which replica-to-replica links pass. Every replica
// advertises (MUSTER_ADVERTISE_URL) a loopback proxy the test runs in
// front of its listener; the proxy learns which replica is calling from
// the first request on each connection (the Muster-Peer header every
// replica-to-replica request is signed with) and, while the link between
// the two is blocked, passes nothing either way: connections are
// accepted and never answered, open streams go silent (a blackhole, the
// harder case than a refused connection). Traffic without the header
// (clients, the test) passes.
type partition struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	node    string        // the replica cut off ("": none)
	held    atomic.Int64  // writes held back while blocked
}

func newPartition() *partition { return &partition{changed: make(chan struct{})} }

// isolate cuts replica id off from every peer ("" heals).
func (p *partition) isolate(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.node = id
	close(p.changed)
	p.changed = make(chan struct{})
}

// pass waits until the link from src to dst passes (true), or done.
func (p *partition) pass(src, dst string, done <-chan struct{}) bool {
	for {
		p.mu.Lock()
		blocked := p.node != "" && src != "" && (src == p.node || dst == p.node)
		ch := p.changed
		p.mu.Unlock()
		if !blocked {
			return true
		}
		p.held.Add(1)
		select {
		case <-ch:
		case <-done:
			return false
		}
	}
}

// peerProxy forwards ln to the replica at target (whose id, once known,
// is *dst), through p.
func peerProxy(t *testing.T, p *partition, ln net.Listener, target string, dst *atomic.Pointer[string]) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go proxyConn(p, c, target, dst)
		}
	}()
}

func proxyConn(p *partition, c net.Conn, target string, dst *atomic.Pointer[string]) {
	done := make(chan struct{})
	var once sync.Once
	closeBoth := func(up net.Conn) {
		once.Do(func() {
			close(done)
			c.Close()
			if up != nil {
				up.Close()
			}
		})
	}
	br := bufio.NewReader(c)
	var head bytes.Buffer
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			closeBoth(nil)
			return
		}
		head.Write(line)
		if len(bytes.TrimSpace(line)) == 0 {
			break
		}
	}
	src := ""
	if req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head.Bytes()))); err == nil {
		src, _, _ = strings.Cut(req.Header.Get(peer.Header), " ")
	}
	to := func() string {
		if d := dst.Load(); d != nil {
			return *d
		}
		return ""
	}
	if !p.pass(src, to(), done) {
		closeBoth(nil)
		return
	}
	up, err := net.Dial("tcp", target)
	if err != nil {
		closeBoth(nil)
		return
	}
	copyThrough := func(w io.Writer, r io.Reader, first []byte) {
		defer closeBoth(up)
		if len(first) > 0 {
			if _, err := w.Write(first); err != nil {
				return
			}
		}
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				if !p.pass(src, to(), done) {
					return
				}
				if _, werr := w.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go copyThrough(up, br, head.Bytes())
	copyThrough(c, up, nil)
}

// readyLB is a load balancer in front of the replicas as Kubernetes or
// an NLB is: each new connection goes to a random replica of its pool
// whose /readyz answered 200 at the last check (every 250 ms); when none
// did, to any of the pool (fail open, as load balancers do).
type readyLB struct {
	ln    net.Listener
	mu    sync.Mutex
	pool  []string // addresses in rotation
	ready map[string]bool
}

func newReadyLB(t *testing.T, ctx context.Context, pool ...string) *readyLB {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lb := &readyLB{ln: ln, ready: map[string]bool{}}
	lb.set(pool...)
	t.Cleanup(func() { ln.Close() })
	hc := &http.Client{Timeout: time.Second}
	go func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			lb.mu.Lock()
			pool := slices.Clone(lb.pool)
			lb.mu.Unlock()
			for _, a := range pool {
				ok := false
				if res, err := hc.Get("http://" + a + "/readyz"); err == nil {
					ok = res.StatusCode == http.StatusOK
					res.Body.Close()
				}
				lb.mu.Lock()
				lb.ready[a] = ok
				lb.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				up, err := net.Dial("tcp", lb.pick())
				if err != nil {
					c.Close()
					return
				}
				go func() { _, _ = io.Copy(up, c); up.Close() }()
				_, _ = io.Copy(c, up)
				c.Close()
			}()
		}
	}()
	return lb
}

func (lb *readyLB) url() string { return "http://" + lb.ln.Addr().String() }

func (lb *readyLB) set(pool ...string) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.pool = pool
	for _, a := range pool {
		if _, ok := lb.ready[a]; !ok {
			lb.ready[a] = true
		}
	}
}

func (lb *readyLB) pick() string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	var up []string
	for _, a := range lb.pool {
		if lb.ready[a] {
			up = append(up, a)
		}
	}
	if len(up) == 0 {
		up = lb.pool
	}
	return up[rand.IntN(len(up))]
}

// TestACutOffReplicaMovesItsSubscribers: three replicas as
// real processes on one PostgreSQL, each reached by its peers through a
// proxy the test controls. Stream checkers subscribe through a
// readiness-checking load balancer that first sends them all to replica
// C; three more follow a service C owns directly at A. C's peer links
// stalled for 2.5 s (one missed heartbeat) move nobody. Then C is cut off
// from both peers (blackholed both ways, PostgreSQL still reachable) and
// an instance of a service A owns is deregistered at A: every checker
// behind the load balancer routes without it soon after the cut (C
// drained them, reports not ready, and refuses them 503 not-current, so
// they resumed at A or B with held), with no gap, regression or empty
// view; C raises relay_cut_off; A and B stay ready and move nobody (no
// replica hears C, so nobody is better placed to serve C's services).
// Healed, C is ready and current again.
func TestACutOffReplicaMovesItsSubscribers(t *testing.T) {
	realTime(t, "three replicas, one cut off from its peers")
	t.Parallel()
	dir := devDir(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	part := newPartition()
	addrs := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	ids := make([]atomic.Pointer[string], len(addrs))
	var running []*os.Process
	t.Cleanup(func() {
		for _, p := range running {
			_ = p.Signal(os.Interrupt)
		}
		for _, p := range running {
			_, _ = p.Wait()
		}
	})
	for i, a := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		peerProxy(t, part, ln, a, &ids[i])
		p := startProcess(t, dir, a, "MUSTER_ADVERTISE_URL=http://"+ln.Addr().String(),
			"MUSTER_LEASE_TTL=10m", "MUSTER_REGISTRATION_LIMIT=1000000/1m", "MUSTER_ADMISSION_FLOOR=1000")
		running = append(running, p.Process)
	}
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	viewer := token(t, dir, "--kind", "operator", "--subject", "vera", "--role", "viewer")
	type replicasBody struct {
		ownership.RegionStatus
		Relay []relay.PeerStatus `json:"relay"`
	}
	region := func(addr string) replicasBody {
		t.Helper()
		code, body := call(t, "GET", "http://"+addr+"/v1/replicas", admin, "")
		if code != 200 {
			t.Fatalf("GET /v1/replicas at %s: %d %s", addr, code, body)
		}
		var r replicasBody
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	wait.For(t, time.Minute, "three replicas sharing the shards, each following both peers", func() bool {
		for _, a := range addrs {
			r := region(a)
			if len(r.Replicas) != 3 || len(r.Unowned) != 0 || len(r.Owned) < 64/3 || len(r.Relay) != 2 {
				return false
			}
			for _, st := range r.Relay {
				if !st.Synced {
					return false
				}
			}
		}
		return true
	})
	for i, a := range addrs {
		id := region(a).Self
		ids[i].Store(&id)
	}
	const A, B, C = 0, 1, 2
	name := func(i int) string { return *ids[i].Load() }
	// Two services A owns, one B owns, one C owns, six instances each.
	// Each replica's list of its own shards is read at its own moment, so
	// a shard moving between the readings can leave a replica owning
	// none in this picture: read them again until it is whole.
	var svcA, svcB, svcC []string
	wait.For(t, time.Minute, "two services of shards A owns, one of B's and one of C's", func() bool {
		owners := map[int]int{} // shard -> replica index
		for i, a := range addrs {
			for _, s := range region(a).Owned {
				owners[s.Shard] = i
			}
		}
		svcA, svcB, svcC = nil, nil, nil
		for n := 0; n < 1000 && (len(svcA) < 2 || len(svcB) < 1 || len(svcC) < 1); n++ {
			s := fmt.Sprintf("cut-%02d", n)
			owner, ok := owners[ownership.ShardOf(s, 64)]
			switch {
			case !ok:
			case owner == A && len(svcA) < 2:
				svcA = append(svcA, s)
			case owner == B && len(svcB) < 1:
				svcB = append(svcB, s)
			case owner == C && len(svcC) < 1:
				svcC = append(svcC, s)
			}
		}
		return len(svcA) == 2 && len(svcB) == 1 && len(svcC) == 1
	})
	services := slices.Concat(svcA, svcB, svcC)
	instances := map[string][]string{}
	for k, s := range services {
		if code, body := call(t, "PUT", "http://"+addrs[A]+"/v1/services/"+s, admin, `{"owner":"payments","capabilities":[]}`); code != 201 {
			t.Fatalf("create %s: %d %s", s, code, body)
		}
		for i := range 6 {
			code, body := call(t, "POST", "http://"+addrs[i%3]+"/v1/services/"+s+"/instances", admin,
				fmt.Sprintf(`{"address":"10.41.%d.%d","port":8080,"zone":"az%d"}`, k, i+1, i%2+1))
			if code != 201 {
				t.Fatalf("register an instance of %s: %d %s", s, code, body)
			}
			var r struct{ ID string }
			if err := json.Unmarshal(body, &r); err != nil {
				t.Fatal(err)
			}
			instances[s] = append(instances[s], r.ID)
		}
	}
	bases := func() []string { return []string{"http://" + addrs[A], "http://" + addrs[B], "http://" + addrs[C]} }
	same := sameViews(t, bases, services, viewer)
	wait.For(t, time.Minute, "every replica serving the same view of every service, six instances each", func() bool {
		if diff, _ := same(); diff != "" {
			return false
		}
		for _, s := range services {
			code, body := call(t, "GET", "http://"+addrs[A]+"/v1/resolve/"+s, viewer, "")
			var v assembler.View
			if code != 200 || json.Unmarshal(body, &v) != nil || len(v.Endpoints) != 6 {
				return false
			}
		}
		return true
	})

	ctx, cancel := context.WithCancel(context.Background())
	var checkersRun sync.WaitGroup
	t.Cleanup(func() { cancel(); checkersRun.Wait() })
	lb := newReadyLB(t, ctx, addrs[C])
	var viaLB, atA []*streamcheck.Checker
	start := func(cfg streamcheck.Config) *streamcheck.Checker {
		cfg.Token, cfg.HeartbeatTimeout = viewer, 20*time.Second
		c, err := streamcheck.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		checkersRun.Go(func() { c.Run(ctx) })
		return c
	}
	for i := range 12 {
		watched := []string{svcA[0], svcB[0]}
		if i%2 == 1 {
			watched = []string{svcA[0], svcA[1]}
		}
		viaLB = append(viaLB, start(streamcheck.Config{URL: lb.url(), Services: watched}))
	}
	for range 3 {
		atA = append(atA, start(streamcheck.Config{URL: "http://" + addrs[A], Services: svcC}))
	}
	all := slices.Concat(viaLB, atA)
	wait.For(t, time.Minute, "every checker synced", func() bool {
		for _, c := range all {
			if !c.Synced() {
				return false
			}
		}
		return true
	})
	// From here the load balancer sends new connections to any ready
	// replica; the twelve are all on C.
	lb.set(addrs[A], addrs[B], addrs[C])

	movedNobody := func(when string) {
		t.Helper()
		for i, c := range all {
			if n := c.Counts(); n.Drains != 0 || n.Subscriptions != 1 {
				t.Errorf("%s: checker %d was moved: %v", when, i, n)
			}
		}
		for _, a := range addrs {
			if n := metricValue(t, a, admin, "muster_relay_stale_drained_total"); n != "0" {
				t.Errorf("%s: %s drained %s subscriptions", when, a, n)
			}
		}
	}

	// Slow for a moment: C's links stall for 2.5 s, a gap of at most
	// 4.5 s between lines (one missed heartbeat).
	part.isolate(name(C))
	stalled := time.Now()
	time.AfterFunc(2500*time.Millisecond, func() { part.isolate("") })
	wait.For(t, 10*time.Second, "the stall over and every replica hearing both peers after it", func() bool {
		for _, a := range addrs {
			for _, st := range region(a).Relay {
				if !st.Connected || !st.LastRecordAt.After(stalled.Add(2500*time.Millisecond)) {
					return false
				}
			}
		}
		return true
	})
	if part.held.Load() == 0 {
		t.Fatal("the stall held nothing back")
	}
	movedNobody("after a 2.5 s stall of C's peer links")

	// Cut C off from its peers, then withdraw an instance of svcA[0] at
	// its owner A.
	part.isolate(name(C))
	cut := time.Now()
	target := instances[svcA[0]][0]
	if code, body := call(t, "DELETE", "http://"+addrs[A]+"/v1/instances/"+target, admin, `{"justification":"cut-off replica test withdrawal"}`); code != 200 && code != 204 {
		t.Fatalf("deregister %s at A: %d %s", target, code, body)
	}
	u := uuid.MustParse(target)
	wait.For(t, 30*time.Second, "the withdrawal at every checker behind the load balancer", func() bool {
		for _, c := range viaLB {
			if c.Routable(svcA[0], u) {
				return false
			}
		}
		return true
	})
	// C must notice it hears neither peer, drain its subscribers, and
	// they must resume at A or B: under 10 s on a quiet machine, 10.25 s
	// once on a loaded one. What the test insists on
	// is that they move at all, well before a stale copy would matter:
	// 20 s.
	took := time.Since(cut)
	if took > 20*time.Second {
		t.Errorf("the withdrawal reached the cut-off replica's subscribers %s after the cut; the bound is 20 s", took.Round(time.Millisecond))
	}
	t.Logf("C cut off from its peers: the withdrawal made at A reached all %d subscribers that were on C %s after the cut", len(viaLB), took.Round(time.Millisecond))
	drained := 0
	for i, c := range viaLB {
		n := c.Counts()
		if n.Drains > 0 {
			drained++
		}
		// Resumed with held: the views of the first subscription (two
		// services), then deltas only.
		if n.FullViews != 2 {
			t.Errorf("checker %d got %d full views, want the first subscription's 2 (it resumes with held): %v", i, n.FullViews, n)
		}
	}
	if drained == 0 {
		t.Error("no checker was told to drain by C")
	}
	code, body := call(t, "GET", "http://"+addrs[C]+"/readyz", "", "")
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "hears none of its peers") {
		t.Errorf("C's /readyz while cut off: %d %s", code, body)
	}
	for _, i := range []int{A, B} {
		if code, body := call(t, "GET", "http://"+addrs[i]+"/readyz", "", ""); code != 200 {
			t.Errorf("replica %d's /readyz while C is cut off: %d %s", i, code, body)
		}
	}
	code, body = call(t, "GET", "http://"+addrs[C]+"/v1/watch?service="+svcA[0], viewer, "")
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "not-current") {
		t.Errorf("a watch of %s at C while cut off: %d %s", svcA[0], code, body)
	}
	code, body = call(t, "GET", "http://"+addrs[C]+"/v1/alarms", admin, "")
	if code != 200 || !strings.Contains(string(body), relay.AlarmRelayCutOff) {
		t.Errorf("C's alarms while cut off: %d %s", code, body)
	}
	for _, st := range region(addrs[C]).Relay {
		if !st.Stale || st.Heard || len(st.HeardBy) != 1 {
			t.Errorf("C's relay from %s while cut off: %+v", st.Peer, st)
		}
	}
	for i, c := range atA {
		if n := c.Counts(); n.Drains != 0 || n.Subscriptions != 1 {
			t.Errorf("checker %d of %s (C's) at A was moved though no replica hears C: %v", i, svcC[0], n)
		}
	}
	for _, i := range []int{A, B} {
		if n := metricValue(t, addrs[i], admin, "muster_relay_stale_drained_total"); n != "0" {
			t.Errorf("replica %d moved %s subscriptions while C was cut off", i, n)
		}
	}

	// Healed: C hears its peers, is ready and serves every service again.
	part.isolate("")
	wait.For(t, 30*time.Second, "C ready and current again", func() bool {
		code, _ := call(t, "GET", "http://"+addrs[C]+"/readyz", "", "")
		if code != 200 {
			return false
		}
		code, _ = call(t, "GET", "http://"+addrs[C]+"/v1/resolve/"+svcA[0], viewer, "")
		return code == 200
	})
	wait.For(t, time.Minute, "the replicas serving the same view of every service", func() bool { diff, _ := same(); return diff == "" })
	cancel()
	checkersRun.Wait()
	var total streamcheck.Counts
	for i, c := range all {
		n := c.Counts()
		total = total.Add(n)
		if n.Problems() > 0 || n.Emptied > 0 {
			t.Errorf("checker %d: %v; first problems: %v", i, n, c.Events()[:min(len(c.Events()), 5)])
		}
	}
	t.Logf("totals: %v", total)
}

// metricValue is the value of an unlabelled metric at the replica at
// addr, as /metrics prints it ("" when absent).
func metricValue(t *testing.T, addr, tok, name string) string {
	t.Helper()
	code, body := call(t, "GET", "http://"+addr+"/metrics", tok, "")
	if code != 200 {
		t.Fatalf("GET /metrics at %s: %d", addr, code)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			return v
		}
	}
	return ""
}
