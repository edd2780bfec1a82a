// Package apptest runs muster for tests, built by app exactly as muster
// serve builds it: real loopback HTTP, a fresh PostgreSQL database from
// dbtest, every component wired as in production, and token verification
// through the production OIDC path against muster's own dev issuer.
// Nothing is mocked.
//
// The workers are production's, started in production's order, but for
// those a test steps itself (Held; Options.Run starts some of them too):
// by default the database monitor, the authz copy and the evaluator run
// (its tick set to an hour, so tests call EvaluateNow), and the publisher
// (prepared), shift-backs, lease reaper, override sweeper, guard log and
// census wait to be stepped with their RunOnce.
package apptest

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/guardlog"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/notify"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/publisher"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/routingcontrol"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/testclock"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/webui"
	"github.com/musterhq/muster/internal/xds"
	"github.com/musterhq/muster/server"
)

// Clock is the stack's settable clock, shared by every component.
type Clock = testclock.Clock

// Stack is a running muster.
type Stack struct {
	// App is muster as app built it; the fields below are its components.
	App       *app.App
	URL       string
	Pool      *pgxpool.Pool
	Registry  *registry.Registry
	Evaluator *evaluator.Evaluator
	Issuer    *devissuer.Issuer
	Clock     *Clock
	Client    *http.Client
	Metrics   *prometheus.Registry
	Hub       *stream.Hub
	// Publisher is prepared (unless Options.NoStart) but not started
	// (unless Options.Run names it): tests step it with RunOnce, and
	// SaveOnce to save its views.
	Publisher *publisher.Publisher
	// Shifts is not started: tests step it with RunOnce.
	Shifts *shift.Service
	Policy *policy.Service
	Server *server.Server
	// Guards is the guard-trip history; it is not started: tests call
	// Flush after stepping the publisher.
	Guards *guardlog.Log
	// UI is the admin web UI when Options.UI is set.
	UI *webui.UI
	// Refusals summarises refused evidence into the audit log on the
	// stack's clock; it runs (1 s ticks), and tests may call RunOnce to
	// write what is due at once.
	Refusals *audit.RefusalSummaries
	// AuthFailures summarises authentication failures into the audit
	// log, like Refusals.
	AuthFailures *audit.RefusalSummaries
	// Authz is the in-memory copy of services and grants watch and resolve
	// authorise from; started, and loaded before New returns when the
	// database answers.
	Authz *registry.AuthzCache
	// Monitor watches the database (started), on a pool of its own.
	Monitor *db.Monitor
	// Reaper is the lease reaper; it is not started: tests step it with
	// RunOnce.
	Reaper *registry.Reaper
	// Issuer2 is the second dev issuer when Options.SecondIssuer is set.
	Issuer2 *devissuer.Issuer
	// DNS is the DNS zone when Options.DNS is set (started: it follows
	// the hub and answers on DNS.Addr()).
	DNS *dnszone.Server
	// XDS and XDSAddr are the xDS server and its address when
	// Options.XDS is set.
	XDS     *xds.Server
	XDSAddr string
	// XDSRefusals summarises xDS refusals for a limit into the audit
	// log, like Refusals (Options.XDS).
	XDSRefusals *audit.RefusalSummaries
	// Reconcile is the reconciler when Options.Reconcile has sources.
	Reconcile *reconcile.Reconciler

	jwksFetches atomic.Int64
	queries     queryCounter
	// credentials keeps the instance credential of each instance
	// registered through Do (id -> secret), as a client keeps its own.
	credentials sync.Map
}

// Credential is the instance credential the registration of id through
// Do returned; "" when there was none (an operator declared it, or it
// was not registered through Do).
func (s *Stack) Credential(id string) string {
	c, _ := s.credentials.Load(id)
	secret, _ := c.(string)
	return secret
}

// KnowCredentials makes the instances registered through other's Do
// known here with their credentials, as a client that registered through
// one replica and reports to another keeps its credential.
func (s *Stack) KnowCredentials(other *Stack) {
	other.credentials.Range(func(k, v any) bool {
		s.credentials.Store(k, v)
		return true
	})
}

