package relay_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/testclock"
	"github.com/musterhq/muster/internal/wait"
)

// frame is a signed frame whose bytes encoding/json would not reproduce.
func frame(kind stream.Kind, service string, from, v uint64) *stream.Frame {
	return signedFrame(kind, service, from, v, nil, `, "note": "<a&b>"`)
}

// publish publishes web's view v on hub, with the delta from v-1 when v > 1.
func publish(hub *stream.Hub, service string, v uint64) {
	u := stream.Update{View: frame(stream.KindView, service, 0, v)}
	if v > 1 {
		u.Delta = frame(stream.KindDelta, service, v-1, v)
	}
	hub.Publish([]stream.Update{u})
}

// peers is a settable peer list.
type peers struct {
	mu   sync.Mutex
	list []relay.Peer
}

func (p *peers) set(list ...relay.Peer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = list
}

func (p *peers) get() []relay.Peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]relay.Peer(nil), p.list...)
}

// newRelay starts a relay into a fresh hub, following ps.
func newRelay(t testing.TB, ps *peers, tune func(*relay.Config)) (*relay.Relay, *stream.Hub, *prometheus.Registry) {
	t.Helper()
	hub := stream.NewHub(stream.Config{})
	reg := prometheus.NewRegistry()
	cfg := relay.Config{Hub: hub, Signer: peer.Signer{ID: "b", Key: apptest.SealKey()}, Peers: ps.get,
		Refresh: 20 * time.Millisecond, Registerer: reg}
	if tune != nil {
		tune(&cfg)
	}
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r, hub, reg
}

// same reports whether hub b holds service at the version and bytes a does.
func same(a, b *stream.Hub, service string) bool {
	va, ok := a.View(service)
	if !ok {
		return false
	}
	vb, ok := b.View(service)
	return ok && va.Version == vb.Version && bytes.Equal(va.JSON, vb.JSON)
}

