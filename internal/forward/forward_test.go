package forward_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/wait"
)

type key struct{ priv ed25519.PrivateKey }

func (k key) KeyID() string             { return "region" }
func (k key) Public() ed25519.PublicKey { return k.priv.Public().(ed25519.PublicKey) }
func (k key) Sign(_ context.Context, msg []byte) ([]byte, error) {
	return ed25519.Sign(k.priv, msg), nil
}

func newKey(t testing.TB) key {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return key{priv}
}

// fakePeer is a replica's POST /v1/peer/reports: it verifies the
// signature as the server does and records the reports it took, in order.
type fakePeer struct {
	*httptest.Server
	verifier *peer.Verifier
	down     atomic.Bool  // answer 503
	attempts atomic.Int64 // requests seen, answered or not
	// jsonOnly: answer a compact body 415, as a release before it did;
	// refusedCompact counts those answers.
	jsonOnly       atomic.Bool
	refusedCompact atomic.Int64

	mu      sync.Mutex
	batches []forward.Batch
	senders map[string]bool
	headers []http.Header
}

func newFakePeer(t testing.TB, trusted seal.Signer) *fakePeer {
	// Every fake peer is replica b unless named: the forwarder signs for
	// it by that id.
	return newFakePeerAs(t, trusted, "b")
}

func newFakePeerAs(t testing.TB, trusted seal.Signer, id string) *fakePeer {
	p := &fakePeer{verifier: &peer.Verifier{Keys: func() seal.Keys { return seal.Keys{}.With(trusted) }, Self: []string{id}}, senders: map[string]bool{}}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.attempts.Add(1)
		ct := r.Header.Get("Content-Type")
		if r.Method != http.MethodPost || r.URL.Path != forward.Path || (ct != "application/json" && ct != forward.BinaryContentType) {
			http.Error(w, "wrong route", http.StatusNotFound)
			return
		}
		if ct == forward.BinaryContentType && p.jsonOnly.Load() {
			p.refusedCompact.Add(1)
			http.Error(w, "unsupported media type", http.StatusUnsupportedMediaType)
			return
		}
		if p.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id, err := p.verifier.Verify(r, body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var b forward.Body
		if ct == forward.BinaryContentType {
			b.Batches, err = forward.DecodeBinary(body, evaluator.MaxBatch)
		} else {
			err = json.Unmarshal(body, &b)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.batches = append(p.batches, b.Batches...)
		p.senders[id] = true
		p.headers = append(p.headers, r.Header.Clone())
		p.mu.Unlock()
		_ = json.NewEncoder(w).Encode(forward.Result{Accepted: 1})
	}))
	t.Cleanup(p.Close)
	return p
}

// reports are the reports taken so far, in order.
func (p *fakePeer) reports() []evaluator.Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []evaluator.Report
	for _, b := range p.batches {
		out = append(out, b.Reports...)
	}
	return out
}

type harness struct {
	f       *forward.Forwarder
	reg     *prometheus.Registry
	peers   atomic.Pointer[[]forward.Peer]
	now     time.Time
	replica string

	mu    sync.Mutex
	moved time.Time // set by setNow; zero: now
}

// setNow moves the forwarder's clock to t.
func (h *harness) setNow(t time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.moved = t
}

func (h *harness) clock() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.moved.IsZero() {
		return h.now
	}
	return h.moved
}

func newHarness(t testing.TB, k key, adjust func(*forward.Config), peers ...forward.Peer) *harness {
	h := &harness{reg: prometheus.NewRegistry(), now: time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC), replica: "a"}
	h.peers.Store(&peers)
	cfg := forward.Config{
		Signer:     peer.Signer{ID: h.replica, Key: k},
		Peers:      func() []forward.Peer { return *h.peers.Load() },
		MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, BatchWait: 5 * time.Millisecond,
		Registerer: h.reg, Now: h.clock,
	}
	if adjust != nil {
		adjust(&cfg)
	}
	var err error
	if h.f, err = forward.New(cfg); err != nil {
		t.Fatal(err)
	}
	if err := h.f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.f.Stop)
	return h
}