// AsInstance is the header an instance registered through Do presents
// its credential in (registry.CredentialHeader); empty when it has none.
func (s *Stack) AsInstance(id string) http.Header {
	h := http.Header{}
	if c := s.Credential(id); c != "" {
		h.Set(registry.CredentialHeader, c)
	}
	return h
}

// keepCredential remembers the credential of an instance registered by
// POST /v1/services/{name}/instances.
func (s *Stack) keepCredential(method, path string, r Response) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if method != http.MethodPost || r.Status != http.StatusCreated || len(parts) != 4 || parts[0] != "v1" || parts[1] != "services" || parts[3] != "instances" {
		return
	}
	var reg registry.Registered
	if json.Unmarshal(r.Body, &reg) == nil && reg.Credential != "" {
		s.credentials.Store(reg.ID.String(), reg.Credential)
	}
}

// RequestQueries counts the queries run on the stack's pool on behalf of
// requests to path (made with the request's context) since the stack
// started. Zero for a stack on Options.Pool, which it does not trace.
func (s *Stack) RequestQueries(path string) int64 { return s.queries.count(path) }

// queryCounter is a pgx tracer counting queries by the path of the request
// whose context they run with.
type queryCounter struct {
	mu     sync.Mutex
	byPath map[string]int64
}

type requestPathKey struct{}

// handler marks each request's context with its path, for the tracer.
func (q *queryCounter) handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestPathKey{}, r.URL.Path)))
	})
}

// TraceQueryStart implements pgx.QueryTracer.
func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if path, ok := ctx.Value(requestPathKey{}).(string); ok {
		q.mu.Lock()
		if q.byPath == nil {
			q.byPath = map[string]int64{}
		}
		q.byPath[path]++
		q.mu.Unlock()
	}
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (q *queryCounter) count(path string) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.byPath[path]
}

// JWKSFetches counts the requests for the key sets of the stack's dev
// issuers, as their handlers saw them.
func (s *Stack) JWKSFetches() int64 { return s.jwksFetches.Load() }

