package federation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/tlsreload"
	"github.com/musterhq/muster/internal/worker"
	"github.com/musterhq/muster/resolver"
)

// Defaults.
const (
	DefaultStaleAfter = 30 * time.Second
	DefaultDiscover   = 30 * time.Second
	DefaultTick       = 500 * time.Millisecond
	// DefaultMaxBackoff caps the wait between two subscriptions to a
	// peer: a heal is noticed within it.
	DefaultMaxBackoff = 5 * time.Second
	// DefaultRegressAfter is how long a peer must keep serving a version
	// below the one held before it is taken as a regression.
	DefaultRegressAfter = 30 * time.Second
	// DefaultRegressCheck is how often the peer's current versions are
	// read whole when nothing else prompts it (a reconnect does).
	DefaultRegressCheck = 5 * time.Minute
)

// ActionReconcile is the audit action of a partition heal;
// ActionRegressed records the services of a peer whose versions went
// backwards, taken all the same.
const (
	ActionReconcile = "region.reconcile"
	ActionRegressed = "region.regressed"
)

// Auditor writes audit rows (audit.Log).
type Auditor interface {
	Append(ctx context.Context, now time.Time, e audit.Entry) (audit.Event, error)
}

// Config configures a Federation.
type Config struct {
	// Region is this region's name; no peer may take it.
	Region string
	// Peers are the peer regions followed.
	Peers []PeerConfig
	// CacheDir, when set, holds each peer's last-known-good views in
	// CacheDir/<peer>, so a restart serves them before the peer answers.
	// Empty: memory only.
	CacheDir string
	// StaleAfter: a peer not reached for longer is stale (peer_stale);
	// 30 s.
	StaleAfter time.Duration
	// Discover is how often each peer's service list is read again; 30 s.
	Discover time.Duration
	// Tick is how often a follower reads its link's state; 500 ms.
	Tick time.Duration
	// BaseBackoff and MaxBackoff shape the watch client's reconnects:
	// 250 ms and 5 s.
	BaseBackoff, MaxBackoff time.Duration
	// Audit receives the reconciliation rows; nil writes none.
	Audit Auditor
	// Owns reports whether this replica owns a key (OwnershipKey of a
	// peer): only the owner writes a peer's reconciliation row. Nil: this
	// replica owns every key (it is alone).
	Owns func(key string) bool
	// HTTPTimeout bounds one service-list request, and one read of the
	// peer's current versions; 10 s.
	HTTPTimeout time.Duration
	// RegressAfter is how long the peer must keep a service's version
	// below the one held, over two reads of its current versions, before
	// this region takes it as a regression (a lagging replica of the
	// peer catches up well within it); DefaultRegressAfter. It also
	// bounds how often a peer can make one of its series regress.
	RegressAfter time.Duration
	// RegressCheck is how often the peer's current versions are read
	// whole besides after each reconnect; DefaultRegressCheck.
	RegressCheck time.Duration
	Logger       *slog.Logger
	// Registerer receives the metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Now is the clock of statuses, ages and the audit rows.
	Now func() time.Time
}

