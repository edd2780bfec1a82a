package resolver

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Client defaults.
const (
	DefaultBaseBackoff      = 250 * time.Millisecond
	DefaultMaxBackoff       = 30 * time.Second
	DefaultHeartbeatTimeout = 45 * time.Second
)

// maxFrameBytes bounds one SSE line; a longer one ends the stream.
const maxFrameBytes = 64 << 20

// Config configures a Client.
type Config struct {
	// URLs are muster servers' base URLs ("http://host:8080"); the client
	// rotates through them on every reconnect. At least one is required.
	URLs []string
	// Token returns the bearer token for each (re)subscription. Nil sends
	// no Authorization header.
	Token func(ctx context.Context) (string, error)
	// Services to hold; at least one.
	Services []string
	// Regions are peer regions to fall back to, in order of preference:
	// the client also holds each service's view in them, as
	// its own muster serves it from the peers' aggregate, and Pick uses
	// them only when its own region has no routable capacity for the
	// service (see WithRegions). A service that exists only in peer
	// regions resolves too. Empty: this region only.
	Regions []string
	// CacheDir holds the last-known-good view files (created if missing).
	// Empty keeps views in memory only.
	CacheDir string
	// Default is the documented fallback of ResolveOrDefault for a service
	// that has never had a routable endpoint in this process (nothing
	// cached, or only views with nothing routable). Nil means
	// ResolveOrDefault fails with ErrNoView (or ErrNoEndpoints when views
	// came but had nothing routable).
	Default func(service string) (Endpoint, error)
	// HTTPClient makes the watch requests; it must not set a Timeout
	// (streams are long-lived). Default: a fresh http.Client.
	HTTPClient *http.Client
	// RootCAs, when set, are the CAs the default HTTPClient trusts for an
	// https muster (ignored when HTTPClient is set). Nil: the system
	// roots.
	RootCAs *x509.CertPool
	// GetClientCertificate, when set, is the client certificate the
	// default HTTPClient presents to an https muster that asks for one
	// (mutual TLS; ignored when HTTPClient is set): called on each
	// handshake, so a certificate rotated on disk (a SPIFFE SVID lives
	// an hour) is taken on the next connection. With a certificate whose
	// SPIFFE ID muster maps to a workload, Token may be nil.
	GetClientCertificate func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	// Clock stamps receipt and ages. Default time.Now. Backoff sleeps and
	// the heartbeat timeout use real time.
	Clock func() time.Time
	// BaseBackoff and MaxBackoff shape the full-jitter exponential backoff
	// between subscriptions: sleep = Rand() * min(MaxBackoff,
	// BaseBackoff * 2^attempt). Defaults 250 ms and 30 s.
	BaseBackoff, MaxBackoff time.Duration
	// HeartbeatTimeout: a stream with no frame (heartbeats included) for
	// this long is dead. Default 45 s, three missed 15 s heartbeats.
	HeartbeatTimeout time.Duration
	// Logger receives reconnects and refused updates. Default: discarded.
	Logger *slog.Logger
	// Rand returns a number in [0,1) for backoff jitter. Default
	// math/rand/v2.Float64.
	Rand func() float64
	// Ejection is the local passive ejection policy fed by Record (zero
	// fields take the defaults: 5 consecutive failures, 30 s, at most
	// half the service while nothing else looks healthy).
	Ejection EjectionPolicy
	// ConfirmAfter is how long muster must stand by a smaller set the
	// shrink guard holds back before routing follows it (see Hold and
	// WithConfirmAfter). Zero or negative: DefaultConfirmAfter (60 s).
	ConfirmAfter time.Duration
	// ReportInterval is how often the outcomes given to Record go back to
	// muster as passive evidence (POST /v1/reports). Default 10 s;
	// negative turns reporting off (FlushReports still works).
	ReportInterval time.Duration
	// ViewKeys are the region's public keys (LoadViewKeys reads the PEM
	// files muster's MUSTER_AUDIT_PUBLIC_KEY_FILES names): with them the
	// client takes only views and deltas signed by one of them, keeps
	// its last-known-good view when sent anything else, and resubscribes
	// for a full view (see WithViewKeys). Nil: checksums only, as before.
	ViewKeys map[string]ed25519.PublicKey
	// ReportTimeout bounds one report request. Default 5 s.
	ReportTimeout time.Duration
	// MaxReportItems bounds the endpoints reported per flush; outcomes
	// beyond it are dropped and counted. Default 20,000.
	MaxReportItems int

	// sleep waits d or until ctx ends; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

// Client keeps a Cache current from a muster watch stream. Resolve and
// Pick read the Cache only; they never do I/O.
type Client struct {
	cfg    Config
	cache  *Cache
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	reconnects atomic.Uint64
	frames     atomic.Uint64
	connected  atomic.Bool
	synced     atomic.Bool
	syncs      atomic.Uint64
	rep        struct {
		next                                                      atomic.Uint64 // URL rotation
		batchesSent, batchesFailed, outcomesSent, outcomesDropped atomic.Uint64
		itemsRefused                                              atomic.Uint64
		batchesToOwner                                            atomic.Uint64
	}

	// routes is where each service's outcomes are evaluated, as last
	// learned (report.go); routesMu keeps to one learning at a time.
	routes   atomic.Pointer[evidenceRoutes]
	routesMu sync.Mutex

	mu        sync.Mutex
	lastErr   error
	lastErrAt time.Time
	updated   chan struct{} // closed and replaced on every applied update
}

// ClientStats describes a Client's subscription and its Cache.
type ClientStats struct {
	Cache Stats
	// Reconnects counts subscriptions after the first.
	Reconnects uint64
	// Frames counts SSE events received (heartbeats included).
	Frames uint64
	// Connected: a watch stream is open now.
	Connected bool
	// Synced: the cache holds a view of every configured service and the
	// open stream has caught up (the server's synced event): what the
	// cache holds is what muster had when the client subscribed. A synced
	// event alone is not a view: muster sends it only once the client
	// holds one, and a server that sent it earlier would still leave
	// Synced false until every service has a view. Syncs counts synced
	// events since New.
	Synced bool
	Syncs  uint64
	// Outcome reporting: batches sent and failed, outcomes (successes +
	// failures) delivered and dropped, and report items muster refused
	// (e.g. an instance it no longer knows).
	ReportBatchesSent, ReportBatchesFailed uint64
	OutcomesReported, OutcomesDropped      uint64
	ReportItemsRefused                     uint64
	// ReportBatchesToOwner counts the batches sent straight to the
	// replica that evaluates their services (with several URLs, as GET
	// /v1/evidence/routes names it); the others went to the URLs in turn.
	ReportBatchesToOwner uint64
	// LastError is the most recent reason a subscription failed or ended
	// (nil if none has); LastErrorAt is when, by Config.Clock.
	LastError   error
	LastErrorAt time.Time
}

// New starts a Client for cfg.Services: it builds the Cache (loading
// CacheDir's last-known-good files, so routing works before muster
// answers) and starts two goroutines: one subscribes to /v1/watch for all
// services, applies what arrives, and re-subscribes with backoff whenever
// the stream is lost; the other ends local ejections when their time is
// up and sends the outcomes given to Record back to muster every
// ReportInterval. They run until Close is called or ctx ends.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if len(cfg.URLs) == 0 {
		return nil, errors.New("resolver: Config.URLs is empty")
	}
	if len(cfg.Services) == 0 {
		return nil, errors.New("resolver: Config.Services is empty")
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
		if cfg.RootCAs != nil || cfg.GetClientCertificate != nil {
			t := http.DefaultTransport.(*http.Transport).Clone()
			t.TLSClientConfig = &tls.Config{RootCAs: cfg.RootCAs, GetClientCertificate: cfg.GetClientCertificate, MinVersion: tls.VersionTLS12}
			cfg.HTTPClient.Transport = t
		}
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.BaseBackoff <= 0 {
		cfg.BaseBackoff = DefaultBaseBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.sleep == nil {
		cfg.sleep = sleepCtx
	}
	if cfg.ReportInterval == 0 {
		cfg.ReportInterval = DefaultReportInterval
	}
	if cfg.ReportTimeout <= 0 {
		cfg.ReportTimeout = DefaultReportTimeout
	}
	if cfg.MaxReportItems <= 0 {
		cfg.MaxReportItems = DefaultMaxReportItems
	}
	opts := []Option{WithClock(cfg.Clock), WithEjection(cfg.Ejection), WithConfirmAfter(cfg.ConfirmAfter), WithEventHook(func(e Event) {
		if errors.Is(e.Err, ErrHoldFollowed) {
			cfg.Logger.Info("resolver: following a smaller set muster stood by", "service", e.Service, "version", e.Version, "msg", e.Err)
			return
		}
		cfg.Logger.Warn("resolver: update not taken as is", "service", e.Service, "version", e.Version, "err", e.Err)
	})}
	if cfg.CacheDir != "" {
		if err := os.MkdirAll(cfg.CacheDir, 0o700); err != nil {
			return nil, fmt.Errorf("resolver: cache dir: %w", err)
		}
		opts = append(opts, WithDir(cfg.CacheDir))
	}
	if len(cfg.Regions) > 0 {
		opts = append(opts, WithRegions(cfg.Regions...))
	}
	if len(cfg.ViewKeys) > 0 {
		opts = append(opts, WithViewKeys(cfg.ViewKeys))
	}
	cache, err := NewCache(cfg.Services, opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &Client{cfg: cfg, cache: cache, cancel: cancel, done: make(chan struct{}), updated: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() { c.run(ctx) })
	wg.Go(func() { c.background(ctx) })
	go func() { wg.Wait(); close(c.done) }()
	return c, nil
}

// Close stops the subscription and waits for its goroutine to end. The
// Cache stays readable.
func (c *Client) Close() error {
	c.once.Do(c.cancel)
	<-c.done
	return nil
}

// Cache returns the Cache the client keeps current.
func (c *Client) Cache() *Cache { return c.cache }

// Resolve is Cache.Resolve: no I/O.
func (c *Client) Resolve(service string) (Result, error) { return c.cache.Resolve(service) }

// Pick is Cache.Pick: no I/O.
func (c *Client) Pick(service string) (Endpoint, error) { return c.cache.Pick(service) }

// Record is Cache.Record: note a call's outcome for ejection and for the
// next outcome report. It never blocks.
func (c *Client) Record(service, instanceID string, success bool) {
	c.cache.Record(service, instanceID, success)
}

// Updated returns a channel closed at the next update routing records
// (an applied or guard-held view or delta) for any service, and when the
// background sweep follows a held update.
func (c *Client) Updated() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.updated
}

// ResolveOrDefault picks an endpoint of service from the cache. While
// the service is cold, with nothing cached (ErrNoView) or only views with
// nothing routable since New (ErrNoEndpoints, a service whose instances
// await readiness), it waits for an update until ctx ends (its deadline),
// then falls back to Config.Default, or fails with that error if there is
// none. It never blocks past ctx. Once the service has had a routable
// endpoint, ErrNoEndpoints (a decommissioned service, or a hold followed
// to nothing) is an answer, returned as is, not a reason to use the
// default.
func (c *Client) ResolveOrDefault(ctx context.Context, service string) (Endpoint, error) {
	var err error
	for {
		ch := c.Updated()
		var e Endpoint
		e, err = c.cache.Pick(service)
		cold := errors.Is(err, ErrNoView) || errors.Is(err, ErrNoEndpoints) && !c.cache.routedOnce(service)
		if !cold {
			return e, err
		}
		select {
		case <-ch:
			continue
		case <-ctx.Done():
		}
		break
	}
	if c.cfg.Default == nil {
		return Endpoint{}, fmt.Errorf("resolve %s: %w (no default configured)", service, err)
	}
	return c.cfg.Default(service)
}

// Stats returns the subscription's counters and the Cache's.
func (c *Client) Stats() ClientStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ClientStats{
		Cache: c.cache.Stats(), Reconnects: c.reconnects.Load(), Frames: c.frames.Load(),
		Connected: c.connected.Load(), Synced: c.synced.Load() && c.holdsAll(), Syncs: c.syncs.Load(),
		LastError: c.lastErr, LastErrorAt: c.lastErrAt,
		ReportBatchesSent: c.rep.batchesSent.Load(), ReportBatchesFailed: c.rep.batchesFailed.Load(),
		OutcomesReported: c.rep.outcomesSent.Load(), OutcomesDropped: c.rep.outcomesDropped.Load(),
		ReportItemsRefused:   c.rep.itemsRefused.Load(),
		ReportBatchesToOwner: c.rep.batchesToOwner.Load(),
	}
}