// Options adjust a Stack.
type Options struct {
	// Pool replaces the fresh test database (to point at a dead one, say).
	Pool *pgxpool.Pool
	// Evaluator adjusts the evaluator's configuration before it starts.
	// By default its tick never fires on its own: tests call EvaluateNow.
	Evaluator func(*evaluator.Config)
	// NoStart leaves the evaluator stopped (and so never ready) and the
	// publisher unprepared (it publishes nothing until Prepare).
	NoStart bool
	// MaxBodyBytes is the server's body limit; 1 MiB by default.
	MaxBodyBytes int64
	// Shifts adjusts the shift-back configuration (steps, dwell, pending
	// alarm) before it is built.
	Shifts func(*shift.Config)
	// Policy adjusts the policy service's configuration (limits, expiry).
	Policy func(*policy.Config)
	// UI mounts the admin web UI at /ui, signing in through the dev
	// issuer (client "muster-ui") on the stack's clock.
	UI bool
	// UIConfig adjusts the UI's configuration (with UI).
	UIConfig func(*webui.Config)
	// DatabaseURL points the stack at this database instead of a fresh
	// one from dbtest (a private cluster the test stops or freezes, say).
	DatabaseURL string
	// DBTimeout is the server's per-request database budget. When zero
	// it is the server's default (1.5 s) for a stack on a database a
	// test may stop or freeze (Pool, DatabaseURL), and testDBTimeout on
	// a fresh database of the shared test cluster: that database is
	// never the outage under test, and on a loaded two-core machine
	// running every package's PostgreSQL at once one write can take
	// longer than the production budget.
	DBTimeout time.Duration
	// WatchHeartbeat is the idle watch stream's heartbeat period; the
	// server's default (15 s) when zero.
	WatchHeartbeat time.Duration
	// Limits are the server's per-identity and per-address limits; zero
	// fields take the defaults.
	Limits server.Limits
	// ClientCertificates is the server's (mutual TLS): requests whose
	// r.TLS carries a client certificate are authenticated by it.
	ClientCertificates server.ClientCertificates
	// Admission configures watch admission; zero fields take the
	// defaults.
	Admission stream.AdmissionConfig
	// SecondIssuer serves a second dev issuer at /dev/issuer2, trusted
	// after the first (so not the home issuer): Stack.Issuer2.
	SecondIssuer bool
	// Run names workers of Held to start as muster serve does, instead
	// of leaving them to the test.
	Run []string
	// DNS serves the DNS zone (Stack.DNS) with this configuration; its
	// Addr defaults to 127.0.0.1:0.
	DNS *dnszone.Config
	// XDS serves xDS on a loopback listener (Stack.XDSAddr), its streams
	// drained over 200 ms at teardown; XDSConfig adjusts its
	// configuration first.
	XDS       bool
	XDSConfig func(*xds.Config)
	// Reconcile configures reconciliation sources. Their
	// workers are held (Stack.Reconcile; tests call RunOnce) unless Run
	// names them ("reconcile <source>").
	Reconcile reconcile.Config
	// Replica names the stack's replica ("apptest" by default): two stacks
	// on one database (Options.Pool) are two replicas of one region, each
	// announcing its own URL to the other.
	Replica string
	// Notify runs the notifier (internal/notify) with this configuration
	// on the wall clock unless it sets one (Stack.App.Notifier).
	Notify *notify.Config
	// DatabaseClock counts leases on PostgreSQL's clock, as muster serve
	// does, instead of the stack's: the stack's clock then cannot move
	// them (a test of clock skew between replicas).
	DatabaseClock bool
	// ClockOffset sets the stack's clock this far from the wall clock
	// (a replica whose clock is skewed).
	ClockOffset time.Duration
	// Forward adjusts the configuration of the evidence forwarder
	// (internal/forward).
	Forward func(*forward.Config)
	// Relay adjusts the configuration of the relay from the peer
	// replicas (internal/relay): whom it follows, say.
	Relay func(*relay.Config)
	// Issuers are trusted after the dev issuers (a test issuer with a
	// claim mapping, say).
	Issuers []identity.IssuerConfig
	// Hold names further workers to hold (the ownership worker, say: its
	// rounds are then the test's RunOnce calls).
	Hold []string
	// Ownership adjusts the ownership manager's configuration (its clock,
	// say: one that stands still keeps every tenure this replica took
	// counted as its own, as a process frozen and woken would).
	Ownership func(*ownership.Config)
	// RoutingControl reads region routing controls with this
	// configuration (app.Config.RoutingControl).
	RoutingControl *routingcontrol.Config
	// Listener wraps the API listener as muster serve may (a PROXY
	// protocol listener, say: internal/proxied). The stack's own
	// requests, and its issuers' key fetches, come from 127.0.0.1.
	Listener func(net.Listener) (net.Listener, error)
	// PeerUpgrade runs the stack in upgrade mode
	// (MUSTER_PEER_TRUST=upgrade: app.Config.PeerUpgrade).
	PeerUpgrade bool
}

// SealKey is the region's signing key of every Stack in this test process
// (an in-memory Ed25519 key): what seals the overrides they put in force.
var SealKey = sync.OnceValue(func() *audit.KeyFileSigner {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	return audit.NewKeySigner(priv)
})

// Held lists the workers a Stack does not start by default: tests step
// them (RunOnce, SaveOnce, Flush) to stay deterministic.
var Held = []string{app.WorkerCensus, app.WorkerReaper, app.WorkerShifts, app.WorkerSweeper, app.WorkerGuards, app.WorkerPublisher, app.WorkerZoneHistory, app.WorkerProberHistory}

// owners is, per database, the app whose stack last took its shards.
var owners = struct {
	sync.Mutex
	m map[string]*app.App
}{m: map[string]*app.App{}}

// takeOver makes a the owner of every shard of pool's database: the stack
// that held them before stops its ownership worker (Stop releases them).
// The returned function forgets a (at the end of the test).
func takeOver(pool *pgxpool.Pool, a *app.App) (forget func()) {
	c := pool.Config().ConnConfig
	key := fmt.Sprintf("%s:%d/%s", c.Host, c.Port, c.Database)
	owners.Lock()
	prev := owners.m[key]
	owners.m[key] = a
	owners.Unlock()
	if prev != nil && prev != a {
		prev.Ownership.Stop()
	}
	return func() {
		owners.Lock()
		defer owners.Unlock()
		if owners.m[key] == a {
			delete(owners.m, key)
		}
	}
}

// testDBTimeout is the per-request database budget of a stack on a
// fresh test database (Options.DBTimeout says why it is not 1.5 s).
const testDBTimeout = 10 * time.Second