func (h *harness) metric(t testing.TB, name, peer string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 0 {
				return float64(m.GetHistogram().GetSampleCount())
			}
			if m.GetLabel()[0].GetValue() == peer {
				if c := m.GetCounter(); c != nil {
					return c.GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

var (
	web = identity.Principal{Kind: identity.KindWorkload, Service: "web", Subject: "web", Issuer: "https://issuer.example", Home: true,
		Addresses: nil, Expiry: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)}
	prober = identity.Principal{Kind: identity.KindProber, Subject: "prober-az1"}
)

func items(n int) []evaluator.Report {
	out := make([]evaluator.Report, n)
	for i := range out {
		out[i] = evaluator.Report{InstanceID: uuid.Must(uuid.NewV7()), Class: "probe", Outcome: "success"}
	}
	return out
}

// TestForwardsSignedBatches: accepted evidence reaches a peer in signed
// requests the peer's verifier accepts, each report with its actor and a
// time, the actor without token, expiry or addresses; the forwarder
// counts what was acknowledged and empties its queue. Nothing is sent to
// this replica itself.
func TestForwardsSignedBatches(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	b := newFakePeer(t, k)
	h := newHarness(t, k, nil, forward.Peer{ID: "b", Address: b.URL + "/"}, forward.Peer{ID: "a", Address: "http://self.invalid"})
	wait.For(t, 10*time.Second, "the forwarder to know peer b", func() bool { return h.metric(t, "muster_evidence_forward_queue", "b") == 0 && hasSeries(h, "b") })

	first, second := items(3), items(2)
	at := h.now.Add(-time.Second)
	second[0].At = &at
	h.f.Offer(prober, first, nil)
	h.f.Offer(web, second, nil)
	wait.For(t, 10*time.Second, "5 reports at peer b", func() bool { return len(b.reports()) == 5 })

	b.mu.Lock()
	batches, senders, headers := b.batches, b.senders, b.headers
	b.mu.Unlock()
	if !senders["a"] || len(senders) != 1 {
		t.Errorf("signed by %v, want replica a", senders)
	}
	for _, hd := range headers {
		if hd.Get("Authorization") != "" || hd.Get("Muster-Instance-Credential") != "" {
			t.Errorf("a forwarded request carries a token or credential: %v", hd)
		}
		// Signed for b by its id, and in strict mode only: no header of
		// the release before, which names no receiver.
		if s, err := peer.ParseHeader(hd.Get(peer.Header)); err != nil || s.Receiver != "b" || hd.Get(peer.HeaderV1) != "" {
			t.Errorf("a forwarded request's signature %+v (%v), %s %q; want one for b alone", s, err, peer.HeaderV1, hd.Get(peer.HeaderV1))
		}
	}
	var actors []forward.Actor
	var got []evaluator.Report
	for _, bt := range batches {
		for range bt.Reports {
			actors = append(actors, bt.Actor)
		}
		got = append(got, bt.Reports...)
	}
	want := append(append([]evaluator.Report(nil), first...), second...)
	for i := range want {
		if got[i].InstanceID != want[i].InstanceID {
			t.Fatalf("report %d is %s, want %s (in offer order)", i, got[i].InstanceID, want[i].InstanceID)
		}
		wantAt := h.now
		if i == 3 {
			wantAt = at
		}
		if got[i].At == nil || !got[i].At.Equal(wantAt) {
			t.Errorf("report %d at %v, want %v (its own, or when it was accepted)", i, got[i].At, wantAt)
		}
	}
	if a := actors[0]; a.Kind != "prober" || a.Subject != "prober-az1" {
		t.Errorf("actor of the first batch %+v", a)
	}
	if a := actors[4]; a != (forward.Actor{Issuer: "https://issuer.example", Home: true, Subject: "web", Kind: "workload", Service: "web"}) {
		t.Errorf("actor of the second batch %+v", a)
	}
	if p, err := actors[4].Principal(); err != nil || p.String() != web.String() {
		t.Errorf("the actor decodes to %v (%v), want %v", p, err, web)
	}
	wait.For(t, 10*time.Second, "the acknowledgements counted", func() bool {
		return h.metric(t, "muster_evidence_forwarded_total", "b") == 5 && h.metric(t, "muster_evidence_forward_lag_seconds", "") == 5 &&
			h.f.Queued("b") == 0
	})
	if q := h.f.Queued("a"); q != 0 || hasSeries(h, "a") {
		t.Errorf("this replica is its own peer: %d queued", q)
	}
}

func hasSeries(h *harness, peer string) bool {
	mfs, _ := h.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "muster_evidence_forward_queue" {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == peer {
					return true
				}
			}
		}
	}
	return false
}