func (c *Client) setErr(err error) {
	c.mu.Lock()
	c.lastErr, c.lastErrAt = err, c.cfg.Clock()
	c.mu.Unlock()
}

func (c *Client) notify() {
	c.mu.Lock()
	close(c.updated)
	c.updated = make(chan struct{})
	c.mu.Unlock()
}

// holdsAll reports whether the cache holds a view of every service (with
// Regions: of every service, in its own region or one of the others).
func (c *Client) holdsAll() bool {
	for _, s := range c.cfg.Services {
		if _, err := c.cache.Resolve(s); err != nil && !c.holdsRemote(s) {
			return false
		}
	}
	return true
}

// holdsRemote reports whether the cache holds s's view in a peer region.
func (c *Client) holdsRemote(s string) bool {
	for _, r := range c.cfg.Regions {
		if _, err := c.cache.Resolve(RemoteSeries(s, r)); err == nil {
			return true
		}
	}
	return false
}

// since is the lowest version held across services, or 0 (ask for full
// views) when any service has none. With Regions it is 0: a region's
// versions say nothing of another's, and held names each series.
func (c *Client) since() uint64 {
	if len(c.cfg.Regions) > 0 {
		return 0
	}
	var low uint64
	for i, s := range c.cfg.Services {
		r, err := c.cache.Resolve(s)
		if err != nil {
			return 0
		}
		if i == 0 || r.Held < low {
			low = r.Held
		}
	}
	return low
}