// TestRelayFollowsAPeer (issue 27): a replica's views reach another's hub
// through the real endpoint, the snapshot first and then each
// publication, byte for byte and as deltas: a subscriber of the second
// replica receives the delta the first published.
func TestRelayFollowsAPeer(t *testing.T) {
	t.Parallel()
	a := apptest.New(t, apptest.Options{Replica: "a"})
	publish(a.Hub, "web", 1)
	publish(a.Hub, "web", 2)
	publish(a.Hub, "api", 1)
	ps := &peers{}
	ps.set(relay.Peer{ID: "a", Address: a.URL})
	r, b, reg := newRelay(t, ps, nil)
	wait.For(t, 10*time.Second, "the snapshot relayed", func() bool { return same(a.Hub, b, "web") && same(a.Hub, b, "api") })

	sub, err := b.Subscribe([]string{"web"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	publish(a.Hub, "web", 3)
	select {
	case f := <-sub.C():
		want, _ := a.Hub.View("web")
		if f.Kind != stream.KindDelta || f.Version != 3 || f.FromVersion != 2 || !bytes.Equal(f.JSON, frame(stream.KindDelta, "web", 2, 3).JSON) {
			t.Fatalf("a subscriber of b got %s@%d %s, want the delta to %d", f.Kind, f.Version, f.JSON, want.Version)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no frame relayed within 10 s")
	}
	if !same(a.Hub, b, "web") {
		t.Fatal("b does not hold a's view of web")
	}
	// The count is taken after the hub is handed the update, so the
	// subscriber can see the frame before the status counts it.
	wait.For(t, 10*time.Second, "3 updates counted", func() bool { st := r.Status(); return len(st) == 1 && st[0].Updates == 3 })
	st := r.Status()
	if st[0].Peer != "a" || !st[0].Connected || st[0].LastRecordAt.IsZero() {
		t.Fatalf("status %+v", st)
	}
	if got := metric(t, reg, "muster_relay_connected", "a"); got != 1 {
		t.Fatalf("muster_relay_connected{peer=a} = %v", got)
	}

	// A peer that leaves the list is disconnected.
	ps.set()
	wait.For(t, 10*time.Second, "a disconnected", func() bool { return len(r.Status()) == 0 })
	publish(a.Hub, "web", 4)
	ps.set(relay.Peer{ID: "a", Address: a.URL})
	wait.For(t, 10*time.Second, "a followed again", func() bool { return same(a.Hub, b, "web") })
}

// metric reads the value of a metric of reg by name and peer label (-1:
// none).
func metric(t *testing.T, reg *prometheus.Registry, name, peerID string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "peer" && l.GetValue() == peerID {
					if g := m.GetGauge(); g != nil {
						return g.GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// TestRelayReconnectsToAPeerThatReturns (issue 27): a peer killed
// mid-stream is reconnected to once it listens again at its address, and
// the receiving hub converges on what it published meanwhile.
func TestRelayReconnectsToAPeerThatReturns(t *testing.T) {
	t.Parallel()
	a := apptest.New(t, apptest.Options{Replica: "a"})
	publish(a.Hub, "web", 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	serve := func(ln net.Listener) *http.Server {
		hs := &http.Server{Handler: a.Server}
		go func() { _ = hs.Serve(ln) }()
		return hs
	}
	hs := serve(ln)
	ps := &peers{}
	ps.set(relay.Peer{ID: "a", Address: "http://" + addr})
	r, b, reg := newRelay(t, ps, nil)
	wait.For(t, 10*time.Second, "web relayed", func() bool { return same(a.Hub, b, "web") })

	// Killed mid-stream: the listener and every connection closed.
	if err := hs.Close(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the stream seen dead", func() bool {
		st := r.Status()
		return len(st) == 1 && !st[0].Connected
	})
	for v := uint64(2); v <= 5; v++ {
		publish(a.Hub, "web", v)
	}
	publish(a.Hub, "api", 1)
	if same(a.Hub, b, "web") {
		t.Fatal("b holds web@5 while a is away")
	}
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again at %s: %v", addr, err)
	}
	hs2 := serve(ln2)
	t.Cleanup(func() { _ = hs2.Close() })
	wait.For(t, 15*time.Second, "b converged on a after a returned", func() bool {
		return same(a.Hub, b, "web") && same(a.Hub, b, "api")
	})
	if got := metric(t, reg, "muster_relay_reconnects_total", "a"); got < 1 {
		t.Fatalf("muster_relay_reconnects_total{peer=a} = %v after a reconnect", got)
	}
}

// fakePeer serves peer streams with handler, counting requests.
func fakePeer(t *testing.T, handler func(w http.ResponseWriter, r *http.Request, n int)) (string, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != relay.Path || r.Header.Get(peer.Header) == "" {
			http.Error(w, "not signed", http.StatusUnauthorized)
			return
		}
		handler(w, r, int(n.Add(1)))
	})}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return "http://" + ln.Addr().String(), &n
}

// TestAMalformedRecordEndsItsConnection: a record that does not decode
// reaches nothing; the connection ends, is counted, and is opened again,
// and what came before it stands.
func TestAMalformedRecordEndsItsConnection(t *testing.T) {
	t.Parallel()
	seven := signedFrame(stream.KindView, "web", 0, 7, nil, "")
	seven.PublishedAt = time.Now()
	good, err := relay.AppendSnapshot(nil, seven)
	if err != nil {
		t.Fatal(err)
	}
	addr, requests := fakePeer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write(good)
		// A later version whose view is not an object, then a valid
		// record the reader must never reach.
		_, _ = w.Write([]byte(`{"kind":"update","service":"web","version":9,"view":"gone","published_at":"2026-01-01T00:00:00Z"}` + "\n"))
		eight := signedFrame(stream.KindView, "web", 0, 8, nil, "")
		eight.PublishedAt = time.Now()
		later, _ := relay.AppendSnapshot(nil, eight)
		_, _ = w.Write(later)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	ps := &peers{}
	ps.set(relay.Peer{ID: "a", Address: addr})
	_, b, reg := newRelay(t, ps, nil)
	wait.For(t, 10*time.Second, "two connections", func() bool { return requests.Load() >= 2 })
	if got := metric(t, reg, "muster_relay_malformed_total", "a"); got < 1 {
		t.Fatalf("muster_relay_malformed_total{peer=a} = %v", got)
	}
	if f, ok := b.View("web"); !ok || f.Version != 7 || string(f.JSON) != string(seven.JSON) {
		t.Fatalf("b holds %+v, want web@7 alone", f)
	}
}

// TestASilentPeerIsTakenForDead: a stream without a line for Idle is
// ended and opened again.
func TestASilentPeerIsTakenForDead(t *testing.T) {
	t.Parallel()
	addr, requests := fakePeer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	ps := &peers{}
	ps.set(relay.Peer{ID: "a", Address: addr})
	r, _, _ := newRelay(t, ps, func(c *relay.Config) { c.Idle = 100 * time.Millisecond })
	wait.For(t, 10*time.Second, "a second connection", func() bool { return requests.Load() >= 2 })
	st := r.Status()
	if len(st) != 1 || !strings.Contains(st[0].LastError, "idle") {
		t.Fatalf("status %+v, want the idle limit named", st)
	}
}

// TestStopEndsTheStreams: Stop returns once every stream has ended, and
// is safe twice and before Start.
func TestStopEndsTheStreams(t *testing.T) {
	t.Parallel()
	var ended atomic.Bool
	addr, requests := fakePeer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		ended.Store(true)
	})
	ps := &peers{}
	ps.set(relay.Peer{ID: "a", Address: addr})
	unstarted, err := relay.New(relay.Config{Hub: stream.NewHub(stream.Config{}), Signer: peer.Signer{ID: "b", Key: apptest.SealKey()}, Peers: ps.get})
	if err != nil {
		t.Fatal(err)
	}
	unstarted.Stop()
	r, _, _ := newRelay(t, ps, nil)
	wait.For(t, 10*time.Second, "a connection", func() bool { return requests.Load() >= 1 })
	r.Stop()
	r.Stop()
	wait.For(t, 10*time.Second, "the peer to see the stream end", ended.Load)
	if st := r.Status(); len(st) != 0 {
		t.Fatalf("status after Stop: %+v", st)
	}
}

