package relay

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/worker"
)

// Path is where a replica serves its peer stream.
const Path = "/v1/peer/updates"

// Peer is another replica of the region.
type Peer struct {
	ID string
	// Address is its base URL (http://host:port), as it registered it.
	Address string
}

// Config configures a Relay.
type Config struct {
	// Hub is where relayed updates go (Hub.Relay).
	Hub *stream.Hub
	// Signer signs the stream requests as this replica.
	Signer peer.Signer
	// Peers lists the live peers (this replica excluded); re-read every
	// Refresh.
	Peers func() []Peer
	// Client makes the requests; by default one with a 2 s dial and
	// response-header timeout and no overall timeout (a stream stays
	// open).
	Client *http.Client
	// TLS, when set, is the default Client's TLS configuration for peers
	// served over https (their CA bundle).
	TLS *tls.Config
	// Refresh is how often Peers is read: 1 s.
	Refresh time.Duration
	// Idle is how long a stream may go without a line before it is taken
	// for dead: 6 s (three heartbeats).
	Idle time.Duration
	// MinBackoff and MaxBackoff bound the jittered wait between attempts
	// to one peer: 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// MaxRecordBytes bounds one line: 64 MiB.
	MaxRecordBytes int
	Logger         *slog.Logger
	// Registerer receives the metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Now is the clock of Status and the lag: time.Now.
	Now func() time.Time
	// AlarmAfter is how long a live peer may go unfollowed (no stream
	// open) before AlarmRelayBehind is raised: 15 s. MaxLag is the relay
	// lag above which it is raised while connected: 10 s.
	AlarmAfter, MaxLag time.Duration

	// Reports, when set, is where this replica says which peers it hears
	// and reads what the others say (PostgreSQL): with it the relay
	// judges which services this replica can still serve as current
	// (current.go). Nil: every view held is served as current, as before.
	Reports Reports
	// Owned lists the shards this replica owns now, for its report.
	Owned func() []int
	// ShardOf is the shard of a service (false before the shard count is
	// known).
	ShardOf func(service string) (int, bool)
	// OnStale is told the services that have just become stale here
	// (after the hub has drained their watch subscribers), to drain the
	// surfaces the hub does not serve itself (xDS).
	OnStale func(services []string)
	// Stale is how long a peer may go unheard (no line, heartbeats
	// included) before its services may be judged stale here: 5 s, more
	// than the 4 s gap one missed heartbeat leaves.
	Stale time.Duration
	// Margin is how much more recently another replica must have heard a
	// peer than this one did for it to vouch that the peer is alive: 2.5
	// s, more than a heartbeat period (a peer that died went quiet for
	// everyone within one).
	Margin time.Duration
	// ReportFresh is how old a report may be and still count: 5 s.
	ReportFresh time.Duration

	// ViewKeys are the keys a relayed view's signature is believed from;
	// the Signer's key is always among them (verify.go).
	ViewKeys seal.Keys
	// AcceptUnsigned also takes unsigned views (checksums still checked):
	// a rolling upgrade from a release that signs none
	// (MUSTER_PEER_TRUST=upgrade). Off: an unsigned view is refused as
	// forged.
	AcceptUnsigned bool
	// Tenures, when set, is where a signed view's (shard, epoch) is looked
	// up (tenure.Book); nil: not checked (tests without a database).
	Tenures Tenures
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	switch {
	case c.Hub == nil:
		return errors.New("relay: Hub is required")
	case c.Peers == nil:
		return errors.New("relay: Peers is required")
	case c.Signer.ID == "" || c.Signer.Key == nil:
		return errors.New("relay: Signer needs this replica's id and the region's signing key")
	case c.Refresh < 0 || c.Idle < 0 || c.MinBackoff < 0 || c.MaxBackoff < 0 || c.MaxRecordBytes < 0:
		return errors.New("relay: durations and limits must not be negative")
	}
	c.ViewKeys = c.ViewKeys.With(c.Signer.Key)
	if c.Refresh == 0 {
		c.Refresh = time.Second
	}
	if c.Idle == 0 {
		c.Idle = 6 * time.Second
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.MaxBackoff < c.MinBackoff {
		return errors.New("relay: MaxBackoff must not be below MinBackoff")
	}
	if c.MaxRecordBytes == 0 {
		c.MaxRecordBytes = 64 << 20
	}
	if c.Client == nil {
		c.Client = &http.Client{Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
			ResponseHeaderTimeout: 2 * time.Second,
			MaxIdleConnsPerHost:   1,
			TLSClientConfig:       c.TLS,
			TLSHandshakeTimeout:   2 * time.Second,
		}}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.AlarmAfter <= 0 {
		c.AlarmAfter = 15 * time.Second
	}
	if c.MaxLag <= 0 {
		c.MaxLag = 10 * time.Second
	}
	if c.Stale <= 0 {
		c.Stale = 5 * time.Second
	}
	if c.Margin <= 0 {
		c.Margin = 2500 * time.Millisecond
	}
	if c.ReportFresh <= 0 {
		c.ReportFresh = 5 * time.Second
	}
	return nil
}

// Relay keeps a stream open to every live peer and hands what they
// publish to the hub.
type Relay struct {
	cfg     Config
	log     *slog.Logger
	metrics metrics
	runner  worker.Runner

	mu    sync.Mutex
	conns map[string]*conn // by peer id
	wg    sync.WaitGroup
	// synced is set once any peer's opening snapshot has arrived whole.
	synced atomic.Bool
	// judged is the last judgement of what is current here (current.go),
	// and lastJudge when the last round began; guarded by mu.
	judged judgement
	// maxTenureEpoch is the highest epoch a sealed tenure was seen under
	// (verify.go): a view of a shard without a tenure is believed only
	// under an epoch the region has issued.
	maxTenureEpoch atomic.Uint64
	// adopted: the hub has been told a judgement (adopt).
	adopted   bool
	lastJudge time.Time
	// refusals are the open relay_forged and view_outside_tenure alarms,
	// by kind, peer and address; guarded by mu.
	refusals map[string]*refusal

	// views holds the last verified view of each service (the base the
	// next delta is checked against).
	viewsMu sync.Mutex
	views   map[string]*assembler.View
}

// conn is the stream to one peer.
type conn struct {
	peer   Peer
	cancel context.CancelFunc
	// added is when this replica began following the peer (local clock).
	added time.Time

	// Guarded by Relay.mu.
	status PeerStatus
}

// PeerStatus is the relay from one peer, for GET /v1/replicas.
type PeerStatus struct {
	Peer    string `json:"peer"`
	Address string `json:"address"`
	// Connected: a stream is open now; Since is when it opened (or, while
	// disconnected, when the last one ended).
	Connected bool      `json:"connected"`
	Since     time.Time `json:"since,omitzero"`
	// LastRecordAt is when the last line (heartbeats included) arrived.
	LastRecordAt time.Time `json:"last_record_at,omitzero"`
	// LagSeconds is the last update's receive time minus its publication
	// time on the peer (the two clocks' skew included).
	LagSeconds float64 `json:"lag_seconds"`
	// Updates counts the snapshot and update records received.
	Updates uint64 `json:"updates"`
	// LastError is why the last stream ended or could not open.
	LastError string `json:"last_error,omitempty"`
	// Synced: the open stream has delivered its opening snapshot whole
	// (a heartbeat followed it).
	Synced bool `json:"synced"`
	// Heard: a line of the peer's stream arrived within Config.Stale (or
	// this replica began following it less than that ago).
	Heard bool `json:"heard"`
	// Stale: this replica does not hear the peer while the replicas in
	// HeardBy do, so it does not serve the peer's services as current:
	// StaleServices of them, whose subscribers were told to move.
	Stale         bool     `json:"stale"`
	HeardBy       []string `json:"heard_by,omitempty"`
	StaleServices int      `json:"stale_services"`
}

// New returns a Relay; Start runs it.
func New(cfg Config) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg, log: cfg.Logger.With("worker", "relay"), metrics: m, conns: map[string]*conn{},
		refusals: map[string]*refusal{}, views: map[string]*assembler.View{}}, nil
}

