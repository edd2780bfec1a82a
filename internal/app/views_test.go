package app_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// rogueAddress is where a forger would send web's traffic.
const rogueAddress = "203.0.113.66"

// peerList is a settable relay peer list.
type peerList struct {
	mu   sync.Mutex
	list []relay.Peer
}

func (p *peerList) set(list ...relay.Peer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = list
}

func (p *peerList) get() []relay.Peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]relay.Peer(nil), p.list...)
}

// follower is a stack (replica b) whose relay follows the peers in ps
// only, checking tenures by the region's 64 shards.
func follower(t *testing.T, ps *peerList) *apptest.Stack {
	t.Helper()
	return apptest.New(t, apptest.Options{Replica: "b", Relay: func(c *relay.Config) {
		c.Peers = ps.get
		c.ShardOf = func(s string) (int, bool) { return ownership.ShardOf(s, 64), true }
	}})
}

// registerAndPublish registers n instances of service at s (10.0.<net>.i
// from i = from), brings web's into rotation, and publishes.
func registerAndPublish(t *testing.T, s *apptest.Stack, service string, net, from, n int) {
	t.Helper()
	admin := s.Token(t, apptest.Admin)
	var ids []string
	for i := range n {
		r := s.JSON(t, "POST", "/v1/services/"+service+"/instances", admin, fmt.Sprintf(`{"address":"10.0.%d.%d","port":8080,"zone":"az1"}`, net, from+i))
		if r.Status != http.StatusCreated {
			t.Fatalf("register %s: %d %s", service, r.Status, r.Body)
		}
		ids = append(ids, apptest.Decode[registry.Instance](t, r).ID.String())
	}
	if service == "web" {
		s.Admit(t, ids...)
	}
	publishNow(t, s)
}

// publishNow steps s's evaluator and publisher until what is queued is
// published.
func publishNow(t *testing.T, s *apptest.Stack) {
	t.Helper()
	s.SyncNow(t)
	s.Evaluator.EvaluateNow()
	s.Publisher.RunOnce()
	s.Clock.Advance(2 * time.Second)
	s.Publisher.RunOnce()
}

// holdsSame reports whether b's hub holds a's view of service, byte for
// byte.
func holdsSame(a, b *apptest.Stack, service string) bool {
	va, ok := a.Hub.View(service)
	if !ok {
		return false
	}
	vb, ok := b.Hub.View(service)
	return ok && va.Version == vb.Version && bytes.Equal(va.JSON, vb.JSON)
}