// New starts a Stack that is torn down when t ends.
func New(t testing.TB, opts Options) *Stack {
	t.Helper()
	st := &Stack{}
	pool, monPool := opts.Pool, opts.Pool
	if pool == nil {
		url := opts.DatabaseURL
		if url == "" {
			url = dbtest.URL(t)
			if opts.DBTimeout == 0 {
				opts.DBTimeout = testDBTimeout
			}
		}
		// The monitor pings on a connection of its own, as in muster serve.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		if pool, err = db.OpenPool(ctx, db.PoolConfig{URL: url, Tracer: &st.queries}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		if monPool, err = db.OpenPool(ctx, db.PoolConfig{URL: url, MaxConns: 1}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(monPool.Close)
	}
	clk := testclock.New(time.Now().UTC().Truncate(time.Microsecond))

	hs := httptest.NewUnstartedServer(nil)
	base := "http://" + hs.Listener.Addr().String()
	if opts.Listener != nil {
		ln, err := opts.Listener(hs.Listener)
		if err != nil {
			t.Fatal(err)
		}
		hs.Listener = ln
	}
	iss, err := devissuer.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := iss.SetURL(base + "/dev/issuer"); err != nil {
		t.Fatal(err)
	}
	issuers := []identity.IssuerConfig{{URL: iss.URL(), Audience: "muster"}}
	var iss2 *devissuer.Issuer
	if opts.SecondIssuer {
		if iss2, err = devissuer.LoadOrCreate(t.TempDir()); err != nil {
			t.Fatal(err)
		}
		if err := iss2.SetURL(base + "/dev/issuer2"); err != nil {
			t.Fatal(err)
		}
		issuers = append(issuers, identity.IssuerConfig{URL: iss2.URL(), Audience: "muster"})
	}
	issuers = append(issuers, opts.Issuers...)
	ver, err := identity.NewVerifier(issuers, &http.Client{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st.Issuer2 = iss2
	// The dev issuers' handlers, counting key set requests.
	issuerHandler := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/jwks" {
				st.jwksFetches.Add(1)
			}
			h.ServeHTTP(w, r)
		})
	}

	cfg := app.Config{
		Pool: pool, MonitorPool: monPool, Region: "local", Replica: cmp.Or(opts.Replica, "apptest"), Address: base, Now: clk.Now,
		// The evaluator's tick never fires on its own: tests call
		// EvaluateNow.
		Evaluator: evaluator.Config{Tick: time.Hour, RefreshEvery: time.Hour, FlushEvery: time.Minute},
		Admission: opts.Admission,
		Reconcile: opts.Reconcile,
		Notify:    opts.Notify,
		// A test's admission window may be long; the census (held) reads
		// it as its interval.
		Census: stream.CensusConfig{Horizon: max(15*time.Minute, opts.Admission.Window)},
		Server: server.Config{Authenticator: ver, DBTimeout: opts.DBTimeout,
			DevIssuer: issuerHandler(iss.Handler()), DevIssuerPath: "/dev/issuer", MaxBodyBytes: opts.MaxBodyBytes,
			WatchHeartbeat: opts.WatchHeartbeat, Limits: opts.Limits, ClientCertificates: opts.ClientCertificates},
	}
	// Leases are counted on the stack's clock, so tests move them with
	// it; DatabaseClock counts them on PostgreSQL's, as muster serve does.
	if !opts.DatabaseClock {
		cfg.Registry.LeaseClock = clk.Now
	}
	// A stack's clock stands still until a test moves it, hours at a
	// time: its distance from PostgreSQL's says nothing, and clock_skew
	// would come and go with the monitor's pings. Only a test of skew
	// (DatabaseClock or ClockOffset) measures it against the usual
	// threshold.
	if !opts.DatabaseClock && opts.ClockOffset == 0 {
		cfg.ClockSkewAlarm = 100 * 365 * 24 * time.Hour
	}
	if opts.ClockOffset != 0 {
		clk.Advance(opts.ClockOffset)
	}
	if opts.Evaluator != nil {
		opts.Evaluator(&cfg.Evaluator)
	}
	if opts.DNS != nil {
		dc := *opts.DNS
		dc.Addr = cmp.Or(dc.Addr, "127.0.0.1:0")
		cfg.DNS = &dc
	}
	// Overrides and shifts are sealed as in production, by one key for every
	// stack of the test process, so replicas trust each other's seals.
	cfg.Policy.Sealer = SealKey()
	if opts.Policy != nil {
		opts.Policy(&cfg.Policy)
	}
	if opts.Shifts != nil {
		opts.Shifts(&cfg.Shifts)
	}
	if opts.Forward != nil {
		opts.Forward(&cfg.Forward)
	}
	if opts.Relay != nil {
		opts.Relay(&cfg.Relay)
	}
	if opts.Ownership != nil {
		opts.Ownership(&cfg.Ownership)
	}
	cfg.PeerUpgrade = opts.PeerUpgrade
	if opts.RoutingControl != nil {
		rc := *opts.RoutingControl
		cfg.RoutingControl = &rc
	}
	if opts.XDS {
		cfg.XDS = &xds.Config{DrainWindow: 200 * time.Millisecond}
		if opts.XDSConfig != nil {
			opts.XDSConfig(cfg.XDS)
		}
	}
	if opts.UI {
		oc := webui.OIDCConfig{IssuerURL: iss.URL(), ClientID: "muster-ui", ClientSecret: "muster-ui-test-secret",
			RedirectURL: base + "/ui/auth/callback"}
		if err := iss.RegisterClient(devissuer.Client{ID: oc.ClientID, Secret: oc.ClientSecret, RedirectURIs: []string{oc.RedirectURL}}); err != nil {
			t.Fatal(err)
		}
		cfg.UI = &webui.Config{OIDC: oc, SessionCleanup: -1, HTTPClient: &http.Client{Timeout: 5 * time.Second}}
		if opts.UIConfig != nil {
			opts.UIConfig(cfg.UI)
		}
	}
	a, err := app.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := a.Server
	hs.Config.Handler = st.queries.handler(srv)
	if iss2 != nil {
		// Routed before the server, which mounts one dev issuer only.
		second := http.StripPrefix("/dev/issuer2", issuerHandler(iss2.Handler()))
		hs.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, "/dev/issuer2/") {
				second.ServeHTTP(w, r)
				return
			}
			st.queries.handler(srv).ServeHTTP(w, r)
		})
	}
	// Load the copy of services and grants before serving, so a test's
	// first watch is not refused for want of it; with the database down
	// the worker keeps trying.
	{
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = a.Authz.RunOnce(ctx)
		// Take the shards before serving, so a test's first reaper step
		// finds this replica the owner of every service. A
		// stack built on a database another stack of this test process
		// uses takes the shards over: the earlier one's ownership worker
		// stops and releases them, so the newest stack owns, reaps and
		// publishes every service, as a replica alone does. Tests of
		// several owners run processes (cmd/muster).
		release := takeOver(pool, a)
		t.Cleanup(release)
		_ = a.Ownership.RunOnce(ctx)
		cancel()
	}
	hold := slices.DeleteFunc(slices.Concat(Held, opts.Hold), func(n string) bool { return slices.Contains(opts.Run, n) })
	if len(opts.Reconcile.Sources) > 0 && !slices.Contains(opts.Run, app.WorkerReconcileDiff) {
		hold = append(hold, app.WorkerReconcileDiff)
	}
	for _, src := range opts.Reconcile.Sources {
		if name := app.WorkerReconcilePrefix + src.Name(); !slices.Contains(opts.Run, name) {
			hold = append(hold, name)
		}
	}
	if opts.NoStart {
		hold = append(hold, app.WorkerEvaluator)
	} else if !slices.Contains(opts.Run, app.WorkerPublisher) {
		if err := a.Publisher.Prepare(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Start(context.Background(), hold...); err != nil {
		t.Fatal(err)
	}
	// Torn down as muster serve shuts down: not ready, streams drained,
	// HTTP closed, workers stopped in order, the UI closed.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx, func(context.Context) error { hs.Close(); return nil })
	})
	a.SetReady(true)
	hs.Start()
	if a.XDS != nil {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = a.ServeXDS(ln) }()
		st.XDS, st.XDSAddr = a.XDS, ln.Addr().String()
	}
	st.App = a
	st.URL, st.Pool, st.Registry, st.Evaluator, st.Issuer, st.Clock, st.Client, st.Metrics = base, pool, a.Registry, a.Evaluator, iss, clk, hs.Client(), a.Metrics
	st.Hub, st.Publisher, st.Policy, st.Shifts, st.Server, st.Guards, st.UI = a.Hub, a.Publisher, a.Policy, a.Shifts, srv, a.Guards, a.UI
	st.Authz, st.Monitor, st.Reaper = a.Authz, a.Monitor, a.Reaper
	st.Refusals, st.AuthFailures, st.XDSRefusals = a.Refusals, a.AuthFailures, a.XDSRefusals
	st.DNS = a.DNS
	st.Reconcile = a.Reconcile
	// A started evaluator rebuilds its state first, and refuses reports
	// (503 not-ready) until it is done; a test's first request would race
	// it. Tests of that state use NoStart.
	if !slices.Contains(hold, app.WorkerEvaluator) {
		st.WaitReady(t)
	}
	return st
}