// Start runs the relay until ctx ends or Stop is called.
func (r *Relay) Start(ctx context.Context) error { return r.runner.Start(ctx, r.run) }

// Stop disconnects from every peer and waits for the streams to end.
// Safe to call twice or before Start.
func (r *Relay) Stop() { r.runner.Stop() }

func (r *Relay) run(ctx context.Context) {
	defer r.disconnectAll()
	if r.cfg.Reports != nil {
		defer func() {
			// A replica that stops says so, rather than leave a report
			// that it hears its peers for a few seconds more.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = r.cfg.Reports.Forget(fctx, r.cfg.Signer.ID)
		}()
	}
	r.RunOnce(ctx)
	worker.Every(ctx, r.cfg.Refresh, r.RunOnce)
}

// RunOnce reads the peer list and connects to the peers it names that
// have no stream, and disconnects from those it no longer names (or
// whose address changed); then, with Config.Reports, it judges which
// services this replica still serves as current.
func (r *Relay) RunOnce(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	want := map[string]Peer{}
	for _, p := range r.cfg.Peers() {
		if p.ID != "" && p.ID != r.cfg.Signer.ID && p.Address != "" {
			want[p.ID] = p
		}
	}
	r.connect(ctx, want)
	r.judge(ctx, want)
}

// connect opens a stream to each peer of want without one and ends those
// to peers no longer in it.
func (r *Relay) connect(ctx context.Context, want map[string]Peer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, c := range r.conns {
		if p, ok := want[id]; !ok || p.Address != c.peer.Address {
			r.log.Info("peer gone: disconnecting", "peer", id, "address", c.peer.Address)
			c.cancel()
			delete(r.conns, id)
			r.metrics.connected.DeleteLabelValues(id)
		}
	}
	for id, p := range want {
		if _, ok := r.conns[id]; ok {
			continue
		}
		cctx, cancel := context.WithCancel(ctx)
		now := r.cfg.Now()
		c := &conn{peer: p, cancel: cancel, added: now, status: PeerStatus{Peer: p.ID, Address: p.Address, Since: now, Heard: true}}
		r.conns[id] = c
		r.metrics.connected.WithLabelValues(id).Set(0)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.follow(cctx, c)
		}()
	}
}