// TestPeerDownGetsTheQueueWhenBack: while a peer answers 503 the items
// stay queued and are retried; once it answers, it gets all of them, in
// order, once.
func TestPeerDownGetsTheQueueWhenBack(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	b := newFakePeer(t, k)
	b.down.Store(true)
	h := newHarness(t, k, nil, forward.Peer{ID: "b", Address: b.URL})
	wait.For(t, 10*time.Second, "the forwarder to know peer b", func() bool { return hasSeries(h, "b") })
	sent := items(40)
	for i := 0; i < len(sent); i += 10 {
		h.f.Offer(prober, sent[i:i+10], nil)
	}
	wait.For(t, 10*time.Second, "three attempts on the peer that is down", func() bool { return b.attempts.Load() >= 3 })
	if n := len(b.reports()); n != 0 {
		t.Fatalf("a peer that is down took %d reports", n)
	}
	if q := h.f.Queued("b"); q != 40 {
		t.Fatalf("%d items queued for the peer that is down, want 40", q)
	}
	b.down.Store(false)
	wait.For(t, 10*time.Second, "the queue delivered", func() bool { return len(b.reports()) == 40 })
	got := b.reports()
	for i := range sent {
		if got[i].InstanceID != sent[i].InstanceID {
			t.Fatalf("report %d is %s, want %s", i, got[i].InstanceID, sent[i].InstanceID)
		}
	}
	if d := h.metric(t, "muster_evidence_forward_dropped_total", "b"); d != 0 {
		t.Errorf("%v dropped", d)
	}
}

// TestQueueOverflowDropsOldest: beyond its bound a peer's queue drops its
// oldest items and counts them; the peer, back, gets the newest.
func TestQueueOverflowDropsOldest(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	b := newFakePeer(t, k)
	b.down.Store(true)
	h := newHarness(t, k, func(c *forward.Config) { c.QueueLimit = 10 }, forward.Peer{ID: "b", Address: b.URL})
	wait.For(t, 10*time.Second, "the forwarder to know peer b", func() bool { return hasSeries(h, "b") })
	sent := items(25)
	for i := range sent {
		h.f.Offer(prober, sent[i:i+1], nil)
	}
	wait.For(t, 10*time.Second, "15 dropped", func() bool { return h.metric(t, "muster_evidence_forward_dropped_total", "b") == 15 })
	if q := h.f.Queued("b"); q > 10 {
		t.Fatalf("%d queued, over the bound of 10", q)
	}
	b.down.Store(false)
	wait.For(t, 10*time.Second, "the newest 10 delivered", func() bool { return len(b.reports()) == 10 })
	got := b.reports()
	for i, r := range got {
		if r.InstanceID != sent[15+i].InstanceID {
			t.Fatalf("delivered %d is %s, want %s (the newest ten, in order)", i, r.InstanceID, sent[15+i].InstanceID)
		}
	}
	// Settled once the peer's answer is read, a moment after it took them.
	wait.For(t, 10*time.Second, "the queue gauge at 0 after delivery", func() bool {
		return h.metric(t, "muster_evidence_forward_queue", "b") == 0
	})
}