// Token2 mints a token from the second dev issuer (Options.SecondIssuer).
func (s *Stack) Token2(t testing.TB, req devissuer.TokenRequest) string {
	t.Helper()
	if s.Issuer2 == nil {
		t.Fatal("Token2 needs Options.SecondIssuer")
	}
	tok, err := s.Issuer2.Mint(req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Token mints a token from the stack's dev issuer.
func (s *Stack) Token(t testing.TB, req devissuer.TokenRequest) string {
	t.Helper()
	tok, err := s.Issuer.Mint(req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Prometheus is the identity tests scrape /metrics with: a tool.
var Prometheus = devissuer.TokenRequest{Kind: identity.KindTool, Subject: "prometheus"}

// Scrape reads /metrics as a scraper would, with a tool token.
func (s *Stack) Scrape(t testing.TB) []byte {
	t.Helper()
	r := s.Do(t, "GET", "/metrics", s.Token(t, Prometheus), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", r.Status, r.Body)
	}
	return r.Body
}

// Response is a read HTTP response.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Problem decodes a problem+json body, failing t if it is not one.
func (r Response) Problem(t testing.TB) server.Problem {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json; body %s", ct, r.Body)
	}
	var p server.Problem
	if err := json.Unmarshal(r.Body, &p); err != nil {
		t.Fatalf("problem body %s: %v", r.Body, err)
	}
	if p.Status != r.Status {
		t.Fatalf("problem status %d, response status %d", p.Status, r.Status)
	}
	return p
}

// Do sends a request with an optional token, content type and body.
func (s *Stack) Do(t testing.TB, method, path, token, contentType, body string) Response {
	t.Helper()
	return s.DoWith(t, method, path, token, contentType, body, nil)
}

// DoWith is Do with more request headers (AsInstance's, say).
func (s *Stack) DoWith(t testing.TB, method, path, token, contentType, body string, header http.Header) Response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	res, err := s.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := Response{Status: res.StatusCode, Header: res.Header, Body: b}
	s.keepCredential(method, path, out)
	return out
}

// JSON sends a JSON body.
func (s *Stack) JSON(t testing.TB, method, path, token, body string) Response {
	t.Helper()
	return s.Do(t, method, path, token, "application/json", body)
}

// Decode unmarshals a response body into a T.
func Decode[T any](t testing.TB, r Response) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("decode %s: %v", r.Body, err)
	}
	return v
}