func (r *Relay) disconnectAll() {
	r.mu.Lock()
	for id, c := range r.conns {
		c.cancel()
		delete(r.conns, id)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// Status lists the peers followed now, by id.
func (r *Relay) Status() []PeerStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]PeerStatus, 0, len(r.conns))
	for _, c := range r.conns {
		out = append(out, c.status)
	}
	slices.SortFunc(out, func(a, b PeerStatus) int { return strings.Compare(a.Peer, b.Peer) })
	return out
}

// AlarmRelayBehind is raised, per peer, while this replica does not
// follow a live peer's publications (no stream open for longer than
// Config.AlarmAfter, or a lag above Config.MaxLag): the views of the
// services that peer owns may differ here from the owner's, and
// subscribers of this replica may be behind.
const AlarmRelayBehind = "relay_behind"

// Alarms returns an AlarmRelayBehind for each peer this replica does not
// follow, or follows too far behind, and an AlarmRelayCutOff for each
// peer whose services it has stopped serving as current.
func (r *Relay) Alarms() []assembler.Alarm {
	now := r.cfg.Now()
	out := r.cutOffAlarms()
	r.mu.Lock()
	out = append(out, r.refusalAlarmsLocked(now)...)
	r.mu.Unlock()
	for _, st := range r.Status() {
		switch {
		case !st.Connected && now.Sub(st.Since) > r.cfg.AlarmAfter:
			why := "no stream has opened"
			if st.LastError != "" {
				why = "the last attempt: " + st.LastError
			}
			out = append(out, assembler.Alarm{Kind: AlarmRelayBehind, Since: st.Since, Detail: fmt.Sprintf(
				"this replica has not followed replica %s (%s) for %s (%s): views of the services it owns may be behind here; subscribers of this replica hold them as they were",
				st.Peer, st.Address, now.Sub(st.Since).Truncate(time.Second), why)})
		case st.Connected && st.LagSeconds > r.cfg.MaxLag.Seconds():
			out = append(out, assembler.Alarm{Kind: AlarmRelayBehind, Since: st.LastRecordAt, Detail: fmt.Sprintf(
				"replica %s's publications reach this replica %.1f s after it published them (more than %s, clock skew included)",
				st.Peer, st.LagSeconds, r.cfg.MaxLag)})
		}
	}
	return out
}

