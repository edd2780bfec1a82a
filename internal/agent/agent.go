package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/worker"
	"github.com/musterhq/muster/resolver"
)

// Defaults.
const (
	// DefaultMaxServices bounds the service set local clients can grow.
	DefaultMaxServices = 256
	// RefusalMemory is how long a service upstream refused stays refused
	// locally before a local client's request asks upstream again.
	RefusalMemory = time.Minute
	// checkTimeout bounds one upstream check of a service asked for.
	checkTimeout = 10 * time.Second
)

// Principal is who every local stream is, to the xDS server the agent
// runs: the agent itself. What it may see is what upstream grants the
// agent's identity.
var Principal = identity.Principal{Kind: identity.KindWorkload, Service: "local", Subject: "muster-agent"}

// Config configures an Agent.
type Config struct {
	// Upstream are muster's base URLs (replicas, or the load balancer),
	// tried in turn on every reconnect.
	Upstream []string
	// Services are held from the start; local clients add more.
	Services []string
	// CacheDir keeps the last-known-good views (required: a restart with
	// muster down serves them at once).
	CacheDir string
	// Token returns the workload token for each upstream request (a
	// projected token file, re-read every time). Nil: the client
	// certificate is the identity.
	Token func(ctx context.Context) (string, error)
	// RootCAs verify an https upstream (nil: the system roots).
	RootCAs *x509.CertPool
	// GetClientCertificate presents the workload's SVID to an upstream
	// that asks for one; called on each handshake, so a rotated file is
	// taken on the next connection.
	GetClientCertificate func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	// HTTPClient, when set, makes every upstream request (tests); it
	// replaces RootCAs and GetClientCertificate.
	HTTPClient *http.Client
	// ViewKeys are the region's public keys: with them only signed views
	// are taken.
	ViewKeys map[string]ed25519.PublicKey
	// Region is this region's name (the locality.region of the local
	// endpoints in an xDS assignment that has peer regions' priorities).
	Region string
	// Regions are the peer regions to fall back to, in order of
	// preference, as the resolver's Config.Regions: each service's view
	// in them is followed too (as muster serves it from the peers'
	// aggregate) and served to local clients as its lower priorities
	// (xDS) or fallback (DNS). Empty: this region only.
	Regions []string
	// RetryUnchecked is how long after a failed check (upstream
	// unreachable) a service asked for is checked again: 5 s.
	RetryUnchecked time.Duration
	// MaxServices bounds the set: DefaultMaxServices.
	MaxServices int
	// BaseBackoff and MaxBackoff shape the upstream reconnection backoff
	// (the resolver's defaults when zero).
	BaseBackoff, MaxBackoff time.Duration
	Now                     func() time.Time
	Logger                  *slog.Logger
}

func (c *Config) validate() error {
	if len(c.Upstream) == 0 {
		return errors.New("agent: at least one upstream URL is required")
	}
	for _, u := range c.Upstream {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("agent: upstream %q is not an http(s) base URL", u)
		}
	}
	if c.CacheDir == "" {
		return errors.New("agent: a cache folder is required (the last-known-good views a restart serves)")
	}
	for _, s := range c.Services {
		if !validName(s) {
			return fmt.Errorf("agent: %q is not a service name", s)
		}
	}
	for i, r := range c.Regions {
		if r == "" || strings.ContainsAny(r, "@,/") || r == c.Region || slices.Contains(c.Regions[:i], r) {
			return fmt.Errorf("agent: regions %q: each a peer region's name, once, not this region (%q)", c.Regions, c.Region)
		}
	}
	if c.RetryUnchecked <= 0 {
		c.RetryUnchecked = DefaultRetryUnchecked
	}
	if c.MaxServices <= 0 {
		c.MaxServices = DefaultMaxServices
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
		if c.RootCAs != nil || c.GetClientCertificate != nil {
			t := http.DefaultTransport.(*http.Transport).Clone()
			t.TLSClientConfig = &tls.Config{RootCAs: c.RootCAs, GetClientCertificate: c.GetClientCertificate, MinVersion: tls.VersionTLS12}
			c.HTTPClient.Transport = t
		}
	}
	return nil
}