// session is how one subscription ended.
type session struct {
	progress   bool          // at least one frame arrived
	full       bool          // the next subscription must ask for full views
	retryAfter time.Duration // the server asked for at least this wait
	// spread is the window a shutting-down server asked its subscribers
	// to spread their reconnections over (a drain's reconnect_within_ms).
	spread time.Duration
	err    error
}

func (c *Client) run(ctx context.Context) {
	attempt, next, full := 0, 0, false
	for {
		since := c.since()
		if full {
			since = 0
		}
		base := c.cfg.URLs[next%len(c.cfg.URLs)]
		s := c.subscribe(ctx, base, since, full)
		c.connected.Store(false)
		c.synced.Store(false)
		if ctx.Err() != nil {
			return
		}
		c.setErr(s.err)
		full = s.full
		if s.progress {
			attempt = 0
		}
		d := c.backoff(attempt)
		attempt++
		if s.retryAfter > d {
			d = s.retryAfter
		}
		// A draining server names a window; a random point in it (full
		// jitter), at most MaxBackoff, so its subscribers reach the other
		// replicas spread out rather than at once.
		if j := time.Duration(c.cfg.Rand() * float64(min(s.spread, c.cfg.MaxBackoff))); j > d {
			d = j
		}
		next++
		c.cfg.Logger.Info("resolver: watch ended; resubscribing", "url", base, "err", s.err, "wait", d, "full", full)
		if c.cfg.sleep(ctx, d) != nil {
			return
		}
		c.reconnects.Add(1)
	}
}