// Common identities.
var (
	Admin    = devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
	Operator = devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "oscar", Team: "payments", Role: identity.RoleOperator}
	Viewer   = devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "vera", Team: "payments", Role: identity.RoleViewer}
	Web      = devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"}
	API      = devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "api"}
)

// Seed creates web (payments; probe, self, passive) and api (search; passive).
func (s *Stack) Seed(t testing.TB) {
	t.Helper()
	admin := s.Token(t, Admin)
	for _, b := range []struct{ name, body string }{
		{"web", `{"owner":"payments","capabilities":["probe","self","passive"]}`},
		{"api", `{"owner":"search","capabilities":["passive"]}`},
	} {
		if r := s.JSON(t, "PUT", "/v1/services/"+b.name, admin, b.body); r.Status != http.StatusCreated {
			t.Fatalf("create %s: %d %s", b.name, r.Status, r.Body)
		}
	}
}

// TakeOver makes this stack the owner of every service again, after a
// later stack on its database took them (see New): the other stack's
// ownership worker stops and releases them, and this one takes them. Its
// own worker stopped when it was taken over, so the tenure it takes is
// not renewed: it publishes on (a lapsed tenure does, ownership.Manager
// Publishes) but expires no lease once the local deadline has passed.
func (s *Stack) TakeOver(t testing.TB) {
	t.Helper()
	takeOver(s.Pool, s.App)
	if err := s.App.Ownership.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The publisher adopts the gain (a stepped one is not running its
	// adoption loop).
	if err := s.Publisher.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// WaitReady waits (20 s at most) until the evaluator has rebuilt its
// state after the start: until then reports are refused 503 not-ready.
func (s *Stack) WaitReady(t testing.TB) {
	t.Helper()
	wait.For(t, 20*time.Second, "the evaluator ready after its rebuild", s.Evaluator.Ready)
}

// SyncNow brings the stack's copies of the database up to date now, as
// their workers would on their next refresh (an hour away in tests): the
// evaluator's registry state and the overrides in force (another replica
// on the same database wrote them, say).
func (s *Stack) SyncNow(t testing.TB) {
	t.Helper()
	if err := s.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.App.InForce.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// Admit brings instances of web (a service with a readiness signal, whose
// new instances await their first success and are not capacity until
// then) into rotation the way a workload does: one self-reported success
// each, sent as web's workload identity, then one evaluation. The
// evaluator is synced first so it knows instances registered a moment
// ago.
func (s *Stack) Admit(t testing.TB, ids ...string) {
	t.Helper()
	s.WaitReady(t)
	if err := s.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatalf("admit: sync the evaluator: %v", err)
	}
	// A self-report speaks for the instance that sends it: the token
	// vouches for the instances' addresses, as an instance's own would,
	// and an instance with a credential presents it, in a batch of its
	// own (one credential a request).
	var items, addrs []string
	admin := identity.Principal{Kind: identity.KindOperator, Subject: "apptest", Role: identity.RoleAdmin}
	type own struct{ id, item string }
	var owns []own
	for _, id := range ids {
		in, err := s.Registry.GetInstance(t.Context(), admin, uuid.MustParse(id))
		if err != nil {
			t.Fatalf("admit: read instance %s: %v", id, err)
		}
		item := `{"instance_id":"` + id + `","class":"self","outcome":"success"}`
		addrs = append(addrs, in.Address)
		if s.Credential(id) != "" {
			owns = append(owns, own{id, item})
			continue
		}
		items = append(items, item)
	}
	tok := s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: addrs})
	post := func(items []string, n int, h http.Header) {
		t.Helper()
		r := s.DoWith(t, "POST", "/v1/reports", tok, "application/json", `{"reports":[`+strings.Join(items, ",")+`]}`, h)
		if r.Status != http.StatusOK || !strings.Contains(string(r.Body), fmt.Sprintf(`"accepted":%d`, n)) {
			t.Fatalf("admit %v: %d %s", ids, r.Status, r.Body)
		}
	}
	if len(items) > 0 {
		post(items, len(items), nil)
	}
	for _, o := range owns {
		post([]string{o.item}, 1, s.AsInstance(o.id))
	}
	s.Evaluator.EvaluateNow()
}

// Metric reads the counter or gauge name from the stack's registry: the
// first series whose label has value, 0 when there is none.
func (s *Stack) Metric(t testing.TB, name, label, value string) float64 {
	t.Helper()
	mfs, err := s.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// Pair starts two replicas, "a" and "b", on one database with their
// ownership rounds held and run until the shards are split between
// them; b trusts a's issuer, as the replicas of one region trust one, so
// a.Token works on both.
func Pair(t testing.TB) (a, b *Stack) {
	t.Helper()
	hold := []string{app.WorkerOwnership}
	a = New(t, Options{Replica: "a", Hold: hold})
	b = New(t, Options{Replica: "b", Pool: a.Pool, Hold: hold,
		Issuers: []identity.IssuerConfig{{URL: a.Issuer.URL(), Audience: "muster"}}})
	for _, s := range []*Stack{a, b, a, b, a, b} {
		if err := s.App.Ownership.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}