// TestForgetsAPeerNoLongerListed: a peer that leaves the list loses its
// queue (counted as dropped) and is offered nothing more.
func TestForgetsAPeerNoLongerListed(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	b := newFakePeer(t, k)
	b.down.Store(true)
	h := newHarness(t, k, nil, forward.Peer{ID: "b", Address: b.URL})
	wait.For(t, 10*time.Second, "the forwarder to know peer b", func() bool { return hasSeries(h, "b") })
	h.f.Offer(prober, items(4), nil)
	h.peers.Store(&[]forward.Peer{})
	h.f.RunOnce(t.Context())
	if q := h.f.Queued("b"); q != 0 || hasSeries(h, "b") {
		t.Fatalf("a forgotten peer keeps %d queued", q)
	}
	if d := h.metric(t, "muster_evidence_forward_dropped_total", "b"); d != 4 {
		t.Errorf("%v dropped, want the 4 queued", d)
	}
	h.f.Offer(prober, items(2), nil)
	if q := h.f.Queued("b"); q != 0 {
		t.Fatalf("a forgotten peer was offered %d", q)
	}
}

// TestAPeerThatJoinsGetsTheRecentEvidence: a replica that starts (or
// comes back) is sent what this one accepted within Replay before it was
// listed, then what follows, in order: its rebuild reads only what the
// owners wrote, and without these an instance healthy a moment ago would
// be Unknown there. Older evidence is not sent; Replay < 0 sends none.
func TestAPeerThatJoinsGetsTheRecentEvidence(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	for _, replay := range []time.Duration{0, -1} {
		b := newFakePeer(t, k)
		// The harness's clock is read by the forwarder's own goroutine
		// too, so it moves under the harness's lock (setNow).
		h := newHarness(t, k, func(c *forward.Config) { c.Replay = replay })
		old, recent, later := items(2), items(3), items(1)
		h.f.Offer(prober, old, nil)
		h.setNow(h.now.Add(forward.DefaultReplay + time.Second)) // old falls out of the window
		h.f.Offer(prober, recent, nil)
		h.peers.Store(&[]forward.Peer{{ID: "b", Address: b.URL}})
		h.f.RunOnce(t.Context())
		h.f.Offer(prober, later, nil)
		want := append(append([]evaluator.Report(nil), recent...), later...)
		if replay < 0 {
			want = later
		}
		wait.For(t, 10*time.Second, fmt.Sprintf("%d reports at the peer that joined (replay %s)", len(want), replay), func() bool { return len(b.reports()) == len(want) })
		for i, r := range b.reports() {
			if r.InstanceID != want[i].InstanceID {
				t.Fatalf("replay %s: report %d is %s, want %s", replay, i, r.InstanceID, want[i].InstanceID)
			}
		}
	}
}

// TestTheReplayKeepsTheNewestWithinTheBound: the replay buffer holds at
// most QueueLimit items, the newest, whichever offers they came in: an
// offer partly over the bound keeps its newest items, in order.
func TestTheReplayKeepsTheNewestWithinTheBound(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	b := newFakePeer(t, k)
	h := newHarness(t, k, func(c *forward.Config) { c.QueueLimit = 5 })
	first, second, third := items(3), items(2), items(2)
	h.f.Offer(prober, first, nil)
	h.f.Offer(prober, second, nil)
	h.f.Offer(prober, third, nil) // 7 offered: first's two oldest go
	h.peers.Store(&[]forward.Peer{{ID: "b", Address: b.URL}})
	h.f.RunOnce(t.Context())
	want := append(append(append([]evaluator.Report(nil), first[2:]...), second...), third...)
	wait.For(t, 10*time.Second, "5 reports at the peer that joined", func() bool { return len(b.reports()) >= len(want) })
	got := b.reports()
	if len(got) != len(want) {
		t.Fatalf("the peer that joined got %d reports, want the newest %d", len(got), len(want))
	}
	for i, r := range got {
		if r.InstanceID != want[i].InstanceID {
			t.Fatalf("report %d is %s, want %s (the newest five, in order)", i, r.InstanceID, want[i].InstanceID)
		}
		if r.At == nil {
			t.Fatalf("report %d carries no time: a report is stamped with the time it was received", i)
		}
	}
}