func (c *Client) backoff(attempt int) time.Duration {
	ceil := c.cfg.MaxBackoff
	if attempt < 62 {
		if d := c.cfg.BaseBackoff << attempt; d > 0 && d < ceil {
			ceil = d
		}
	}
	return time.Duration(c.cfg.Rand() * float64(ceil))
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var (
	errDeadStream = errors.New("resolver: no frame within the heartbeat timeout")
	errDrain      = errors.New("resolver: server asked clients to drain")
)

// subscribe runs one watch stream until it ends.
func (c *Client) subscribe(ctx context.Context, base string, since uint64, full bool) session {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	q := url.Values{"service": c.cfg.Services}
	if since != 0 {
		q.Set("since", strconv.FormatUint(since, 10))
	}
	if len(c.cfg.Regions) > 0 {
		q.Set("regions", strings.Join(c.cfg.Regions, ","))
	}
	if !full {
		// held names each service's exact version: versions
		// are unique in the region, so any replica resumes each service
		// from exactly the copy held, where since (for a server that
		// predates held) can only be the lowest across them. A peer
		// region's series carries that region's versions.
		for _, s := range c.cache.names {
			if r, err := c.cache.Resolve(s); err == nil {
				q.Add("held", s+":"+strconv.FormatUint(r.Held, 10))
			}
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/watch?"+q.Encode(), nil)
	if err != nil {
		return session{err: err}
	}
	req.Header.Set("Accept", "text/event-stream")
	if c.cfg.Token != nil {
		tok, err := c.cfg.Token(ctx)
		if err != nil {
			return session{err: fmt.Errorf("resolver: token: %w", err)}
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	// The watchdog cancels the request when no frame arrives in time.
	dog := time.AfterFunc(c.cfg.HeartbeatTimeout, func() { cancel(errDeadStream) })
	defer dog.Stop()
	res, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		if cause := context.Cause(ctx); cause == errDeadStream {
			err = cause
		}
		return session{err: err}
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 4<<10))
		return session{
			err:        fmt.Errorf("resolver: watch %s: %s: %s", base, res.Status, strings.TrimSpace(string(body))),
			retryAfter: retryAfter(res.Header.Get("Retry-After"), time.Now()),
		}
	}
	c.connected.Store(true)
	s := c.read(res.Body, dog)
	if cause := context.Cause(ctx); cause == errDeadStream {
		s.err = cause
	}
	return s
}

// read parses SSE events and applies them until the stream ends or an
// event requires a new subscription.
func (c *Client) read(body io.Reader, dog *time.Timer) (s session) {
	br := bufio.NewReaderSize(body, 64<<10)
	var kind, data string
	for {
		line, err := readLine(br)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			s.err = err
			return s
		}
		switch {
		case line == "":
			if kind == "" && data == "" {
				continue
			}
			dog.Reset(c.cfg.HeartbeatTimeout)
			c.frames.Add(1)
			s.progress = true
			if done := c.dispatch(kind, data, &s); done {
				return s
			}
			kind, data = "", ""
		case strings.HasPrefix(line, ":"): // comment
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				kind = value
			case "data":
				if data != "" {
					data += "\n"
				}
				data += value
			}
		}
	}
}