var labelRE = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`)

// validName is muster's rule for a service name (a DNS label).
func validName(s string) bool { return labelRE.MatchString(s) }

// Refusal is why a service is not served: upstream refused the agent's
// identity, or the service is unknown there.
type Refusal struct {
	Status int // upstream's HTTP status (403, 404, 400)
	Detail string
	At     time.Time
}

func (r Refusal) Error() string { return r.Detail }

// Agent follows muster for a service set and feeds a local hub.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	hub    *stream.Hub
	runner worker.Runner

	mu       sync.Mutex
	services []string // accepted: the client's set, sorted
	checking map[string]bool
	refused  map[string]Refusal
	// unchecked holds the services asked for that upstream could not be
	// asked about (unreachable), with when it failed: asked again every
	// Config.RetryUnchecked, since a local client that asked may not ask again.
	unchecked map[string]time.Time
	client    *resolver.Client
	swapped   chan struct{} // closed and replaced when client changes
	published map[string]uint64
	closed    bool
	checks    sync.WaitGroup
	// revoked is closed and replaced when services leave the set
	// because upstream stopped serving them (the xDS server's Authz).
	revoked     chan struct{}
	rechecking  bool
	lastRecheck time.Time
}

// New builds an Agent and starts its upstream client: what the cache
// folder holds is in the hub before New returns.
func New(ctx context.Context, cfg Config) (*Agent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// The set local clients grew before a restart is what the cache
	// folder holds: it is followed again from the start, so a restart
	// with muster down serves every view it served before.
	services := append(slices.Clone(cfg.Services), cachedServices(cfg.CacheDir)...)
	services = slices.Compact(slices.Sorted(slices.Values(services)))
	if len(services) > cfg.MaxServices {
		services = services[:cfg.MaxServices]
	}
	a := &Agent{
		cfg: cfg, log: cfg.Logger.With("component", "agent"),
		hub:      stream.NewHub(stream.Config{Now: cfg.Now, DrainSpread: -1}),
		services: services, checking: map[string]bool{}, refused: map[string]Refusal{}, unchecked: map[string]time.Time{},
		swapped: make(chan struct{}), published: map[string]uint64{}, revoked: make(chan struct{}),
	}
	if len(services) > 0 {
		c, err := a.newClient(ctx, services)
		if err != nil {
			return nil, err
		}
		a.client = c
		a.feed(c)
	}
	return a, nil
}

// Hub is the local hub the surfaces serve from.
func (a *Agent) Hub() *stream.Hub { return a.hub }

func (a *Agent) newClient(ctx context.Context, services []string) (*resolver.Client, error) {
	c, err := resolver.New(context.WithoutCancel(ctx), resolver.Config{
		URLs: a.cfg.Upstream, Token: a.cfg.Token, Services: services, Regions: a.cfg.Regions, CacheDir: a.cfg.CacheDir,
		HTTPClient: a.cfg.HTTPClient, ViewKeys: a.cfg.ViewKeys, Clock: a.cfg.Now,
		BaseBackoff: a.cfg.BaseBackoff, MaxBackoff: a.cfg.MaxBackoff,
		// The agent's clients make the calls; it has no outcomes to
		// report.
		ReportInterval: -1,
		Logger:         a.log,
	})
	if err != nil {
		return nil, fmt.Errorf("agent: start the upstream client for %v: %w", services, err)
	}
	return c, nil
}

// Start runs the feeder until Stop: every update the upstream client
// routes on goes to the hub.
func (a *Agent) Start(ctx context.Context) error { return a.runner.Start(ctx, a.run) }

// Stop stops the feeder, the checks and the upstream client. The hub is
// closed (local watch streams get a drain frame). Safe to call twice.
func (a *Agent) Stop() {
	a.runner.Stop()
	a.mu.Lock()
	c := a.client
	a.client, a.closed = nil, true
	a.mu.Unlock()
	a.checks.Wait()
	if c != nil {
		_ = c.Close()
	}
	a.hub.Close()
}

func (a *Agent) run(ctx context.Context) {
	// A held update is followed by the client's own sweep, which also
	// closes Updated; the tick re-reads the set in case a swap raced.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		a.mu.Lock()
		c, swapped := a.client, a.swapped
		a.mu.Unlock()
		var updated <-chan struct{}
		if c != nil {
			updated = c.Updated()
			a.feed(c)
		}
		select {
		case <-ctx.Done():
			return
		case <-updated:
		case <-swapped:
		case <-tick.C:
			a.recheck()
			a.retryUnchecked()
		}
	}
}

// feed publishes to the hub every service whose routed view is newer
// than the one it holds. The routed view is what the resolver routes on:
// while its shrink guard holds a larger set, that set.
//
// A peer region's series (SERVICE@REGION) carries that region's versions
// and goes to the hub as the federation follower hands muster's hub one.
func (a *Agent) feed(c *resolver.Client) {
	var local []stream.Update
	var remote []*stream.Frame
	for _, svc := range a.Services() {
		for _, series := range a.series(svc) {
			f := a.frame(c, series)
			switch {
			case f == nil:
			case series == svc:
				local = append(local, stream.Update{View: f})
			default:
				remote = append(remote, f)
			}
		}
	}
	if len(local) > 0 {
		a.hub.Publish(local)
	}
	if len(remote) > 0 {
		a.hub.PublishRemote(remote)
	}
}

// series names service's local series and its series in each peer
// region followed.
func (a *Agent) series(service string) []string {
	out := []string{service}
	for _, r := range a.cfg.Regions {
		out = append(out, resolver.RemoteSeries(service, r))
	}
	return out
}

// frame is series' routed view as a hub frame, when it is newer than the
// one the hub was given; nil otherwise.
func (a *Agent) frame(c *resolver.Client, series string) *stream.Frame {
	r, err := c.Resolve(series)
	if err != nil {
		return nil
	}
	a.mu.Lock()
	have := a.published[series]
	a.mu.Unlock()
	if r.Version() <= have {
		return nil
	}
	v := r.View()
	if _, region, ok := resolver.SplitSeries(series); ok {
		v.Region = region
	}
	b, err := json.Marshal(v)
	if err != nil {
		a.log.Error("agent: encode a view", "series", series, "err", err)
		return nil
	}
	a.mu.Lock()
	a.published[series] = r.Version()
	a.mu.Unlock()
	return &stream.Frame{Kind: stream.KindView, Service: series, Version: r.Version(), JSON: b}
}

// view is the hub's view of service: the local one, else the first peer
// region's (in order of preference) that the hub holds.
func (a *Agent) view(service string) (*stream.Frame, bool) {
	for _, series := range a.series(service) {
		if f, ok := a.hub.View(series); ok {
			return f, true
		}
	}
	return nil, false
}

// Services is the set followed upstream, sorted.
func (a *Agent) Services() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.services)
}

// Held reports whether service is in the set followed upstream.
func (a *Agent) Held(service string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := slices.BinarySearch(a.services, service)
	return ok
}

// Refused returns why service is not served, if upstream refused it
// within RefusalMemory.
func (a *Agent) Refused(service string) (Refusal, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.refused[service]
	if ok && a.cfg.Now().Sub(r.At) >= RefusalMemory {
		return Refusal{}, false
	}
	return r, ok
}

// ErrTooManyServices is Want's answer once the set is full.
var ErrTooManyServices = errors.New("agent: the service set is full")

// Want asks for service to be followed: nothing when it is already, is
// being checked, or was refused within RefusalMemory; otherwise upstream
// is asked, in the background, whether the agent may resolve it, and
// the set grows when it may. It never blocks on the network.
func (a *Agent) Want(service string) error {
	if !validName(service) {
		return fmt.Errorf("%q is not a service name", service)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := slices.BinarySearch(a.services, service); ok || a.checking[service] || a.closed {
		return nil
	}
	if r, ok := a.refused[service]; ok && a.cfg.Now().Sub(r.At) < RefusalMemory {
		return r
	}
	if len(a.refused) >= maxRefused {
		// Names local clients made up cost memory only until they are
		// forgotten.
		for name, r := range a.refused {
			if a.cfg.Now().Sub(r.At) >= RefusalMemory {
				delete(a.refused, name)
			}
		}
		if len(a.refused) >= maxRefused {
			return fmt.Errorf("%w: upstream refused %d names in the last %s; not asking about more", ErrTooManyServices, len(a.refused), RefusalMemory)
		}
	}
	delete(a.unchecked, service)
	if len(a.services)+len(a.checking) >= a.cfg.MaxServices {
		return fmt.Errorf("%w: it holds %d services and at most %d (--max-services)", ErrTooManyServices, len(a.services), a.cfg.MaxServices)
	}
	a.checking[service] = true
	a.checks.Go(func() { a.check(service) })
	return nil
}

// check asks upstream for service's view with the agent's identity and
// adds it to the set unless upstream refuses it.
func (a *Agent) check(service string) {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	refusal, ok, err := a.ask(ctx, service)
	a.mu.Lock()
	delete(a.checking, service)
	a.mu.Unlock()
	switch {
	case err != nil:
		// Upstream cannot say: nothing is added (a service it refuses
		// would end the watch stream of the whole set); it is asked
		// again in a while, and at the next request of a local client.
		a.mu.Lock()
		a.unchecked[service] = a.cfg.Now()
		a.mu.Unlock()
		a.log.Warn("agent: cannot check a service a local client asked for; not added yet", "service", service, "err", err)
	case !ok:
		a.mu.Lock()
		a.refused[service] = refusal
		a.mu.Unlock()
		a.log.Warn("agent: upstream refuses a service a local client asked for; it is not served", "service", service, "status", refusal.Status, "detail", refusal.Detail)
	default:
		a.add(service)
	}
}

// ask is GET /v1/resolve/SERVICE upstream, each URL in turn until one
// answers: ok when muster serves the service to the agent (200, or 503
// while its first view is not yet published).
func (a *Agent) ask(ctx context.Context, service string) (Refusal, bool, error) {
	var last error
	for _, base := range a.cfg.Upstream {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/resolve/"+url.PathEscape(service), nil)
		if err != nil {
			return Refusal{}, false, err
		}
		if a.cfg.Token != nil {
			tok, err := a.cfg.Token(ctx)
			if err != nil {
				return Refusal{}, false, fmt.Errorf("token: %w", err)
			}
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		res, err := a.cfg.HTTPClient.Do(req)
		if err != nil {
			last = err
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(res.Body, 4<<10))
		res.Body.Close()
		switch {
		case res.StatusCode == http.StatusOK:
			return Refusal{}, true, nil
		case res.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body), "not-ready"):
			return Refusal{}, true, nil
		case res.StatusCode == http.StatusForbidden, res.StatusCode == http.StatusNotFound, res.StatusCode == http.StatusBadRequest:
			var p struct {
				Detail string `json:"detail"`
			}
			_ = json.Unmarshal(body, &p)
			if p.Detail == "" {
				p.Detail = res.Status
			}
			return Refusal{Status: res.StatusCode, Detail: "upstream refuses " + service + ": " + p.Detail, At: a.cfg.Now()}, false, nil
		}
		last = fmt.Errorf("%s: %s", base, res.Status)
	}
	return Refusal{}, false, last
}

// add grows the set by service and replaces the upstream client with
// one holding the larger set. The old one is closed first, so only one
// writes the cache folder; the hub keeps serving what it holds while the
// new one connects (it starts from the same last-known-good files).
func (a *Agent) add(service string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	if _, ok := slices.BinarySearch(a.services, service); ok {
		return
	}
	next := slices.Clone(a.services)
	i, _ := slices.BinarySearch(next, service)
	next = slices.Insert(next, i, service)
	if a.client != nil {
		_ = a.client.Close()
		a.client = nil
	}
	c, err := a.newClient(context.Background(), next)
	if err != nil {
		a.log.Error("agent: grow the service set", "service", service, "err", err)
		// Keep following what was followed.
		if c, err = a.newClient(context.Background(), a.services); err == nil {
			a.client = c
		}
		return
	}
	a.services, a.client = next, c
	close(a.swapped)
	a.swapped = make(chan struct{})
	a.log.Info("agent: following a service a local client asked for", "service", service, "services", len(next))
}

// Ready reports whether every service followed has a view in the hub:
// fresh, held through an outage, or loaded from the cache folder.
func (a *Agent) Ready() bool {
	for _, s := range a.Services() {
		if _, ok := a.view(s); !ok {
			return false
		}
	}
	return true
}

// Status is the upstream client's state.
type Status struct {
	Connected  bool
	Synced     bool
	Reconnects uint64
	LastError  error
}

// Upstream returns the upstream client's state (zero before a first
// service).
func (a *Agent) Upstream() Status {
	a.mu.Lock()
	c := a.client
	a.mu.Unlock()
	if c == nil {
		return Status{}
	}
	st := c.Stats()
	return Status{Connected: st.Connected, Synced: st.Synced, Reconnects: st.Reconnects, LastError: st.LastError}
}

// Ages returns how old each held view's data is, by service.
func (a *Agent) Ages() map[string]time.Duration {
	now := a.cfg.Now()
	out := map[string]time.Duration{}
	a.mu.Lock()
	c := a.client
	a.mu.Unlock()
	if c == nil {
		return out
	}
	for _, s := range a.Services() {
		if r, err := c.Resolve(s); err == nil {
			out[s] = r.Snapshot.Age(now)
		}
	}
	return out
}

// cachedServices names the services whose last-known-good file is in
// dir (resolver.FileName).
func cachedServices(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".view.json")
		if ok && e.Type().IsRegular() && validName(name) {
			out = append(out, name)
		}
	}
	return out
}

// Unchecked names the services local clients asked for that upstream
// could not be asked about yet (unreachable), sorted.
func (a *Agent) Unchecked() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(maps.Keys(a.unchecked))
}

// retryUnchecked asks again about the services upstream could not be
// asked about, Config.RetryUnchecked after it failed.
func (a *Agent) retryUnchecked() {
	a.mu.Lock()
	var due []string
	for name, at := range a.unchecked {
		if a.cfg.Now().Sub(at) >= a.cfg.RetryUnchecked {
			due = append(due, name)
		}
	}
	a.mu.Unlock()
	for _, name := range due {
		_ = a.Want(name)
	}
}

// DefaultRetryUnchecked is Config.RetryUnchecked's default.
const DefaultRetryUnchecked = 5 * time.Second

// maxRefused bounds the refusals remembered.
const maxRefused = 4096

// recheckEvery spaces the checks of the whole set while upstream
// refuses the agent's watch.
const recheckEvery = 10 * time.Second

// refusedWatch reports whether err is muster refusing the watch itself
// (403: a grant withdrawn; 404: a service deleted), which no retry
// mends: the resolver's error carries the response status.
func refusedWatch(err error) bool {
	if err == nil {
		return false
	}
	m := err.Error()
	return strings.Contains(m, ": 403 ") || strings.Contains(m, ": 404 ")
}

// recheck: while upstream refuses the watch of the whole set (muster
// refuses a watch naming any service the caller may not resolve), every
// service followed is asked about in turn, and those upstream now
// refuses leave the set, so that the others are followed again.
func (a *Agent) recheck() {
	st := a.Upstream()
	if st.Connected || !refusedWatch(st.LastError) {
		return
	}
	a.mu.Lock()
	if a.closed || a.rechecking || a.cfg.Now().Sub(a.lastRecheck) < recheckEvery {
		a.mu.Unlock()
		return
	}
	a.rechecking, a.lastRecheck = true, a.cfg.Now()
	services := slices.Clone(a.services)
	a.checks.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.checks.Done()
		var gone []string
		refusals := map[string]Refusal{}
		for _, svc := range services {
			ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
			ref, ok, err := a.ask(ctx, svc)
			cancel()
			if err == nil && !ok {
				gone = append(gone, svc)
				refusals[svc] = ref
			}
		}
		a.drop(gone, refusals)
		a.mu.Lock()
		a.rechecking = false
		a.mu.Unlock()
	}()
}

// drop takes services upstream no longer serves the agent out of the
// set: they are refused locally (the xDS server is told at once), their
// last-known-good files are removed (a restart must not follow them
// again), and the others are followed by a new upstream client.
func (a *Agent) drop(gone []string, refusals map[string]Refusal) {
	if len(gone) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	next := slices.DeleteFunc(slices.Clone(a.services), func(s string) bool { return slices.Contains(gone, s) })
	for _, svc := range gone {
		a.refused[svc] = refusals[svc]
		for _, series := range a.series(svc) {
			delete(a.published, series)
			if err := os.Remove(resolver.FileName(a.cfg.CacheDir, series)); err != nil && !errors.Is(err, os.ErrNotExist) {
				a.log.Warn("agent: remove the last-known-good file of a service upstream refuses", "series", series, "err", err)
			}
		}
		a.log.Warn("agent: upstream no longer serves a service to the agent; it is no longer served", "service", svc, "detail", refusals[svc].Detail)
	}
	if a.client != nil {
		_ = a.client.Close()
		a.client = nil
	}
	a.services = next
	if len(next) > 0 {
		c, err := a.newClient(context.Background(), next)
		if err != nil {
			a.log.Error("agent: follow the services left", "err", err)
		} else {
			a.client = c
		}
	}
	close(a.revoked)
	a.revoked = make(chan struct{})
	close(a.swapped)
	a.swapped = make(chan struct{})
}

// Revoked is closed when services leave the set because upstream stopped
// serving them.
func (a *Agent) Revoked() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.revoked
}
