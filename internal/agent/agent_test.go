package agent_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/miekg/dns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/agent"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds/xdstest"
	"github.com/musterhq/muster/resolver"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var admin = identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}

// gate forwards TCP to muster until Close: muster unreachable, as the
// agent sees it, without stopping the stack.
type gate struct {
	ln     net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	paused atomic.Bool // connections are closed as they come
}

func newGate(t *testing.T, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if g.paused.Load() {
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			g.mu.Lock()
			g.conns = append(g.conns, c, u)
			g.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	t.Cleanup(g.Close)
	return g
}

func (g *gate) URL() string { return "http://" + g.ln.Addr().String() }

func (g *gate) Close() {
	_ = g.ln.Close()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		_ = c.Close()
	}
}

// running is one agent process's worth: the agent, its surfaces and
// their listeners.
type running struct {
	a        *agent.Agent
	srv      *agent.Server
	xdsAddr  string
	httpURL  string
	dnsAddr  string
	httpSrv  *http.Server
	stopOnce sync.Once
}

func startAgent(t *testing.T, cfg agent.Config, xdsAddr string) *running {
	t.Helper()
	return startAgentWith(t, cfg, xdsAddr, agent.ServerConfig{})
}

// startAgentWith is startAgent with the local surfaces configured by
// scfg (its listeners and DNS address are the test's).
func startAgentWith(t *testing.T, cfg agent.Config, xdsAddr string, scfg agent.ServerConfig) *running {
	t.Helper()
	ctx := context.Background()
	a, err := agent.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	xln, err := agent.Listen(xdsAddr)
	if err != nil {
		t.Fatal(err)
	}
	hln, err := agent.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scfg.Listeners, scfg.DNSAddr = []*agent.Listener{xln, hln}, "127.0.0.1:0"
	srv, err := agent.NewServer(a, scfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r := &running{a: a, srv: srv, xdsAddr: xln.Addr().String(), httpURL: "http://" + hln.Addr().String(), httpSrv: &http.Server{Handler: srv.Handler()}}
	r.dnsAddr = srv.DNS().Addr().String()
	go func() { _ = srv.ServeXDS(xln) }()
	go func() { _ = r.httpSrv.Serve(hln) }()
	t.Cleanup(r.stop)
	return r
}

func (r *running) stop() {
	r.stopOnce.Do(func() {
		r.srv.XDS().Close()
		r.srv.Stop()
		_ = r.httpSrv.Close()
		r.a.Stop()
	})
}

// insecureBootstrap is what a stock gRPC client is given: plaintext to
// the agent, no call credentials.
func insecureBootstrap(addr string) []byte {
	b, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      addr,
			"channel_creds":   []any{map[string]any{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{"id": "agent-test", "locality": map[string]string{"zone": "az1"}},
	})
	return b
}

func dial(t *testing.T, addr, service string) *grpc.ClientConn {
	t.Helper()
	builder, err := xds.NewXDSResolverWithConfigForTesting(insecureBootstrap(addr))
	if err != nil {
		t.Fatal(err)
	}
	return xdstest.DialWith(t, builder, service)
}

// reaches reports whether n calls in a row reach exactly want.
func reaches(ctx context.Context, conn *grpc.ClientConn, n int, want ...string) bool {
	got := xdstest.Tally(ctx, conn, n)
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return slices.Equal(keys, slices.Sorted(slices.Values(want)))
}

// deltaEndpoints opens a delta ADS stream to the agent with no
// credentials, subscribes to service's assignment and returns how many
// endpoints it has and its version.
func deltaEndpoints(t *testing.T, addr, service string) (int, string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{service}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatalf("delta stream to the agent: %v", err)
	}
	if len(r.GetResources()) != 1 || r.GetResources()[0].GetName() != service {
		t.Fatalf("delta response: want %s's assignment alone, got %v", service, r)
	}
	res := r.GetResources()[0]
	var cla endpoint.ClusterLoadAssignment
	if err := res.GetResource().UnmarshalTo(&cla); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range cla.GetEndpoints() {
		n += len(l.GetLbEndpoints())
	}
	return n, res.GetVersion()
}