func readLine(br *bufio.Reader) (string, error) {
	var b []byte
	for {
		chunk, err := br.ReadSlice('\n')
		b = append(b, chunk...)
		if len(b) > maxFrameBytes {
			return "", fmt.Errorf("resolver: SSE line over %d bytes", maxFrameBytes)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return "", err
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
}

// dispatch applies one event; done reports that the stream must end.
func (c *Client) dispatch(kind, data string, s *session) (done bool) {
	var err error
	switch kind {
	case "heartbeat":
		return false
	case "synced":
		// The stream caught up; Stats reports Synced only while the cache
		// also holds a view of every service.
		c.synced.Store(true)
		c.syncs.Add(1)
		return false
	case "drain":
		s.err = errDrain
		var d struct {
			ReconnectWithinMS int64 `json:"reconnect_within_ms"`
		}
		if json.Unmarshal([]byte(data), &d) == nil && d.ReconnectWithinMS > 0 {
			s.spread = time.Duration(min(d.ReconnectWithinMS, int64(time.Hour/time.Millisecond))) * time.Millisecond
		}
		return true
	case "view":
		var v View
		if err = json.Unmarshal([]byte(data), &v); err != nil {
			s.err = fmt.Errorf("resolver: decode view: %w", err)
			return true
		}
		err = c.cache.ApplyView(v)
	case "delta":
		var d Delta
		if err = json.Unmarshal([]byte(data), &d); err != nil {
			s.err = fmt.Errorf("resolver: decode delta: %w", err)
			return true
		}
		err = c.cache.ApplyDelta(d)
	default:
		return false // unknown events are ignored, for forward compatibility
	}
	switch {
	case err == nil, errors.Is(err, ErrWouldEmpty), errors.Is(err, ErrShrinkCapped):
		c.notify()
	case errors.Is(err, ErrStale), errors.Is(err, ErrUnknownService):
	case errors.Is(err, ErrGap), errors.Is(err, ErrChecksum), errors.Is(err, ErrSignature):
		// The held view stays; a full view from the next subscription
		// replaces what could not be taken.
		s.err, s.full = err, true
		return true
	default:
		c.cfg.Logger.Warn("resolver: update refused", "err", err)
	}
	return false
}

// retryAfter parses a Retry-After header: seconds or an HTTP date.
func retryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	if n, err := strconv.Atoi(h); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