// signer signs as replica b with the region's key of the test process.
func signer() peer.Signer { return peer.Signer{ID: "b", Key: apptest.SealKey()} }

// TestRelayBehindAlarm (issue 27): a live peer this replica cannot follow
// raises relay_behind once it has gone unfollowed for AlarmAfter, naming
// the peer; following it again clears the alarm.
func TestRelayBehindAlarm(t *testing.T) {
	t.Parallel()
	a := apptest.New(t, apptest.Options{Replica: "a"})
	publish(a.Hub, "web", 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there: every attempt is refused
	// Before any publication, so the relay lag (this clock minus the
	// peer's) is never above MaxLag.
	clock := testclock.New(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC))
	ps := &peers{}
	ps.set(relay.Peer{ID: "a", Address: closed})
	r, _, _ := newRelay(t, ps, func(c *relay.Config) { c.Now = clock.Now; c.MaxBackoff = 200 * time.Millisecond })
	wait.For(t, 10*time.Second, "an attempt refused", func() bool { st := r.Status(); return len(st) == 1 && st[0].LastError != "" })
	clock.Advance(14 * time.Second)
	if al := r.Alarms(); len(al) != 0 {
		t.Fatalf("alarms after 14 s unfollowed: %+v", al)
	}
	clock.Advance(2 * time.Second)
	al := r.Alarms()
	if len(al) != 1 || al[0].Kind != relay.AlarmRelayBehind || !strings.Contains(al[0].Detail, "replica a ("+closed+")") {
		t.Fatalf("alarms after 16 s unfollowed: %+v", al)
	}

	// The peer back (at a listening address): followed, no alarm.
	ps.set(relay.Peer{ID: "a", Address: a.URL})
	wait.For(t, 10*time.Second, "a followed", func() bool { st := r.Status(); return len(st) == 1 && st[0].Connected })
	if al := r.Alarms(); len(al) != 0 {
		t.Fatalf("alarms while following: %+v", al)
	}
}