// follow keeps a stream open to one peer until ctx ends, waiting a
// jittered, growing backoff between attempts; a stream that delivered a
// record resets it.
func (r *Relay) follow(ctx context.Context, c *conn) {
	backoff := r.cfg.MinBackoff
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			r.metrics.reconnects.WithLabelValues(c.peer.ID).Inc()
		}
		got, err := r.stream(ctx, c)
		if ctx.Err() != nil {
			r.setConnected(c, false, nil)
			return
		}
		r.setConnected(c, false, err)
		if got {
			backoff = r.cfg.MinBackoff
		}
		r.log.Warn("peer stream ended", "peer", c.peer.ID, "address", c.peer.Address, "err", err)
		// Equal jitter: between half the backoff and all of it, so that
		// replicas restarted together do not reconnect in step.
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, r.cfg.MaxBackoff)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			r.setConnected(c, false, nil)
			return
		case <-t.C:
		}
	}
}

// errIdle ends a stream that went quiet for longer than Idle.
var errIdle = errors.New("no line from the peer within the idle limit")

// stream opens one stream to the peer and applies its records until it
// ends; got reports whether any record arrived.
func (r *Relay) stream(ctx context.Context, c *conn) (got bool, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(c.peer.Address, "/")+Path, nil)
	if err != nil {
		return false, fmt.Errorf("build the request: %w", err)
	}
	// Signed for this peer alone: another replica refuses the request.
	if err := r.cfg.Signer.Sign(ctx, req, c.peer.ID, nil); err != nil {
		return false, fmt.Errorf("sign the request: %w", err)
	}
	res, err := r.cfg.Client.Do(req)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 1024))
		return false, fmt.Errorf("the peer answered %s: %s", res.Status, strings.TrimSpace(string(body)))
	}
	r.setConnected(c, true, nil)
	// A stream without a line for Idle is dead: its request is cancelled,
	// which ends the read below.
	idle := time.AfterFunc(r.cfg.Idle, func() { cancel(errIdle) })
	defer idle.Stop()
	rd := bufio.NewReaderSize(res.Body, 64<<10)
	var line []byte
	for {
		line, err = readLine(rd, line[:0], r.cfg.MaxRecordBytes)
		if err != nil {
			if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
				err = cause
			}
			return got, fmt.Errorf("read: %w", err)
		}
		idle.Reset(r.cfg.Idle)
		rec, err := Decode(line)
		if err != nil {
			r.metrics.malformed.WithLabelValues(c.peer.ID).Inc()
			return got, err
		}
		got = true
		if rec.Kind != KindHeartbeat {
			if err := r.verify(ctx, c, &rec); err != nil {
				r.refuse(c, err)
				if errors.Is(err, ErrForged) {
					// Not a stream that delivered: the backoff grows, so
					// a peer that forges (or a release that signs
					// nothing, without the upgrade switch) is asked
					// again every 5 s, not every 100 ms.
					return false, err
				}
				continue
			}
		}
		r.apply(c, rec)
	}
}