// OwnershipKey is what a peer region hashes onto the region's shards as:
// the replica owning that shard writes the peer's reconciliation rows.
// A service name cannot take this form (no colon).
func OwnershipKey(peer string) string { return "federation:" + peer }

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	if len(c.Peers) == 0 {
		return errNoPeers
	}
	seen := map[string]bool{}
	for _, p := range c.Peers {
		switch {
		case !ValidName(p.Name):
			return fmt.Errorf("federation: peer region name %q must be a DNS label", p.Name)
		case p.Name == c.Region:
			return fmt.Errorf("federation: peer region %q is this region", p.Name)
		case seen[p.Name]:
			return fmt.Errorf("federation: peer region %q configured twice", p.Name)
		case len(p.URLs) == 0:
			return fmt.Errorf("federation: peer region %q has no URL", p.Name)
		case p.TokenFile == "":
			return fmt.Errorf("federation: peer region %q has no token file", p.Name)
		}
		for _, raw := range p.URLs {
			u, err := url.Parse(raw)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("federation: peer region %q: %q is not an http(s) base URL", p.Name, raw)
			}
			if err := checkPlainHTTP(p.Name, u); err != nil {
				return fmt.Errorf("federation: peer region %q: %w", p.Name, err)
			}
		}
		seen[p.Name] = true
	}
	if c.StaleAfter < 0 || c.Discover < 0 || c.Tick < 0 || c.BaseBackoff < 0 || c.MaxBackoff < 0 || c.HTTPTimeout < 0 || c.RegressAfter < 0 || c.RegressCheck < 0 {
		return errors.New("federation: durations must not be negative")
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.Discover == 0 {
		c.Discover = DefaultDiscover
	}
	if c.Tick == 0 {
		c.Tick = DefaultTick
	}
	if c.BaseBackoff == 0 {
		c.BaseBackoff = resolver.DefaultBaseBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.HTTPTimeout == 0 {
		c.HTTPTimeout = 10 * time.Second
	}
	if c.RegressAfter == 0 {
		c.RegressAfter = DefaultRegressAfter
	}
	if c.RegressCheck == 0 {
		c.RegressCheck = DefaultRegressCheck
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Federation follows the peer regions: one Follower per peer, all
// writing one Aggregate.
type Federation struct {
	// Aggregate is what the followers keep; read it, never write it.
	Aggregate *Aggregate
	followers []*Follower
	metrics   metrics
}

// New builds the followers; each peer's CA bundle is read now, so a bad
// one fails the start.
func New(cfg Config) (*Federation, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	f := &Federation{Aggregate: NewAggregate(cfg.Peers, cfg.StaleAfter, cfg.Now), metrics: m}
	for _, p := range cfg.Peers {
		var transport http.RoundTripper
		if p.CAFile != "" {
			// Read again when the file changes (a rotated peer CA is taken
			// at the next connection); one that no longer loads keeps the
			// last good bundle.
			cas, err := tlsreload.NewClientCAs(tlsreload.ClientCAConfig{File: p.CAFile, Logger: cfg.Logger, Now: cfg.Now})
			if err != nil {
				return nil, fmt.Errorf("federation: peer %s CA bundle: %w", p.Name, err)
			}
			transport = peerTransport(cas.Pool)
		}
		if _, err := os.Stat(p.TokenFile); err != nil {
			return nil, fmt.Errorf("federation: peer %s token file: %w", p.Name, err)
		}
		fl := &Follower{cfg: cfg, peer: p, agg: f.Aggregate, metrics: m,
			log: cfg.Logger.With("worker", "federation", "peer", p.Name)}
		if cfg.CacheDir != "" {
			fl.cacheDir = filepath.Join(cfg.CacheDir, p.Name)
		}
		fl.httpClient = &http.Client{Timeout: cfg.HTTPTimeout}
		if transport != nil {
			fl.httpClient.Transport = transport
			// The watch stream is long-lived: the same transport, no
			// client timeout.
			fl.watchClient = &http.Client{Transport: transport}
		}
		f.followers = append(f.followers, fl)
	}
	return f, nil
}

// Followers returns one worker per peer region, in configuration order.
func (f *Federation) Followers() []*Follower { return slices.Clone(f.followers) }

// Follower follows one peer region: it lists the peer's services, keeps a
// resolver client subscribed to their views on the peer's watch API, and
// copies what the client holds into the aggregate. It only reads from
// the peer: GET requests, and no outcome reports.
type Follower struct {
	cfg        Config
	peer       PeerConfig
	cacheDir   string
	httpClient *http.Client
	// watchClient, when set (a peer CA), makes the watch requests.
	watchClient *http.Client
	agg         *Aggregate
	metrics     metrics
	log         *slog.Logger
	runner      worker.Runner

	// The rest belongs to the run goroutine.
	client       *resolver.Client
	services     []string
	nextDiscover time.Time
	frames       uint64
	reconnects   uint64 // of clients closed, so the count survives a new one
	// partitioned: the copy is not known to match the peer (stale, or
	// loaded from disk at start); the next sync replaces it whole and is
	// audited.
	partitioned bool
	// fromCache: the copy being healed was loaded from disk at start (no
	// partition was seen): a heal that changes nothing is not audited.
	fromCache   bool
	connectedAt time.Time
	pending     []pendingRow // reconciliation rows not yet written

	// grantsBusy: a pass reading the peer's grants is running (grantsWG).
	grantsBusy atomic.Bool
	grantsWG   sync.WaitGroup

	// Regressions (regress.go): a read of the peer's current versions
	// runs beside the loop (probeWG) and hands its views over on probed.
	probing   bool
	probeWG   sync.WaitGroup
	probed    chan []RemoteView
	nextProbe time.Time
	// probedReconnects is the reconnect count the last read followed.
	probedReconnects uint64
	// suspects are the services the peer served below the version held,
	// by when that was first read.
	suspects map[string]time.Time
	// savedRev is the series revision last written to disk.
	savedRev uint64

	mu        sync.Mutex
	lastToken string // to keep it out of errors
}

// Name is the worker's name: "federation <peer>".
func (f *Follower) Name() string { return "federation " + f.peer.Name }

// Start follows the peer until ctx ends or Stop is called.
func (f *Follower) Start(ctx context.Context) error { return f.runner.Start(ctx, f.run) }

// Stop stops following and waits. Safe to call twice or before Start.
func (f *Follower) Stop() { f.runner.Stop() }

func (f *Follower) run(ctx context.Context) {
	defer f.closeClient()
	defer f.grantsWG.Wait() // a grants pass in flight ends with ctx
	defer f.probeWG.Wait()  // as does a read of the peer's versions
	f.probed = make(chan []RemoteView, 1)
	f.loadSeries()
	// Views kept from an earlier run are served (stale-but-served) until
	// the peer answers; the first sync then replaces them, audited.
	if names := f.cachedServices(); len(names) > 0 {
		// The copy on disk is read here, not from the client: the
		// client may already hold the peer's newer views by the time it
		// is asked (it connects as soon as it is made), and the heal
		// must compare the peer's views with what this region held.
		held := f.loadCached(names)
		f.follow(ctx, names)
		var took []RemoteView
		for _, v := range held {
			if f.agg.put(v) {
				took = append(took, v)
			}
		}
		f.agg.emit(took)
		f.partitioned, f.fromCache = true, true
	}
	f.RunOnce(ctx)
	t := time.NewTicker(f.cfg.Tick)
	defer t.Stop()
	for {
		var updated <-chan struct{}
		if f.client != nil {
			updated = f.client.Updated()
		}
		// What the client applied before updated was read (while RunOnce
		// listed services or read grants) is taken now: Updated only
		// wakes for the next update.
		f.take()
		select {
		case <-ctx.Done():
			return
		case <-updated: // taken at the top of the loop
		case views := <-f.probed:
			f.judge(ctx, views, f.cfg.Now())
		case <-t.C:
			f.RunOnce(ctx)
			f.maybeProbe(ctx, f.cfg.Now())
		}
	}
}

// RunOnce re-reads the service list when it is due, notes the link's
// state, heals a partition once the peer's stream has caught up, writes a
// pending reconciliation row and updates the metrics.
func (f *Follower) RunOnce(ctx context.Context) {
	// Staleness is noted before anything here counts as contact: only
	// RunOnce moves the last contact, so a peer anyone saw stale (its
	// alarm raised) is one whose return is healed and audited.
	if f.agg.stale(f.peer.Name) && (!f.partitioned || f.fromCache) {
		// (a copy from disk whose peer went stale is a partition too)
		f.partitioned, f.fromCache = true, false
		f.log.Warn("peer region stale: cross-region answers for it are served from the copy held", "stale_after", f.cfg.StaleAfter)
	}
	now := f.cfg.Now()
	if !now.Before(f.nextDiscover) {
		f.nextDiscover = now.Add(f.cfg.Discover)
		f.discover(ctx)
	}
	f.observe(now)
	if len(f.pending) > 0 {
		f.writePending(ctx, now)
	}
	f.saveSeries()
	f.publishMetrics()
}

// observe reads the client's stats into the peer's status.
func (f *Follower) observe(now time.Time) {
	var st resolver.ClientStats
	if f.client != nil {
		st = f.client.Stats()
	}
	contact := st.Connected || st.Frames != f.frames
	f.frames = st.Frames
	if !st.Connected {
		f.connectedAt = time.Time{}
	} else if f.connectedAt.IsZero() {
		f.connectedAt = now
	}
	f.agg.update(f.peer.Name, func(ps *PeerStatus) {
		ps.Connected, ps.Synced = st.Connected, st.Synced
		ps.Reconnects = f.reconnects + st.Reconnects
		if contact {
			ps.LastContact = now
		}
		if st.LastError != nil && st.LastErrorAt.After(ps.LastErrorAt) {
			ps.LastError, ps.LastErrorAt = f.redact(st.LastError.Error()), st.LastErrorAt
		}
	})
	// A heal: the peer is reached again and its stream has caught up
	// (every service's view is the peer's current one, checksums
	// verified), or has been open for the stale threshold without (a
	// service with no view yet).
	if f.partitioned && st.Connected && (st.Synced || now.Sub(f.connectedAt) >= f.cfg.StaleAfter) {
		f.heal(now)
	}
	partitioned := f.partitioned
	f.agg.update(f.peer.Name, func(ps *PeerStatus) { ps.Partitioned = partitioned })
}

// take copies the client's views into the aggregate, each only when its
// version is newer than the one held. While a partition is not healed
// the copy is left as it was, so the heal compares the whole of it.
func (f *Follower) take() {
	if f.client == nil || f.partitioned {
		return
	}
	var took []RemoteView
	for _, v := range f.views() {
		if f.agg.put(v) {
			took = append(took, v)
		}
	}
	f.agg.emit(took)
}

// views are the client's current views of the services followed.
func (f *Follower) views() []RemoteView {
	var out []RemoteView
	for _, s := range f.services {
		r, err := f.client.Resolve(s)
		if err != nil {
			continue
		}
		out = append(out, RemoteView{Region: f.peer.Name, View: r.Snapshot.View(), ReceivedAt: r.Snapshot.ReceivedAt()})
	}
	return out
}

// heal replaces the peer's copy with the client's current views and
// queues the reconciliation's audit row (written by the owner only).
func (f *Follower) heal(now time.Time) {
	// A first contact (nothing held yet) is no reconciliation.
	held := len(f.agg.Services(f.peer.Name)) > 0
	views := f.views()
	rec := f.agg.replace(f.peer.Name, views)
	fromCache := f.fromCache
	f.partitioned, f.fromCache = false, false
	f.agg.emit(views)
	if !held {
		f.log.Info("peer region reached: following its current views", "services", len(f.services))
		return
	}
	if fromCache && rec.Changed+rec.Appeared+rec.Vanished == 0 {
		// A restart, not a partition: the copy on disk was current.
		f.log.Info("peer region reached after a start: the copy on disk was current", "services", rec.Unchanged)
		return
	}
	f.agg.update(f.peer.Name, func(ps *PeerStatus) { ps.Reconciliations++; ps.LastReconciliation = now })
	f.metrics.reconciliations.WithLabelValues(f.peer.Name).Inc()
	f.log.Info("peer region reached again: copy replaced from its current views", "summary", rec.Summary())
	if f.cfg.Audit == nil {
		return
	}
	f.pending = append(f.pending, pendingRow{since: now, entry: audit.Entry{
		ActorKind: "system", Actor: "system:federation", Action: ActionReconcile,
		TargetKind: "region", Target: f.peer.Name, Outcome: audit.Accepted,
		Reason: rec.Summary(), After: rec,
	}})
}

// pendingRow is a reconciliation row waiting to be written.
type pendingRow struct {
	since time.Time
	entry audit.Entry
}

// ownerWait is how long a reconciliation row waits for this replica to
// own its peer's key (at start, before the first shard leases are read)
// before it is left to the replica that owns it, which healed too.
const ownerWait = time.Minute

// writePending writes the queued reconciliation rows in order while this
// replica owns the peer's key, keeping them for the next tick when
// PostgreSQL does not take them.
func (f *Follower) writePending(ctx context.Context, now time.Time) {
	if f.cfg.Owns != nil && !f.cfg.Owns(OwnershipKey(f.peer.Name)) {
		f.pending = slices.DeleteFunc(f.pending, func(p pendingRow) bool {
			if now.Sub(p.since) < ownerWait {
				return false
			}
			f.log.Info("reconciliation row left to the replica owning the peer", "key", OwnershipKey(f.peer.Name), "summary", p.entry.Reason)
			return true
		})
		return
	}
	for len(f.pending) > 0 {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := f.cfg.Audit.Append(actx, f.cfg.Now(), f.pending[0].entry)
		cancel()
		if fence.IsNotOwner(err) {
			// Deposed since the check above: the owner, which healed
			// too, writes the row.
			f.log.Info("reconciliation row left to the replica owning the peer", "key", OwnershipKey(f.peer.Name), "summary", f.pending[0].entry.Reason)
			f.pending = f.pending[1:]
			continue
		}
		if err != nil {
			f.log.Warn("reconciliation audit row not written yet; retrying", "err", err)
			return
		}
		f.pending = f.pending[1:]
	}
}

// discover lists the peer's services and follows the set when it
// changed. A failed list leaves the set as it was.
func (f *Follower) discover(ctx context.Context) {
	names, err := f.listServices(ctx)
	if err != nil {
		now := f.cfg.Now()
		f.agg.update(f.peer.Name, func(ps *PeerStatus) { ps.LastError, ps.LastErrorAt = f.redact(err.Error()), now })
		f.log.Debug("listing the peer's services failed", "err", f.redact(err.Error()))
		return
	}
	now := f.cfg.Now()
	f.agg.update(f.peer.Name, func(ps *PeerStatus) { ps.LastContact = now })
	if !slices.Equal(names, f.services) {
		f.follow(ctx, names)
	}
	// The grants are read beside the loop, one pass at a time: a request
	// per service must not hold back taking the peer's views.
	if f.grantsBusy.CompareAndSwap(false, true) {
		f.grantsWG.Go(func() {
			defer f.grantsBusy.Store(false)
			f.readGrants(ctx, names)
		})
	}
}

// readGrants reads the peer's grants of each of its services: who the
// peer lets resolve them, which this region enforces for its callers. A
// grant that cannot be read keeps the callers last read (fail static: a
// peer whose database is away revokes nothing by it).
func (f *Follower) readGrants(ctx context.Context, names []string) {
	// One pass is bounded as one request is, so a slow peer's grants are
	// read again at a later discovery.
	ctx, cancel := context.WithTimeout(ctx, f.cfg.HTTPTimeout)
	defer cancel()
	got := make(map[string][]string, len(names))
	var failed error
	for _, name := range names {
		if ctx.Err() != nil {
			failed = ctx.Err()
			break // what was read is taken; the rest stand
		}
		callers, err := f.grantsOf(ctx, name)
		if err != nil {
			failed = err
			continue
		}
		got[name] = callers
	}
	f.agg.setGrants(f.peer.Name, got, names)
	if failed != nil {
		f.log.Debug("some of the peer's grants could not be read; the last read stand", "err", f.redact(failed.Error()))
	}
}

// grantsOf reads GET /v1/services/NAME/grants from the first of the
// peer's URLs that answers.
func (f *Follower) grantsOf(ctx context.Context, name string) ([]string, error) {
	var errs []error
	for _, base := range f.peer.URLs {
		var g struct {
			Callers []string `json:"callers"`
		}
		err := f.getJSON(ctx, base+"/v1/services/"+url.PathEscape(name)+"/grants", &g)
		if err == nil {
			return g.Callers, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// getJSON GETs u with the peer's token and decodes a 200 answer.
func (f *Follower) getJSON(ctx context.Context, u string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	tok, err := f.token(ctx)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", "application/json")
	res, err := f.httpClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 32<<20))
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", u, res.Status, strings.TrimSpace(string(body[:min(len(body), 512)])))
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("GET %s: decode: %w", u, err)
	}
	return nil
}

// follow replaces the client with one subscribed to names. The copies
// held stay: the aggregate keeps them, and the new client loads the
// last-known-good files of the services it shares with the old one.
func (f *Follower) follow(ctx context.Context, names []string) {
	f.closeClient()
	f.services, f.frames = names, 0
	f.agg.update(f.peer.Name, func(ps *PeerStatus) { ps.Services = slices.Clone(names) })
	f.metrics.services.WithLabelValues(f.peer.Name).Set(float64(len(names)))
	if len(names) == 0 {
		return
	}
	c, err := resolver.New(ctx, resolver.Config{
		URLs: f.peer.URLs, Token: f.token, Services: names, CacheDir: f.cacheDir, HTTPClient: f.watchClient,
		BaseBackoff: f.cfg.BaseBackoff, MaxBackoff: f.cfg.MaxBackoff,
		// Never a write to the peer: no outcome reports.
		ReportInterval: -1,
		// The aggregate holds what the peer published: the peer's own
		// guard already decided it. A shrink the client guard would hold
		// back is followed at once (a nanosecond's confirm time); the
		// guards belong to the callers that route on these views.
		ConfirmAfter: time.Nanosecond,
		Logger:       f.log,
	})
	if err != nil {
		f.log.Error("cannot follow the peer's services", "err", err)
		return
	}
	f.client = c
	f.log.Info("following the peer region's services", "services", len(names))
}

func (f *Follower) closeClient() {
	if f.client == nil {
		return
	}
	f.reconnects += f.client.Stats().Reconnects
	_ = f.client.Close()
	f.client = nil
}

// loadCached reads the copy on disk of each named service (a file that
// is missing or cannot be trusted is left out, as the client leaves it).
func (f *Follower) loadCached(names []string) []RemoteView {
	now := f.cfg.Now()
	var out []RemoteView
	for _, s := range names {
		v, err := resolver.LoadView(f.cacheDir, s)
		if err != nil {
			continue
		}
		out = append(out, RemoteView{Region: f.peer.Name, View: v, ReceivedAt: now})
	}
	return out
}

// cachedServices lists the services whose last-known-good views are in
// the peer's cache folder.
func (f *Follower) cachedServices() []string {
	if f.cacheDir == "" {
		return nil
	}
	entries, err := os.ReadDir(f.cacheDir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".view.json")
		if !ok {
			continue
		}
		if s, err := url.PathUnescape(name); err == nil && resolver.FileName(f.cacheDir, s) == filepath.Join(f.cacheDir, e.Name()) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// token reads the peer's token file; it is read on every request, so a
// rotated token is taken at the next.
func (f *Follower) token(context.Context) (string, error) {
	b, err := os.ReadFile(f.peer.TokenFile)
	if err != nil {
		return "", fmt.Errorf("peer %s token file: %w", f.peer.Name, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("peer %s token file %s is empty", f.peer.Name, f.peer.TokenFile)
	}
	f.mu.Lock()
	f.lastToken = tok
	f.mu.Unlock()
	return tok, nil
}

// redact keeps the token out of an error's text.
func (f *Follower) redact(s string) string {
	f.mu.Lock()
	tok := f.lastToken
	f.mu.Unlock()
	if tok != "" {
		s = strings.ReplaceAll(s, tok, "[token]")
	}
	return s
}

// maxServices bounds one peer's service list.
const maxServices = 100_000

// listServices reads GET /v1/services, page by page, from the first of
// the peer's URLs that answers.
func (f *Follower) listServices(ctx context.Context) ([]string, error) {
	var errs []error
	for _, base := range f.peer.URLs {
		names, err := f.listFrom(ctx, base)
		if err == nil {
			return names, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (f *Follower) listFrom(ctx context.Context, base string) ([]string, error) {
	var out []string
	cursor := ""
	for {
		q := url.Values{"limit": {"500"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Items []struct {
				Name string `json:"name"`
			} `json:"items"`
			NextCursor string `json:"next_cursor"`
		}
		if err := f.getJSON(ctx, base+"/v1/services?"+q.Encode(), &page); err != nil {
			return nil, fmt.Errorf("list services: %w", err)
		}
		for _, it := range page.Items {
			if it.Name != "" {
				out = append(out, it.Name)
			}
		}
		if page.NextCursor == "" || len(page.Items) == 0 {
			break
		}
		if len(out) > maxServices {
			return nil, fmt.Errorf("list services at %s: more than %d", base, maxServices)
		}
		cursor = page.NextCursor
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func (f *Follower) publishMetrics() {
	for _, st := range f.agg.Regions() {
		if st.Region != f.peer.Name {
			continue
		}
		name := st.Region
		f.metrics.connected.WithLabelValues(name).Set(b2f(st.Connected))
		f.metrics.stale.WithLabelValues(name).Set(b2f(st.Stale))
		f.metrics.lag.WithLabelValues(name).Set(st.AgeSeconds)
		if !st.LastContact.IsZero() {
			f.metrics.lastContact.WithLabelValues(name).Set(float64(st.LastContact.UnixMilli()) / 1000)
		}
		f.metrics.services.WithLabelValues(name).Set(float64(len(st.Services)))
		f.metrics.reconnects.WithLabelValues(name).Set(float64(st.Reconnects))
		f.metrics.regressed.WithLabelValues(name).Set(float64(len(st.Regressed)))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

type metrics struct {
	connected, stale, lag, lastContact, services, reconnects, regressed *prometheus.GaugeVec
	reconciliations, regressions                                        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	g := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"region"})
	}
	m := metrics{
		connected:   g("muster_federation_connected", "1 while a watch stream to the peer region is open."),
		stale:       g("muster_federation_stale", "1 while the peer region has not been reached for longer than the stale threshold (peer_stale)."),
		lag:         g("muster_federation_lag_seconds", "Seconds since the peer region last answered: how old the aggregate's copy of it may be."),
		lastContact: g("muster_federation_last_contact_timestamp_seconds", "Unix time the peer region last answered."),
		services:    g("muster_federation_services_followed", "Services of the peer region followed."),
		reconnects:  g("muster_federation_reconnects", "Watch subscriptions to the peer region after the first, since start."),
		regressed:   g("muster_federation_regressed_services", "Services of the peer region whose versions went backwards and have not passed those held before (peer_regressed)."),
		regressions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_federation_regressions_total", Help: "Views of the peer region taken although their versions were below those held (its database restored).",
		}, []string{"region"}),
		reconciliations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_federation_reconciliations_total", Help: "Partition heals: the peer region's copy replaced from its current views.",
		}, []string{"region"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.connected, m.stale, m.lag, m.lastContact, m.services, m.reconnects, m.reconciliations, m.regressed, m.regressions} {
			if err := reg.Register(c); err != nil {
				return metrics{}, err
			}
		}
	}
	return m, nil
}

// peerTransport verifies a peer's https certificate against the bundle
// pool returns at each handshake (the chain, and the host name or IP
// address the connection was made to), so a CA rotated on disk is
// trusted from the next connection on without a restart.
func peerTransport(pool func() *x509.CertPool) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		cfg := &tls.Config{
			MinVersion: tls.VersionTLS12,
			ServerName: host, // SNI for a name; not sent for an IP address
			// Verified in VerifyConnection, against the bundle as it is
			// now and the host dialled (name or IP address): a fixed
			// RootCAs would keep the bundle of the start.
			InsecureSkipVerify: true,
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					return errors.New("federation: the peer sent no certificate")
				}
				opts := x509.VerifyOptions{Roots: pool(), DNSName: host, Intermediates: x509.NewCertPool()}
				for _, c := range cs.PeerCertificates[1:] {
					opts.Intermediates.AddCert(c)
				}
				_, err := cs.PeerCertificates[0].Verify(opts)
				return err
			},
		}
		return (&tls.Dialer{Config: cfg}).DialContext(ctx, network, addr)
	}
	return t
}