// srvPorts is the ports of the SRV records the agent's DNS answers for
// service, sorted.
func srvPorts(t *testing.T, addr, service string) []int {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("_"+service+"._tcp.muster.internal.", dns.TypeSRV)
	r, _, err := (&dns.Client{Net: "udp", Timeout: 3 * time.Second}).Exchange(m, addr)
	if err != nil {
		t.Fatalf("SRV %s: %v", service, err)
	}
	var ports []int
	for _, rr := range r.Answer {
		if srv, ok := rr.(*dns.SRV); ok {
			ports = append(ports, int(srv.Port))
		}
	}
	slices.Sort(ports)
	return ports
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// web is a stack whose service web has an instance on a real gRPC
// backend per id, admitted by a prober's first success, and granted to
// api (the identity the agents hold).
type web struct {
	*apptest.Stack
	t      *testing.T
	ids    map[string]string // backend id -> instance id
	ports  map[string]int
	prober string
}

func newWeb(t *testing.T, backends ...string) *web {
	t.Helper()
	zones := make([]string, len(backends))
	for i := range zones {
		zones[i] = "az1"
	}
	return newWebIn(t, backends, zones)
}

// newWebIn is newWeb with backends[i] in zones[i].
func newWebIn(t *testing.T, backends, zones []string) *web {
	t.Helper()
	s := apptest.New(t, apptest.Options{})
	s.Seed(t)
	ctx := context.Background()
	w := &web{Stack: s, t: t, ids: map[string]string{}, ports: map[string]int{}}
	for i, id := range backends {
		w.register(id, zones[i])
	}
	if _, err := s.Registry.PutProberAssignments(ctx, admin, "prober-1", registry.ProberAssignments{Services: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Registry.PutGrants(ctx, admin, "web", []string{"api"}); err != nil {
		t.Fatal(err)
	}
	w.prober = s.Token(t, devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-1"})
	if err := s.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	w.report("success", backends...)
	return w
}

// register starts backend id's gRPC server and registers it in zone.
func (w *web) register(id, zone string) {
	w.t.Helper()
	b := xdstest.StartBackend(w.t, id)
	w.ports[id] = b.Addr.Port
	in, err := w.Registry.Register(context.Background(), admin, netip.Addr{}, "web", registry.Registration{Address: "127.0.0.1", Port: b.Addr.Port, Zone: zone})
	if err != nil {
		w.t.Fatal(err)
	}
	w.ids[id] = in.ID.String()
}

// report sends one probe outcome for each named backend and publishes
// what follows (additions wait for their 1 s window, on the stack's
// clock; withdrawals go at once).
func (w *web) report(outcome string, backends ...string) {
	w.t.Helper()
	w.withdraw(outcome, backends...)
	w.Clock.Advance(1100 * time.Millisecond)
	w.Publisher.RunOnce()
}

// withdraw sends one probe outcome for each named backend and publishes
// the withdrawals that follow, which go at once; it returns when the
// publication is in muster's hub.
func (w *web) withdraw(outcome string, backends ...string) {
	w.t.Helper()
	var items []string
	for _, b := range backends {
		items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":%q}`, w.ids[b], outcome))
	}
	if r := w.JSON(w.t, "POST", "/v1/reports", w.prober, `{"reports":[`+strings.Join(items, ",")+`]}`); r.Status != http.StatusOK {
		w.t.Fatalf("reports: %d %s", r.Status, r.Body)
	}
	w.Evaluator.EvaluateNow()
	w.Publisher.RunOnce()
}

// agentConfig is an agent holding api's token and the region's view
// key, following muster at upstream.
func (w *web) agentConfig(upstream, cache string, services ...string) agent.Config {
	token := w.Token(w.t, apptest.API)
	return agent.Config{
		Upstream: []string{upstream}, Services: services, CacheDir: cache,
		Token:       func(context.Context) (string, error) { return token, nil },
		ViewKeys:    map[string]ed25519.PublicKey{apptest.SealKey().KeyID(): apptest.SealKey().Public()},
		BaseBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond,
	}
}

// TestAgentServesStockGRPCClients: a grpc-go client with an insecure
// bootstrap and no credentials, pointed at muster agent, resolves
// xds:///web (a service the agent did not follow until the client asked
// for it), follows a withdrawal, and, with muster unreachable and the
// agent restarted, still reaches the last known backends. The agent's
// watch stream and /v1/resolve answer in muster's formats; a service
// upstream refuses is refused locally.
func TestAgentServesStockGRPCClients(t *testing.T) {
	t.Parallel()
	w := newWeb(t, "a1", "a2", "a3")
	s, ports, report := w.Stack, w.ports, w.report
	ctx := context.Background()

	// The agent holds workload api's token and the region's view key.
	g := newGate(t, strings.TrimPrefix(s.URL, "http://"))
	cfg := w.agentConfig(g.URL(), t.TempDir(), "api")
	ag := startAgent(t, cfg, "127.0.0.1:0")
	wait.For(t, 10*time.Second, "the agent ready with api's view", func() bool { st, _ := get(t, ag.httpURL+"/readyz"); return st == http.StatusOK })
	if ag.a.Held("web") {
		t.Fatal("the agent follows web before any local client asked for it")
	}

	conn := dial(t, ag.xdsAddr, "web")
	start := time.Now()
	wait.For(t, 30*time.Second, "calls through the agent reaching a1, a2 and a3", func() bool { return reaches(t.Context(), conn, 90, "a1", "a2", "a3") })
	t.Logf("xds:///web resolved through the agent %s after the dial (the agent added web to its upstream set)", time.Since(start).Round(time.Millisecond))
	if got := ag.a.Services(); !slices.Equal(got, []string{"api", "web"}) {
		t.Fatalf("the agent follows %v; want api and web", got)
	}

	// A withdrawal reaches the client through the agent.
	start = time.Now()
	report("hard_failure", "a3")
	wait.For(t, 5*time.Second, "a3 out of the client's rotation", func() bool { return reaches(t.Context(), conn, 30, "a1", "a2") })
	lag := time.Since(start)
	t.Logf("withdrawal: a3 out of the client's rotation %s after its hard failure was reported (polled with 30 calls)", lag.Round(time.Millisecond))

	// The DNS port answers what the client routes to.
	want := []int{ports["a1"], ports["a2"]}
	slices.Sort(want)
	wait.For(t, 5*time.Second, "the agent's DNS answering a1 and a2", func() bool { return slices.Equal(srvPorts(t, ag.dnsAddr, "web"), want) })

	// Delta xDS without credentials: the assignment a delta client
	// holds is the view's, a1 and a2.
	if n, ver := deltaEndpoints(t, ag.xdsAddr, "web"); n != 2 || ver == "" {
		t.Fatalf("delta: web's assignment has %d endpoints at version %q; want 2", n, ver)
	}

	// muster's formats: /v1/resolve, and the watch stream the resolver
	// library reads, without a token.
	st, body := get(t, ag.httpURL+"/v1/resolve/web")
	var v resolver.View
	if st != http.StatusOK || json.Unmarshal(body, &v) != nil || v.Service != "web" || len(v.Endpoints) != 2 {
		t.Fatalf("agent /v1/resolve/web: %d %s", st, body)
	}
	if _, err := resolver.SnapshotOf(v, time.Now()); err != nil {
		t.Fatalf("the agent's view does not check: %v", err)
	}
	rc, err := resolver.New(ctx, resolver.Config{URLs: []string{ag.httpURL}, Services: []string{"web"}, ReportInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	wait.For(t, 10*time.Second, "a resolver client synced through the agent's watch", func() bool {
		r, err := rc.Resolve("web")
		return err == nil && rc.Stats().Synced && r.Version() == v.Version && r.Routable() == 2
	})

	// A service upstream does not serve the agent is refused locally,
	// and the set it follows is unchanged.
	var last string
	wait.For(t, 10*time.Second, "an unknown service refused as upstream refuses it", func() bool {
		st, body := get(t, ag.httpURL+"/v1/resolve/nosuch")
		last = fmt.Sprintf("%d %s", st, body)
		return (st == http.StatusNotFound || st == http.StatusForbidden) && strings.Contains(string(body), "upstream refuses nosuch")
	})
	t.Logf("the agent answers an unknown service: %s", last)
	if got := ag.a.Services(); !slices.Equal(got, []string{"api", "web"}) {
		t.Fatalf("after a refused service the agent follows %v", got)
	}

	scrape := func(r *running) string { _, b := get(t, r.httpURL+"/metrics"); return string(b) }
	m := scrape(ag)
	for _, re := range []string{`muster_agent_upstream_connected 1`, `muster_agent_views 2`, `muster_agent_view_age_seconds\{service="web"\} `, `muster_agent_local_streams\{surface="xds"\} [1-9]`, `muster_xds_streams`} {
		if !regexp.MustCompile(re).MatchString(m) {
			t.Fatalf("metrics lack %s:\n%s", re, m)
		}
	}

	// muster unreachable, the agent restarted on the same port and cache
	// folder: it is ready at once, and a new client reaches a1 and a2.
	g.Close()
	ag.stop()
	rc.Close()
	ag2 := startAgent(t, cfg, ag.xdsAddr)
	if !ag2.a.Ready() || !slices.Equal(ag2.a.Services(), []string{"api", "web"}) {
		t.Fatalf("restarted with muster down: ready %v, services %v; want ready with api and web from the cache", ag2.a.Ready(), ag2.a.Services())
	}
	conn2 := dial(t, ag2.xdsAddr, "web")
	wait.For(t, 30*time.Second, "a new client reaching the last known backends through the restarted agent", func() bool {
		return reaches(t.Context(), conn2, 30, "a1", "a2")
	})
	if got := srvPorts(t, ag2.dnsAddr, "web"); !slices.Equal(got, want) {
		t.Fatalf("the restarted agent's DNS answers ports %v; want %v (a1, a2)", got, want)
	}
	// The first client's xDS stream came back to the restarted agent on
	// its own backoff; meanwhile and since, its calls land on a1 and a2.
	if !reaches(t.Context(), conn, 30, "a1", "a2") {
		t.Fatal("the first client stopped reaching a1 and a2 across the agent's restart")
	}
	if m := scrape(ag2); !strings.Contains(m, "muster_agent_upstream_connected 0") {
		t.Fatalf("with muster unreachable the agent reports it connected:\n%s", m)
	}
}

// TestListenOnlyOnLoopback: an address anyone but the host could reach
// is refused with a clear error; loopback and Unix sockets are taken.
func TestListenOnlyOnLoopback(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", ":0", "10.1.2.3:15010", "[::]:0", "example.com:15010", "127.0.0.1"} {
		ln, err := agent.Listen(addr)
		if err == nil {
			ln.Close()
			t.Fatalf("Listen(%q) listened", addr)
		}
		if !errors.Is(err, agent.ErrNotLoopback) {
			t.Fatalf("Listen(%q): %v; want ErrNotLoopback", addr, err)
		}
		if !strings.Contains(err.Error(), "only on loopback") {
			t.Fatalf("Listen(%q): %q does not say why", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "unix:" + t.TempDir() + "/agent.sock"} {
		ln, err := agent.Listen(addr)
		if err != nil {
			t.Fatalf("Listen(%q): %v", addr, err)
		}
		ln.Close()
	}
}

// TestAgentDropsWhatUpstreamRevokes: when web's owners withdraw the
// grant the agent's identity resolved it by, muster refuses the agent's
// watch of its whole set; the agent finds which service upstream no
// longer serves it, stops serving that one (and forgets its
// last-known-good file), and follows the others again.
func TestAgentDropsWhatUpstreamRevokes(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{})
	s.Seed(t)
	ctx := context.Background()
	if _, err := s.Registry.Register(ctx, admin, netip.Addr{}, "web", registry.Registration{Address: "127.0.0.1", Port: 9000, Zone: "az1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Registry.PutGrants(ctx, admin, "web", []string{"api"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	s.Evaluator.EvaluateNow()
	s.Publisher.RunOnce()
	s.Clock.Advance(1100 * time.Millisecond)
	s.Publisher.RunOnce()

	token := s.Token(t, apptest.API)
	cache := t.TempDir()
	ag := startAgent(t, agent.Config{
		Upstream: []string{s.URL}, Services: []string{"api", "web"}, CacheDir: cache,
		Token:       func(context.Context) (string, error) { return token, nil },
		BaseBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond,
	}, "127.0.0.1:0")
	wait.For(t, 10*time.Second, "the agent serving web", func() bool { st, _ := get(t, ag.httpURL+"/v1/resolve/web"); return st == http.StatusOK })

	if _, err := s.Registry.PutGrants(ctx, admin, "web", []string{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	wait.For(t, 30*time.Second, "web refused by the agent once upstream refuses it", func() bool {
		st, _ := get(t, ag.httpURL+"/v1/resolve/web")
		return st == http.StatusForbidden
	})
	t.Logf("web no longer served %s after its grant was withdrawn", time.Since(start).Round(time.Millisecond))
	if got := ag.a.Services(); !slices.Equal(got, []string{"api"}) {
		t.Fatalf("the agent follows %v; want api alone", got)
	}
	if _, err := resolver.LoadView(cache, "web"); err == nil {
		t.Fatal("web's last-known-good file is still in the cache folder")
	}
	wait.For(t, 10*time.Second, "the agent following api again", func() bool { return ag.a.Upstream().Connected })
	if st, _ := get(t, ag.httpURL+"/v1/resolve/api"); st != http.StatusOK {
		t.Fatalf("api through the agent: %d", st)
	}
}

// TestAgentFallsBackToPeerRegionsFromItsCache: an agent following a
// peer region, started with muster unreachable, serves from its cache
// folder web's local view (nothing routable) and its view in eu-west at
// the next priority: a stock grpc-go client reaches eu-west's backend.
func TestAgentFallsBackToPeerRegionsFromItsCache(t *testing.T) {
	t.Parallel()
	local, peer := xdstest.StartBackend(t, "local-1"), xdstest.StartBackend(t, "eu-west-1")
	ep := func(n int, b *xdstest.Backend, state string, w float64, region string) resolver.Endpoint {
		return resolver.Endpoint{InstanceID: fmt.Sprintf("00000000-0000-4000-8000-%012d", n), Address: "127.0.0.1", Port: b.Addr.Port,
			Zone: "az1", State: state, Weight: w, Health: resolver.HealthKnown, Region: region}
	}
	view := func(series, region string, version uint64, eps ...resolver.Endpoint) resolver.View {
		return resolver.View{Service: series, Version: version, Endpoints: eps, Region: region,
			Zones:       map[string]resolver.Zone{"az1": {Guard: resolver.GuardOK}},
			GeneratedAt: time.Now().Add(-time.Minute), Checksum: resolver.Checksum(eps)}
	}
	cache := t.TempDir()
	c, err := resolver.NewCache([]string{"web"}, resolver.WithDir(cache), resolver.WithRegions("eu-west"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyView(view("web", "", 5, ep(1, local, "ineligible", 0, ""))); err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyView(view("web@eu-west", "eu-west", 9, ep(2, peer, "eligible", 1, "eu-west"))); err != nil {
		t.Fatal(err)
	}

	ag := startAgent(t, agent.Config{
		Upstream: []string{"http://127.0.0.1:1"}, Services: []string{"web"}, CacheDir: cache,
		Region: "local", Regions: []string{"eu-west"},
		Token: func(context.Context) (string, error) { return "unused", nil },
	}, "127.0.0.1:0")
	if !ag.a.Ready() {
		t.Fatal("the agent is not ready with web's views in its cache folder")
	}
	conn := dial(t, ag.xdsAddr, "web")
	wait.For(t, 30*time.Second, "calls reaching eu-west's backend", func() bool { return reaches(t.Context(), conn, 30, "eu-west-1") })
	// The local view's only endpoint is ineligible, absent from the
	// assignment; eu-west's is its lower priority, and the version
	// names both views (LOCAL.HASH).
	if n, ver := deltaEndpoints(t, ag.xdsAddr, "web"); n != 1 || !strings.HasPrefix(ver, "5.") {
		t.Fatalf("delta: web's assignment has %d endpoints at version %q; want eu-west's one at 5.HASH", n, ver)
	}
}

// TestAgentAsksAgainOnceMusterAnswers: a service a local client asks for
// while muster is unreachable cannot be checked, so it is not followed;
// the agent asks again on its own and follows it once muster answers,
// without the client asking again.
func TestAgentAsksAgainOnceMusterAnswers(t *testing.T) {
	t.Parallel()
	w := newWeb(t, "a1")
	g := newGate(t, strings.TrimPrefix(w.URL, "http://"))
	g.paused.Store(true)
	cfg := w.agentConfig(g.URL(), t.TempDir())
	cfg.RetryUnchecked = 100 * time.Millisecond
	ag := startAgent(t, cfg, "127.0.0.1:0")
	if st, body := get(t, ag.httpURL+"/v1/resolve/web"); st != http.StatusServiceUnavailable || !strings.Contains(string(body), "not-ready") {
		t.Fatalf("web asked for with muster unreachable: %d %s; want 503 not-ready", st, body)
	}
	wait.For(t, 15*time.Second, "web's check failed and pending", func() bool { return slices.Equal(ag.a.Unchecked(), []string{"web"}) })
	if ag.a.Held("web") {
		t.Fatal("web followed without upstream's word")
	}
	g.paused.Store(false)
	wait.For(t, 20*time.Second, "web followed once muster answers", func() bool { return ag.a.Held("web") && ag.a.Ready() })
	if st, _ := get(t, ag.httpURL+"/v1/resolve/web"); st != http.StatusOK {
		t.Fatalf("web through the agent: %d", st)
	}
	if u := ag.a.Unchecked(); len(u) != 0 {
		t.Fatalf("still unchecked: %v", u)
	}
}