// readLine reads one line (without its newline) into buf, refusing one
// longer than max.
func readLine(rd *bufio.Reader, buf []byte, max int) ([]byte, error) {
	for {
		frag, err := rd.ReadSlice('\n')
		if len(buf)+len(frag) > max+1 {
			return buf, fmt.Errorf("%w: a line longer than %d bytes", ErrMalformed, max)
		}
		buf = append(buf, frag...)
		switch {
		case err == nil:
			return buf[:len(buf)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(buf) > 0:
			return buf, io.ErrUnexpectedEOF
		default:
			return buf, err
		}
	}
}

// apply hands a record to the hub and notes it.
func (r *Relay) apply(c *conn, rec Record) {
	now := r.cfg.Now()
	if rec.Kind != KindHeartbeat {
		r.cfg.Hub.Relay([]stream.Update{rec.Update()})
		r.metrics.updates.WithLabelValues(c.peer.ID).Inc()
	}
	var lag float64
	if rec.Kind == KindUpdate {
		lag = now.Sub(rec.PublishedAt).Seconds()
		r.metrics.lag.Observe(max(lag, 0))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c.status.LastRecordAt = now
	switch rec.Kind {
	case KindUpdate:
		c.status.LagSeconds = lag
		c.status.Updates++
	case KindSnapshot:
		c.status.Updates++
	case KindHeartbeat:
		// The peer sends heartbeats only after its opening snapshot: the
		// hub now holds every view that peer held when the stream opened.
		if !c.status.Synced {
			c.status.Synced = true
			r.synced.Store(true)
		}
	}
}

// Synced reports whether a peer's opening snapshot has ever been taken
// whole since start: this replica's hub holds the views that peer held
// (a replica started while PostgreSQL is unreachable is ready
// from then on).
func (r *Relay) Synced() bool { return r.synced.Load() }

func (r *Relay) setConnected(c *conn, connected bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns[c.peer.ID] == c {
		v := 0.0
		if connected {
			v = 1
		}
		r.metrics.connected.WithLabelValues(c.peer.ID).Set(v)
	}
	if c.status.Connected != connected {
		c.status.Since = r.cfg.Now()
	}
	if !connected {
		c.status.Synced = false
	}
	c.status.Connected = connected
	if err != nil {
		c.status.LastError = err.Error()
	}
}

type metrics struct {
	cutOff       prometheus.Gauge
	stale        prometheus.Gauge
	staleDrained prometheus.Counter
	connected    *prometheus.GaugeVec
	updates      *prometheus.CounterVec
	reconnects   *prometheus.CounterVec
	malformed    *prometheus.CounterVec
	lag          prometheus.Histogram
	forged       *prometheus.CounterVec
	outside      *prometheus.CounterVec
	unsigned     *prometheus.CounterVec
	unchecked    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		cutOff: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_relay_cut_off", Help: "1 while this replica hears none of its live peers while another replica does (it reports not ready), else 0.",
		}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_relay_stale_services", Help: "Services this replica does not serve as current: it cannot hear their owner while another replica can.",
		}),
		staleDrained: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_relay_stale_drained_total", Help: "Watch subscriptions told to reconnect elsewhere because a service they follow stopped being current here.",
		}),
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "muster_relay_connected", Help: "1 while a peer stream to the replica is open, 0 while this replica is trying to open one.",
		}, []string{"peer"}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_relay_updates_total", Help: "Views (snapshot and update records) received from a peer replica and handed to the hub.",
		}, []string{"peer"}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_relay_reconnects_total", Help: "Attempts to reopen a peer stream after one ended or could not open.",
		}, []string{"peer"}),
		malformed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_relay_malformed_total", Help: "Peer streams ended for a malformed record.",
		}, []string{"peer"}),
		forged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_relay_forged_total", Help: "Peer records refused because their view is not signed by a trusted key over its contents, or their delta does not produce it (the stream is ended).",
		}, []string{"peer"}),
		outside: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_relay_outside_tenure_total", Help: "Signed peer views refused because their version epoch is not a sealed tenure of their shard held by their signer.",
		}, []string{"peer"}),
		unsigned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_relay_unsigned_total", Help: "Unsigned peer views taken during a rolling upgrade (MUSTER_PEER_TRUST=upgrade).",
		}, []string{"peer"}),
		unchecked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_relay_tenure_unchecked_total", Help: "Signed peer views taken on their signature alone: their tenure could not be read (PostgreSQL unreachable, or the shard count not yet known).",
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "muster_relay_lag_seconds", Help: "Receive time of a peer's update minus its publication time on the peer (clock skew included).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.connected, m.updates, m.reconnects, m.malformed, m.lag, m.cutOff, m.stale, m.staleDrained, m.forged, m.outside, m.unsigned, m.unchecked} {
			if err := reg.Register(c); err != nil {
				return metrics{}, err
			}
		}
	}
	return m, nil
}