// counter reads a counter of reg with label peer=id (0 when absent).
func counter(t *testing.T, reg *prometheus.Registry, name, id string) float64 {
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
				if l.GetName() == "peer" && l.GetValue() == id {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// openAlarm returns the open alarm of kind on s whose detail holds want.
func openAlarm(s *apptest.Stack, kind, want string) (assembler.Alarm, bool) {
	for _, al := range s.Server.Alarms() {
		if al.Kind == kind && strings.Contains(al.Detail, want) {
			return al, true
		}
	}
	return assembler.Alarm{}, false
}

// rewritingProxy stands on the network path between a replica and its
// peer: it passes the peer's stream through, and while armed appends one
// forged record (the next of forge) after the opening snapshot of each
// connection, remembering every record it passed.
type rewritingProxy struct {
	target string
	armed  atomic.Bool
	forge  []func(seen map[string]relay.Record) []byte
	next   atomic.Int64
	mu     sync.Mutex
	seen   map[string]relay.Record // the last record of each service
}

func (p *rewritingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	w.WriteHeader(res.StatusCode)
	rd := bufio.NewReader(res.Body)
	injected := false
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 0 {
			if rec, derr := relay.Decode(bytes.TrimSuffix(line, []byte("\n"))); derr == nil && rec.Kind != relay.KindHeartbeat {
				p.mu.Lock()
				p.seen[rec.Service] = rec
				p.mu.Unlock()
			}
			if _, werr := w.Write(line); werr != nil {
				return
			}
			if bytes.Contains(line, []byte(`"kind":"heartbeat"`)) && !injected && p.armed.Load() {
				injected = true
				p.mu.Lock()
				forged := p.forge[int(p.next.Add(1)-1)%len(p.forge)](p.seen)
				p.mu.Unlock()
				_, _ = w.Write(forged)
			}
			w.(http.Flusher).Flush()
		}
		if err != nil {
			return
		}
	}
}

// recordLine is the NDJSON line of a snapshot record of view.
func recordLine(t *testing.T, view []byte, service string, version uint64) []byte {
	t.Helper()
	b, err := relay.AppendSnapshot(nil, &stream.Frame{Kind: stream.KindView, Service: service, Version: version, JSON: view, PublishedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestARogueOnThePathCannotMoveAService: replica a owns and publishes web
// and api; replica b follows a through a proxy on the network path that
// rewrites a's answers: after a's genuine snapshot it appends a higher
// version of web with a valid public checksum but no signature, a
// validly signed view of api renamed to web, and a view of web with a
// forged signature. b applies none of them: its hub holds a's web, GET
// /v1/resolve/web at b and a watch subscriber of b (the resolver library
// with the region's key) route where muster put web, a's next
// publication reaches both, and relay_forged names the peer (its id and
// the address b followed).
func TestARogueOnThePathCannotMoveAService(t *testing.T) {
	t.Parallel()
	ps := &peerList{}
	b := follower(t, ps)
	a := apptest.New(t, apptest.Options{Replica: "a", Pool: b.Pool}) // the newest: it owns every shard
	a.Seed(t)
	registerAndPublish(t, a, "web", 7, 1, 3)
	registerAndPublish(t, a, "api", 8, 1, 2)
	web, ok := a.Hub.View("web")
	if !ok {
		t.Fatal("a published no view of web")
	}

	forgedWeb := func(sig *assembler.Signature) func(map[string]relay.Record) []byte {
		return func(map[string]relay.Record) []byte {
			var v assembler.View
			if err := json.Unmarshal(web.JSON, &v); err != nil {
				t.Error(err)
			}
			for i := range v.Endpoints {
				v.Endpoints[i].Address = rogueAddress
			}
			v.Version += 1 << 40 // far above anything muster will publish
			v.Checksum = assembler.Checksum(v.Endpoints)
			v.Signature = sig
			body, _ := json.Marshal(v)
			return recordLine(t, body, "web", v.Version)
		}
	}
	junk := make([]byte, ed25519.SignatureSize)
	_, _ = rand.Read(junk)
	pr := &rewritingProxy{target: a.URL, seen: map[string]relay.Record{}, forge: []func(map[string]relay.Record) []byte{
		forgedWeb(nil), // unsigned, its checksum the rogue endpoints'
		func(seen map[string]relay.Record) []byte { // api's signed view, renamed
			api := seen["api"]
			body := bytes.Replace(api.View, []byte(`"service":"api"`), []byte(`"service":"web"`), 1)
			body = bytes.Replace(body, fmt.Appendf(nil, `"version":%d`, api.Version), fmt.Appendf(nil, `"version":%d`, api.Version+1<<40), 1)
			return recordLine(t, body, "web", api.Version+1<<40)
		},
		forgedWeb(&assembler.Signature{Replica: "a", KeyID: apptest.SealKey().KeyID(), Sig: base64.StdEncoding.EncodeToString(junk)}),
	}}
	proxy := httptest.NewServer(pr)
	t.Cleanup(func() {
		// b is still following: its stream would hold Close forever.
		proxy.CloseClientConnections()
		proxy.Close()
	})
	ps.set(relay.Peer{ID: "a", Address: proxy.URL})
	wait.For(t, 15*time.Second, "b holding a's web and api through the proxy", func() bool {
		return holdsSame(a, b, "web") && holdsSame(a, b, "api")
	})

	// A subscriber of b, verifying with the region's key.
	keys := map[string]ed25519.PublicKey{apptest.SealKey().KeyID(): apptest.SealKey().Public()}
	viewer := b.Token(t, apptest.Viewer)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client, err := resolver.New(ctx, resolver.Config{URLs: []string{b.URL}, Services: []string{"web"}, HTTPClient: b.Client,
		ViewKeys: keys, ReportInterval: -1, Token: func(context.Context) (string, error) { return viewer, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	clientAt := func() (uint64, []string) {
		res, err := client.Resolve("web")
		if err != nil {
			return 0, nil
		}
		var addrs []string
		for _, e := range res.Endpoints() {
			addrs = append(addrs, e.Address)
		}
		return res.Version(), addrs
	}
	wait.For(t, 15*time.Second, "the subscriber of b holding web", func() bool { v, _ := clientAt(); return v == web.Version })

	// The rogue starts rewriting: every connection gets one forgery. b's
	// clock moves a little at every look, as time does: a reconnection
	// signed at the same millisecond as the last is refused as a replay.
	pr.armed.Store(true)
	wait.For(t, 30*time.Second, "each forgery sent and refused", func() bool {
		b.Clock.Advance(20 * time.Millisecond)
		return pr.next.Load() >= 3 && counter(t, b.Metrics, "muster_relay_forged_total", "a") >= 3
	})
	pr.armed.Store(false)
	if al, ok := openAlarm(b, relay.AlarmRelayForged, "replica a ("+proxy.URL+")"); !ok {
		t.Fatalf("no relay_forged alarm naming replica a (%s): %+v", proxy.URL, b.Server.Alarms())
	} else if al.Since.IsZero() {
		t.Fatalf("relay_forged without a start: %+v", al)
	}
	if f, _ := b.Hub.View("web"); f == nil || f.Version != web.Version || !bytes.Equal(f.JSON, web.JSON) {
		t.Fatalf("b's hub holds web %+v, want a's v%d", f, web.Version)
	}

	// a's next publication (one more instance) goes through.
	registerAndPublish(t, a, "web", 7, 4, 1)
	next, _ := a.Hub.View("web")
	if next.Version <= web.Version {
		t.Fatalf("a published no new version of web (v%d)", next.Version)
	}
	wait.For(t, 15*time.Second, "a's next version at b and its subscriber", func() bool {
		b.Clock.Advance(20 * time.Millisecond)
		v, _ := clientAt()
		return holdsSame(a, b, "web") && v == next.Version
	})
	_, addrs := clientAt()
	r := b.Do(t, "GET", "/v1/resolve/web", b.Token(t, apptest.Admin), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("resolve web at b: %d %s", r.Status, r.Body)
	}
	body := r.Body
	if bytes.Contains(body, []byte(rogueAddress)) || !bytes.Contains(body, []byte(`"10.0.7.1"`)) {
		t.Fatalf("resolve web at b: %s", body)
	}
	for _, addr := range addrs {
		if addr == rogueAddress || !strings.HasPrefix(addr, "10.0.7.") {
			t.Fatalf("the subscriber of b routes web to %v", addrs)
		}
	}
	if st := client.Stats(); st.Cache.SignatureRefusals != 0 {
		t.Fatalf("b served its subscriber %d views that do not verify", st.Cache.SignatureRefusals)
	}
}

// fakePeer serves, to any signed peer stream request, the lines of
// records and then heartbeats.
func fakePeer(t *testing.T, records ...[]byte) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != relay.Path || r.Header.Get(peer.Header) == "" {
			http.Error(w, "not signed", http.StatusUnauthorized)
			return
		}
		for _, rec := range records {
			_, _ = w.Write(rec)
		}
		_, _ = w.Write(relay.Heartbeat)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv.URL
}

// signedView is a view of service at version with no endpoints, signed
// by the region's key as replica.
func signedView(t *testing.T, service string, version uint64, replica string) []byte {
	t.Helper()
	sign := assembler.SignWith(replica, apptest.SealKey().KeyID(),
		func(msg []byte) ([]byte, error) { return apptest.SealKey().Sign(context.Background(), msg) }, nil)
	v := assembler.View{Service: service, Version: version, Endpoints: []assembler.Endpoint{}, Zones: map[string]assembler.ZoneStatus{},
		GeneratedAt: time.Now().UTC(), Checksum: assembler.Checksum(nil)}
	v.Signature = sign(service, version, v.Checksum, assembler.ZonesDigest(v.Zones))
	body, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return recordLine(t, body, service, version)
}

// TestViewsOnlyWithinASealedTenure: replica a publishes web under its
// epoch, then replica c takes every shard (a handover) and publishes web
// under its own; replica b, following both, takes both versions (no view
// refused). A third peer x sends views signed by the region's key but
// outside every tenure: one under an epoch nobody was given, one under
// c's epoch signed as a: b applies neither, counts both and raises
// view_outside_tenure naming x.
func TestViewsOnlyWithinASealedTenure(t *testing.T) {
	t.Parallel()
	ps := &peerList{}
	b := follower(t, ps)
	a := apptest.New(t, apptest.Options{Replica: "a", Pool: b.Pool})
	a.Seed(t)
	ps.set(relay.Peer{ID: "a", Address: a.URL})
	registerAndPublish(t, a, "web", 7, 1, 2)
	wait.For(t, 15*time.Second, "b holding a's web", func() bool { return holdsSame(a, b, "web") })
	old, _ := a.Hub.View("web")
	if err := a.Publisher.SaveOnce(t.Context()); err != nil {
		t.Fatal(err)
	}

	// The handover: c takes every shard (a releases them), records its
	// epoch's tenures and publishes web above a's versions.
	c := apptest.New(t, apptest.Options{Replica: "c", Pool: b.Pool})
	ps.set(relay.Peer{ID: "a", Address: a.URL}, relay.Peer{ID: "c", Address: c.URL})
	publishNow(t, c)
	cur, ok := c.Hub.View("web")
	if !ok || cur.Version>>assembler.CounterBits <= old.Version>>assembler.CounterBits {
		t.Fatalf("c published web at %+v, want an epoch above a's v%d", cur, old.Version)
	}
	wait.For(t, 15*time.Second, "b holding c's web", func() bool { return holdsSame(c, b, "web") })
	for _, p := range []string{"a", "c"} {
		if n := counter(t, b.Metrics, "muster_relay_outside_tenure_total", p) + counter(t, b.Metrics, "muster_relay_forged_total", p); n != 0 {
			t.Fatalf("b refused %v views of %s during a legitimate handover", n, p)
		}
	}

	// x: signed by the key, outside the tenures.
	cEpoch := cur.Version >> assembler.CounterBits
	x := fakePeer(t,
		signedView(t, "web", (cEpoch+1000)<<assembler.CounterBits|1, "c"), // an epoch nobody was given
		signedView(t, "web", cEpoch<<assembler.CounterBits|1<<30, "a"),    // c's epoch, signed as a
	)
	ps.set(relay.Peer{ID: "a", Address: a.URL}, relay.Peer{ID: "c", Address: c.URL}, relay.Peer{ID: "x", Address: x})
	wait.For(t, 15*time.Second, "both of x's views refused", func() bool {
		return counter(t, b.Metrics, "muster_relay_outside_tenure_total", "x") >= 2
	})
	if f, _ := b.Hub.View("web"); f == nil || f.Version != cur.Version {
		t.Fatalf("b's hub holds web %+v, want c's v%d", f, cur.Version)
	}
	if _, ok := openAlarm(b, relay.AlarmViewOutsideTenure, "replica x ("+x+")"); !ok {
		t.Fatalf("no view_outside_tenure naming x: %+v", b.Server.Alarms())
	}
	if _, ok := openAlarm(b, relay.AlarmRelayForged, ""); ok {
		t.Fatalf("relay_forged raised for views signed by the region's key: %+v", b.Server.Alarms())
	}

	// A tenure row written by hand (no valid seal) opens nothing: the
	// tenure book believes only sealed rows.
	forgedEpoch := cEpoch + 2000
	if _, err := b.Pool.Exec(t.Context(), `INSERT INTO shard_tenures (shard, epoch, owner, lease_epoch, taken_at, seal, key_id)
		VALUES ($1, $2, 'x', 1, now(), '\x00', $3)`, ownership.ShardOf("web", 64), forgedEpoch, apptest.SealKey().KeyID()); err != nil {
		t.Fatal(err)
	}
	y := fakePeer(t, signedView(t, "web", forgedEpoch<<assembler.CounterBits|1, "x"))
	ps.set(relay.Peer{ID: "c", Address: c.URL}, relay.Peer{ID: "y", Address: y})
	wait.For(t, 15*time.Second, "the view under a hand-written tenure refused", func() bool {
		return counter(t, b.Metrics, "muster_relay_outside_tenure_total", "y") >= 1
	})
	if f, _ := b.Hub.View("web"); f == nil || f.Version != cur.Version {
		t.Fatalf("b's hub holds web %+v, want c's v%d", f, cur.Version)
	}
}

// TestAForgedSavedViewIsNeverABase: a database writer replaces web's
// saved view (published_views) with a higher version that moves web to
// another address, its public checksum valid but unsigned. The replica
// that takes the shards next ignores it (saved_view_forged names web):
// its first version of web is not a delta from the forged one, and
// routes only where muster put web; api's genuine saved view is restored
// as before (its first version is a delta from it).
func TestAForgedSavedViewIsNeverABase(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	a := apptest.New(t, apptest.Options{Replica: "a"})
	a.Seed(t)
	registerAndPublish(t, a, "web", 7, 1, 2)
	registerAndPublish(t, a, "api", 8, 1, 1)
	if err := a.Publisher.SaveOnce(ctx); err != nil {
		t.Fatal(err)
	}
	saved, _ := a.Hub.View("web")
	savedAPI, _ := a.Hub.View("api")
	var v assembler.View
	if err := json.Unmarshal(saved.JSON, &v); err != nil {
		t.Fatal(err)
	}
	for i := range v.Endpoints {
		v.Endpoints[i].Address = rogueAddress
	}
	v.Version++
	v.Checksum, v.Signature = assembler.Checksum(v.Endpoints), nil
	forged, _ := json.Marshal(v)
	if _, err := a.Pool.Exec(ctx, `UPDATE published_views SET version = $1, view = $2 WHERE service = 'web'`, int64(v.Version), forged); err != nil {
		t.Fatal(err)
	}

	c := apptest.New(t, apptest.Options{Replica: "c", Pool: a.Pool}) // takes every shard, adopts
	if al, ok := openAlarm(c, "saved_view_forged", "of web"); !ok || al.Service != "web" {
		t.Fatalf("no saved_view_forged for web: %+v", c.Server.Alarms())
	}
	publishNow(t, c)
	first, ok := c.Hub.View("web")
	if !ok || first.Version>>assembler.CounterBits <= v.Version>>assembler.CounterBits || bytes.Contains(first.JSON, []byte(rogueAddress)) {
		t.Fatalf("c's first view of web: %+v", first)
	}
	sub, err := c.Hub.Subscribe([]string{"web", "api"}, v.Version)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for _, f := range sub.Initial {
		if f.Service == "web" && (f.Kind != stream.KindView || bytes.Contains(f.JSON, []byte(rogueAddress))) {
			t.Fatalf("a client holding the forged v%d is sent %s %s, want c's full view", v.Version, f.Kind, f.JSON)
		}
	}
	subAPI, err := c.Hub.Subscribe([]string{"api"}, savedAPI.Version)
	if err != nil {
		t.Fatal(err)
	}
	defer subAPI.Close()
	if len(subAPI.Initial) == 0 || subAPI.Initial[0].Kind != stream.KindDelta || subAPI.Initial[0].FromVersion != savedAPI.Version {
		t.Fatalf("a client at api's saved v%d is sent %+v, want a delta from it (the genuine saved view restored)", savedAPI.Version, subAPI.Initial)
	}
	if _, ok := openAlarm(c, "saved_view_forged", "of api"); ok {
		t.Fatal("saved_view_forged raised for api's genuine view")
	}
}