// TestUntrustedKeyIsRetriedNotDelivered: a peer that does not trust this
// replica's key answers 401; nothing is delivered, and the items are kept
// for when it does (a key rotation under way), not dropped.
func TestUntrustedKeyIsRetriedNotDelivered(t *testing.T) {
	t.Parallel()
	b := newFakePeer(t, newKey(t)) // trusts another key
	h := newHarness(t, newKey(t), nil, forward.Peer{ID: "b", Address: b.URL})
	wait.For(t, 10*time.Second, "the forwarder to know peer b", func() bool { return hasSeries(h, "b") })
	h.f.Offer(prober, items(3), nil)
	wait.For(t, 10*time.Second, "three refused attempts", func() bool { return b.attempts.Load() >= 3 })
	if n := len(b.reports()); n != 0 {
		t.Fatalf("a peer took %d reports signed with a key it does not trust", n)
	}
	if h.metric(t, "muster_evidence_forwarded_total", "b") != 0 || h.metric(t, "muster_evidence_forward_dropped_total", "b") != 0 {
		t.Errorf("forwarded %v, dropped %v; want neither", h.metric(t, "muster_evidence_forwarded_total", "b"), h.metric(t, "muster_evidence_forward_dropped_total", "b"))
	}
}

// TestStopFlushes: Stop makes one last delivery of what is queued.
func TestStopFlushes(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	b := newFakePeer(t, k)
	h := newHarness(t, k, func(c *forward.Config) { c.BatchWait = time.Hour }, forward.Peer{ID: "b", Address: b.URL})
	wait.For(t, 10*time.Second, "the forwarder to know peer b", func() bool { return hasSeries(h, "b") })
	h.f.Offer(prober, items(7), nil)
	h.f.Stop()
	if n := len(b.reports()); n != 7 {
		t.Fatalf("after Stop the peer holds %d reports, want 7", n)
	}
	h.f.Stop() // twice: fine
}

func TestActorPrincipalRefusesWhatNoPrincipalIs(t *testing.T) {
	for _, a := range []forward.Actor{
		{Subject: "x"},
		{Subject: "x", Kind: "robot"},
		{Kind: "prober"},
		{Subject: "x", Kind: "workload"},
		{Subject: "x", Kind: "operator", Role: "god"},
	} {
		if p, err := a.Principal(); err == nil {
			t.Errorf("%+v decodes to %v", a, p)
		}
	}
}

// TestAnOlderPeerIsSentJSON: a peer that answers a compact body 415 (a
// replica of the release before, which reads JSON only) is sent the same
// batch again as JSON, and JSON from then on: every report arrives, and
// the compact form is tried once.
func TestAnOlderPeerIsSentJSON(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	old, cur := newFakePeerAs(t, k, "b"), newFakePeerAs(t, k, "c")
	old.jsonOnly.Store(true)
	h := newHarness(t, k, nil, forward.Peer{ID: "b", Address: old.URL}, forward.Peer{ID: "c", Address: cur.URL})
	wait.For(t, 10*time.Second, "the forwarder to know its peers", func() bool { return hasSeries(h, "b") && hasSeries(h, "c") })
	for range 3 {
		h.f.Offer(prober, items(10), nil)
		n := len(old.reports()) + 10
		wait.For(t, 10*time.Second, "the batch at the older peer", func() bool { return len(old.reports()) == n })
	}
	wait.For(t, 10*time.Second, "every batch at the current peer", func() bool { return len(cur.reports()) == 30 })
	if n := old.refusedCompact.Load(); n != 1 {
		t.Errorf("the older peer was sent %d compact bodies, want 1 (then JSON)", n)
	}
	for _, hd := range old.headerList() {
		if ct := hd.Get("Content-Type"); ct != "application/json" {
			t.Errorf("the older peer took a %s body", ct)
		}
	}
	for _, hd := range cur.headerList() {
		if ct := hd.Get("Content-Type"); ct != forward.BinaryContentType {
			t.Errorf("the current peer took a %s body, want the compact form", ct)
		}
	}
}

// headerList is a copy of the headers of the requests taken so far.
func (p *fakePeer) headerList() []http.Header {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.headers)
}
