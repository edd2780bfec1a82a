package forward

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/worker"
)

// Peer is another live replica of the region.
type Peer struct {
	ID string
	// Address is its base URL ("http://10.0.0.7:8080"), as it announces
	// it in the replicas table.
	Address string
}

// Defaults.
const (
	DefaultQueueLimit   = 100_000
	DefaultBatchWait    = 50 * time.Millisecond
	DefaultRefreshPeers = time.Second
	DefaultMinBackoff   = 100 * time.Millisecond
	DefaultMaxBackoff   = 5 * time.Second
	DefaultFlushTimeout = 2 * time.Second
	DefaultTimeout      = 5 * time.Second
	DefaultReplay       = 30 * time.Second
	// DefaultRetryRefused is how many times an item a peer refused for a
	// reason a retry may fix is sent again.
	DefaultRetryRefused = 3
	// DefaultRetryAfter is the wait before the first of them; it doubles.
	DefaultRetryAfter = time.Second
	// DefaultRefusedAlarm is how long evidence_refused stays raised after
	// a peer's last refusal.
	DefaultRefusedAlarm = time.Minute
)

// Config configures a Forwarder.
type Config struct {
	// Signer signs every request as this replica with the region's key.
	Signer peer.Signer
	// Peers lists the other live replicas of the region (this one is
	// skipped if listed); read every RefreshPeers.
	Peers func() []Peer
	// Route, when set, says where evidence about a service goes: its
	// shard and the replicas that keep it (its owner, and the replica
	// offered it during a move; this one possibly among them:
	// ownership.Manager.EvidenceRoute). ok false,
	// or Route nil: every peer. ShardRoute answers the same for a shard
	// (read every RefreshPeers, to send a replica that becomes a
	// shard's destination that shard's recent evidence).
	Route      func(service string) (shard int, to []string, ok bool)
	ShardRoute func(shard int) (to []string, ok bool)
	// Local, when set, is handed the evidence accepted here within
	// Replay of a shard this replica becomes a destination of (it did
	// not keep it when it was accepted: evaluator.Config.Evaluates), so
	// it takes the shard with current windows. It must not block long.
	Local func(actor identity.Principal, reports []evaluator.Report)
	// Client sends the requests; one with DefaultTimeout when nil.
	Client *http.Client
	// TLS, when set, is the default Client's TLS configuration for peers
	// served over https (their CA bundle).
	TLS *tls.Config
	// QueueLimit bounds the items queued for one peer (DefaultQueueLimit);
	// beyond it the oldest are dropped and counted.
	QueueLimit int
	// BatchWait is how long a sender waits for more items before it sends
	// fewer than MaxBatch (DefaultBatchWait).
	BatchWait time.Duration
	// MaxBatch bounds the items of one request (evaluator.MaxBatch).
	MaxBatch     int
	RefreshPeers time.Duration
	// MinBackoff and MaxBackoff bound the wait between attempts to reach
	// a peer that failed.
	MinBackoff, MaxBackoff time.Duration
	// FlushTimeout bounds the last delivery attempt at Stop.
	FlushTimeout time.Duration
	// Replay is how far back a peer that joins (a replica that just
	// started, or came back) is sent the evidence accepted here
	// (DefaultReplay; negative: none). Its rebuild reads only the windows
	// the services' owners wrote, and those miss what arrived since their
	// last write and while ownership moved: without the replay an
	// instance seen healthy a moment ago would be Unknown there, and one
	// probe's hard failure cannot remove an Unknown instance (ADR-05).
	// A peer that drops out of the list and back may so count a report
	// twice, which weighs it a little more and never drains.
	Replay time.Duration
	// RefusedAlarmFor is how long AlarmForwardRefused stays raised after
	// a peer last refused forwarded evidence (DefaultRefusedAlarmFor).
	RefusedAlarmFor time.Duration
	// StripFor is how long a member a peer did not know is left out of
	// what it is sent (DefaultStripFor); then it is tried again, in case
	// the peer was upgraded meanwhile.
	StripFor time.Duration
	// RetryRefused is how many more times an item a peer refused for a
	// reason a retry may fix (evaluator.Retryable: its copy of an
	// assignment or grant lags this replica's, or it could not look the
	// instance up) is sent, RetryAfter apart, doubling
	// (DefaultRetryRefused, DefaultRetryAfter; negative: never).
	RetryRefused int
	RetryAfter   time.Duration
	// RefusedAlarm is how long evidence_refused stays raised after a
	// peer's last refusal (DefaultRefusedAlarm).
	RefusedAlarm time.Duration
	// JSON sends every peer JSON bodies instead of the compact form
	// (BinaryContentType), as the release before did.
	JSON       bool
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Now        func() time.Time
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	switch {
	case c.Signer.ID == "" || c.Signer.Key == nil:
		return errors.New("forward: Signer needs this replica's id and the region's signing key")
	case c.Peers == nil:
		return errors.New("forward: Peers is required")
	case c.QueueLimit < 0 || c.BatchWait < 0 || c.MaxBatch < 0 || c.RefreshPeers < 0 || c.MinBackoff < 0 || c.MaxBackoff < 0 || c.FlushTimeout < 0 ||
		c.RefusedAlarmFor < 0 || c.StripFor < 0:
		return errors.New("forward: limits and durations must not be negative")
	}
	if c.Client == nil {
		c.Client = &http.Client{Timeout: DefaultTimeout}
		if c.TLS != nil {
			t := http.DefaultTransport.(*http.Transport).Clone()
			t.TLSClientConfig = c.TLS
			c.Client.Transport = t
		}
	}
	if c.QueueLimit == 0 {
		c.QueueLimit = DefaultQueueLimit
	}
	if c.BatchWait == 0 {
		c.BatchWait = DefaultBatchWait
	}
	if c.MaxBatch == 0 || c.MaxBatch > evaluator.MaxBatch {
		c.MaxBatch = evaluator.MaxBatch
	}
	if c.RefreshPeers == 0 {
		c.RefreshPeers = DefaultRefreshPeers
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	c.MaxBackoff = max(c.MaxBackoff, c.MinBackoff)
	if c.FlushTimeout == 0 {
		c.FlushTimeout = DefaultFlushTimeout
	}
	if c.Replay == 0 {
		c.Replay = DefaultReplay
	}
	if c.RefusedAlarmFor == 0 {
		c.RefusedAlarmFor = DefaultRefusedAlarmFor
	}
	if c.StripFor == 0 {
		c.StripFor = DefaultStripFor
	}
	if c.RetryRefused == 0 {
		c.RetryRefused = DefaultRetryRefused
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.RefusedAlarm <= 0 {
		c.RefusedAlarm = DefaultRefusedAlarm
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Forwarder mirrors accepted evidence to the region's other replicas (see
// the package documentation). It is a worker: Start, Stop.
type Forwarder struct {
	cfg    Config
	log    *slog.Logger
	runner worker.Runner
	met    metrics

	// runMu serialises RunOnce.
	runMu sync.Mutex

	mu      sync.Mutex
	peers   map[string]*peerQueue
	running bool // between Start and the end of its loop
	// recent is what was offered within Config.Replay, for peers
	// that join (at most QueueLimit items, recentLen): the items of each
	// Offer, oldest first, kept as Offer made them rather than copied.
	recent    [][]item
	recentLen int
	// refusals are the peers' recent refusals, by peer id, for Alarms.
	refusals map[string]*refusals
	// routed is, by shard, the replicas its evidence went to at the last
	// RunOnce (Config.ShardRoute), to notice one that becomes a
	// destination.
	routed map[int][]string
	// drops are the current bursts of items dropped undelivered, by
	// peer id, for AlarmEvidenceDropped.
	drops map[string]*dropBurst
}

// dropBurst is a peer's items dropped undelivered since a moment.
type dropBurst struct {
	since, last time.Time
	items       int
}

// AlarmEvidenceDropped is raised, per peer, while accepted evidence
// meant for it was dropped undelivered (its queue's bound, or it stopped
// being live with nobody else to take its items) within
// Config.RefusedAlarm: that replica, possibly a service's owner or
// replica it is offered to, decides without it.
const AlarmEvidenceDropped = "evidence_dropped"

// drop counts n of p's items dropped undelivered. Called with f.mu held.
func (f *Forwarder) drop(p *peerQueue, n int) {
	if n <= 0 {
		return
	}
	p.dropped.Add(float64(n))
	now := f.cfg.Now()
	if f.drops == nil {
		f.drops = map[string]*dropBurst{}
	}
	b := f.drops[p.id]
	if b == nil || now.Sub(b.last) > f.cfg.RefusedAlarm {
		b = &dropBurst{since: now}
		f.drops[p.id] = b
		f.log.Warn("evidence dropped undelivered (evidence_dropped)", "peer", p.id, "items", n)
	}
	b.last = now
	b.items += n
}

// dropAlarms lists AlarmEvidenceDropped per peer with drops within
// Config.RefusedAlarm, and forgets the older bursts. Called with f.mu
// held.
func (f *Forwarder) dropAlarms(now time.Time) []assembler.Alarm {
	var out []assembler.Alarm
	for id, b := range f.drops {
		if now.Sub(b.last) > f.cfg.RefusedAlarm {
			delete(f.drops, id)
			continue
		}
		out = append(out, assembler.Alarm{Kind: AlarmEvidenceDropped, Since: b.since, Detail: fmt.Sprintf(
			"%d evidence items this replica accepted for replica %s were dropped undelivered since %s (its queue's bound of %d items, or it stopped being live with no other replica keeping their shards); its evaluator decides without them",
			b.items, id, b.since.UTC().Format(time.RFC3339), f.cfg.QueueLimit)})
	}
	return out
}

// offer is what the items of one Offer share: who sent them, when they
// were received, the reports themselves and the routes they took.
// Items point here rather than carrying copies: an item is copied into
// the replay buffer and into each destination's queue, then taken into
// a request, so at hundreds of thousands of samples a second its size
// and its pointers (every one a write barrier and a word for the
// collector to scan) are most of what forwarding costs.
type offer struct {
	actor   *Actor
	offered time.Time
	reports []evaluator.Report
	// tos are the distinct destination lists of the offer's items.
	tos [][]string
}

// item is one report waiting for one peer.
type item struct {
	o *offer
	// idx is its report's index in o.reports.
	idx int32
	// shard is the report's service's shard (-1: not routed); to, the
	// index in o.tos of the replicas it was routed to when offered (-1:
	// every peer).
	shard, to int32
	// hard: whether it reports a hard failure (sent before anything
	// else queued).
	hard bool
	// retries: times the peer refused it for a reason a retry may fix;
	// due: when it may be sent again (monotonic, since epoch).
	retries int32
	due     time.Duration
	// The report as the compact body carries it, copied while Offer
	// has it in cache so sending it does not reach back to o.reports:
	// flags (binary.go) and at, when compact; otherwise encoded from
	// the report.
	compact bool
	flags   byte
	id      uuid.UUID
	at      int64
}

// epoch is the origin of item.due: real time, whatever Config.Now says.
var epoch = time.Now()

// report is the item's report, stamped with the time it was received
// when it carried none.
func (it *item) report() evaluator.Report {
	r := it.o.reports[it.idx]
	if r.At == nil && !it.o.offered.IsZero() {
		r.At = &it.o.offered
	}
	return r
}

// dest is the replicas the item was routed to when offered (nil: every
// peer).
func (it *item) dest() []string {
	if it.to < 0 {
		return nil
	}
	return it.o.tos[it.to]
}

// newItems is one offer's items, unrouted.
func newItems(actor *Actor, reports []evaluator.Report, offered time.Time) []item {
	o := &offer{actor: actor, offered: offered, reports: reports}
	items := make([]item, len(reports))
	for i := range reports {
		r := &reports[i]
		it := item{o: o, idx: int32(i), shard: -1, to: -1, hard: r.Outcome == "hard_failure", id: r.InstanceID}
		class, knownClass := codeOf(classCodes, r.Class)
		outcome, knownOutcome := codeOf(outcomeCodes, r.Outcome)
		if knownClass && knownOutcome && r.Successes == nil && r.Failures == nil && r.Dependency == "" && (r.At != nil || !offered.IsZero()) {
			it.compact, it.flags = true, class|outcome<<2|flagAt
			if r.At != nil {
				it.at = r.At.UnixNano()
			} else {
				it.at = offered.UnixNano()
			}
		}
		items[i] = it
	}
	return items
}

// peerQueue is one peer's queue and its sender.
type peerQueue struct {
	id     string
	runner worker.Runner
	wake   chan struct{}

	// Guarded by Forwarder.mu.
	address string
	items   []item // items[head:] wait, oldest first
	head    int
	// urgent are hard failures waiting, sent before items.
	urgent    []item
	inflight  int // taken by the sender, not yet settled
	forgotten bool
	limits    peerLimits
	// retry holds the items refused for a reason a retry may fix, until
	// their due time (oldest first).
	retry []item
	// The current burst of refusals (evidence_refused): when it began,
	// the last refusal, and the items refused by reason since it began.
	burstSince, lastRefused time.Time
	burst                   map[string]int
	burstDetail             string

	forwarded, dropped prometheus.Counter
	// queued is its muster_evidence_forward_queue series, held rather
	// than looked up on every offer and take.
	queued prometheus.Gauge
	// jsonUntil: the peer refused a compact body (415); it is sent JSON
	// until then (wall clock).
	jsonUntil time.Time
}

// New builds a Forwarder; nothing runs until Start.
func New(cfg Config) (*Forwarder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Forwarder{cfg: cfg, log: cfg.Logger.With("worker", "evidence-forward"), peers: map[string]*peerQueue{}, refusals: map[string]*refusals{}}
	var err error
	if f.met, err = newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	return f, nil
}

// Offer queues reports, accepted from actor, for the replicas that keep
// their services' evidence (Config.Route; services[i] is reports[i]'s
// service, "" or a short slice: unknown, sent to every peer). It never
// blocks on the network: a full queue drops its oldest items instead.
// Reports with no time are stamped with now, when they were received.
// Hard failures go to a queue of their own, sent first. Offer keeps
// reports until they are sent: the caller must not change them.
func (f *Forwarder) Offer(actor identity.Principal, reports []evaluator.Report, services []string) {
	if len(reports) == 0 || len(reports) > math.MaxInt32 {
		return
	}
	a := ActorOf(actor)
	now := f.cfg.Now()
	items := newItems(&a, reports, now)
	if f.cfg.Route != nil {
		o := items[0].o
		var byShard map[int]int32
		for i := range items {
			if i >= len(services) || services[i] == "" {
				continue
			}
			shard, to, ok := f.cfg.Route(services[i])
			if !ok || shard < 0 || shard > math.MaxInt32 {
				continue
			}
			idx, seen := byShard[shard]
			if !seen {
				if byShard == nil {
					byShard = map[int]int32{}
				}
				idx = int32(len(o.tos))
				byShard[shard] = idx
				o.tos = append(o.tos, to)
			}
			items[i].shard = int32(shard)
			if o.tos[idx] != nil {
				items[i].to = idx
			}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cfg.Replay > 0 {
		f.recent = append(f.recent, items)
		f.recentLen += len(items)
		f.trimRecent(now)
	}
	for _, p := range f.peers {
		queued := false
		for i := range items {
			it := &items[i]
			if to := it.dest(); to != nil && !slices.Contains(to, p.id) {
				continue
			}
			f.enqueue(p, *it)
			queued = true
		}
		if !queued {
			continue
		}
		f.trim(p)
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// enqueue appends it to p's queue, a hard failure to its urgent one.
// Called with f.mu held; the caller trims.
func (f *Forwarder) enqueue(p *peerQueue, it item) {
	if it.hard {
		p.urgent = append(p.urgent, it)
		return
	}
	p.items = append(p.items, it)
}

// trimRecent forgets what was offered before Replay, and the oldest
// beyond QueueLimit. Called with f.mu held.
func (f *Forwarder) trimRecent(now time.Time) {
	cut := now.Add(-f.cfg.Replay)
	drop := 0
	for drop < len(f.recent) {
		c := f.recent[drop]
		if c[0].o.offered.Before(cut) {
			f.recentLen -= len(c)
			drop++
			continue
		}
		if over := f.recentLen - f.cfg.QueueLimit; over > 0 {
			n := min(over, len(c))
			f.recent[drop] = c[n:]
			f.recentLen -= n
			if n == len(c) {
				drop++
				continue
			}
		}
		break
	}
	if drop > 0 {
		clear(f.recent[:drop])
		f.recent = f.recent[drop:]
	}
}

// eachRecent calls fn with each item of the replay buffer, oldest first.
// Called with f.mu held.
func (f *Forwarder) eachRecent(fn func(it *item)) {
	for _, c := range f.recent {
		for i := range c {
			fn(&c[i])
		}
	}
}

// trim drops the oldest items beyond the limit. Called with f.mu held.
func (f *Forwarder) trim(p *peerQueue) {
	if over := len(p.urgent) - f.cfg.QueueLimit; over > 0 {
		clear(p.urgent[:over])
		p.urgent = p.urgent[over:]
		f.drop(p, over)
	}
	if over := len(p.items) - p.head - f.cfg.QueueLimit; over > 0 {
		clear(p.items[p.head : p.head+over])
		p.head += over
		f.drop(p, over)
	}
	if p.head > 0 && p.head >= len(p.items)/2 {
		p.items = append(p.items[:0], p.items[p.head:]...)
		clear(p.items[len(p.items):cap(p.items)])
		p.head = 0
	}
	p.queued.Set(float64(len(p.items) - p.head + len(p.urgent) + p.inflight))
}

// Start reads the peers and starts a sender for each; it re-reads them
// every RefreshPeers.
func (f *Forwarder) Start(ctx context.Context) error {
	f.mu.Lock()
	f.running = true
	f.mu.Unlock()
	return f.runner.Start(ctx, func(ctx context.Context) {
		f.RunOnce(ctx)
		worker.Every(ctx, f.cfg.RefreshPeers, f.RunOnce)
		f.stopAll()
	})
}

// Stop stops the senders, each after one last attempt (FlushTimeout) to
// deliver what it holds. Safe to call twice or before Start.
func (f *Forwarder) Stop() { f.runner.Stop() }

// RunOnce brings the senders in line with the peers now listed: a sender
// for each new one (sent what was offered within Config.Replay, then what
// is offered from now on), none for one no
// longer listed (its queue is dropped). A sender runs until its peer is
// forgotten or the Forwarder stops; before Start and after Stop, RunOnce
// does nothing.
func (f *Forwarder) RunOnce(ctx context.Context) {
	f.runMu.Lock()
	defer f.runMu.Unlock()
	listed := map[string]string{}
	for _, p := range f.cfg.Peers() {
		if p.ID != "" && p.ID != f.cfg.Signer.ID && p.Address != "" {
			listed[p.ID] = strings.TrimSuffix(p.Address, "/")
		}
	}
	var gone, added []*peerQueue
	// The shards whose destinations changed since the last run, and
	// where they go now.
	routes := map[int][]string{}
	if f.cfg.ShardRoute != nil {
		for shard := 0; ; shard++ {
			to, ok := f.cfg.ShardRoute(shard)
			if !ok {
				break
			}
			routes[shard] = to
		}
	}
	f.mu.Lock()
	if !f.running {
		f.mu.Unlock()
		return
	}
	for id, p := range f.peers {
		addr, ok := listed[id]
		if !ok {
			p.forgotten = true
			// What waited for it goes to the replicas now keeping its
			// shards that it was not sent to (a replica that stopped
			// heartbeating owns nothing: its shards go to every live
			// replica until one takes them); the rest is dropped.
			queued := append(append(p.urgent, p.items[p.head:]...), p.retry...)
			p.items, p.head, p.retry, p.urgent = nil, 0, nil, nil
			if n := len(queued) - f.reroute(queued, id, routes, f.replayFrom()); n > 0 {
				f.drop(p, n)
			}
			delete(f.peers, id)
			f.met.queue.DeleteLabelValues(id)
			gone = append(gone, p)
			continue
		}
		p.address = addr
	}
	if f.cfg.Replay > 0 {
		f.trimRecent(f.cfg.Now())
	}
	for id, addr := range listed {
		if _, ok := f.peers[id]; ok {
			continue
		}
		p := &peerQueue{id: id, address: addr, wake: make(chan struct{}, 1),
			forwarded: f.met.forwarded.WithLabelValues(id), dropped: f.met.dropped.WithLabelValues(id), queued: f.met.queue.WithLabelValues(id)}
		// A peer that joins is sent what arrived here within Replay
		// about the shards it keeps first (Config.Replay).
		if f.cfg.Replay > 0 {
			f.eachRecent(func(it *item) {
				if keeps(it, id, routes) {
					f.enqueue(p, *it)
				}
			})
			if len(p.items)+len(p.urgent) > 0 {
				p.wake <- struct{}{}
			}
		}
		f.met.queue.WithLabelValues(id).Set(float64(len(p.items) + len(p.urgent)))
		f.peers[id] = p
		added = append(added, p)
	}
	// A peer already listed that became a destination of a shard (an
	// offer to it) is sent that shard's recent
	// evidence, so it takes the shard with current windows.
	var local []item
	if f.cfg.Replay > 0 && f.routed != nil {
		for shard, to := range routes {
			for _, id := range to {
				if id == f.cfg.Signer.ID && f.cfg.Local != nil && !slices.Contains(f.routed[shard], id) {
					f.eachRecent(func(it *item) {
						if int(it.shard) == shard && !slices.Contains(it.dest(), id) {
							local = append(local, *it)
						}
					})
					continue
				}
				p, ok := f.peers[id]
				if !ok || slices.Contains(added, p) || slices.Contains(f.routed[shard], id) {
					continue
				}
				n := 0
				f.eachRecent(func(it *item) {
					if int(it.shard) == shard && !slices.Contains(it.dest(), id) {
						f.enqueue(p, *it)
						n++
					}
				})
				if n > 0 {
					f.trim(p)
					select {
					case p.wake <- struct{}{}:
					default:
					}
				}
			}
		}
	}
	if len(routes) > 0 {
		f.routed = routes
	}
	f.mu.Unlock()
	f.replayLocal(local)
	f.endBursts()
	for _, p := range gone {
		f.log.Info("peer no longer live; its queue is dropped", "peer", p.id)
		p.runner.Stop()
	}
	for _, p := range added {
		f.log.Info("forwarding evidence to peer", "peer", p.id, "address", listed[p.id])
		// Stopped by Stop or when forgotten, not by the end of ctx (a
		// caller's RunOnce may pass a short one).
		if err := p.runner.Start(context.WithoutCancel(ctx), func(ctx context.Context) { f.send(ctx, p) }); err != nil {
			f.log.Error("start a sender", "peer", p.id, "err", err)
		}
	}
}

// replayLocal hands Config.Local the items of shards this replica just
// became a destination of, one call per run of one actor.
func (f *Forwarder) replayLocal(items []item) {
	for len(items) > 0 {
		n := 1
		for n < len(items) && items[n].o.actor == items[0].o.actor {
			n++
		}
		actor, err := items[0].o.actor.Principal()
		if err == nil {
			reports := make([]evaluator.Report, n)
			for i := range items[:n] {
				reports[i] = items[i].report()
			}
			f.cfg.Local(actor, reports)
		}
		items = items[n:]
	}
}

// keeps says whether peer id should be sent it, by the routes read now:
// an item routed nowhere in particular goes to every peer.
func keeps(it *item, id string, routes map[int][]string) bool {
	if it.shard < 0 || it.to < 0 {
		return true
	}
	to, ok := routes[int(it.shard)]
	if !ok {
		return true
	}
	return slices.Contains(to, id)
}

// replayFrom is when the oldest item the replay buffer holds was
// offered (zero when it holds none). Called with f.mu held.
func (f *Forwarder) replayFrom() time.Time {
	if f.cfg.Replay <= 0 || len(f.recent) == 0 {
		return time.Time{}
	}
	return f.recent[0][0].o.offered
}

// reroute gives the items that waited for a peer gone (gone) to the
// peers listed that now keep their shards and were not sent them, and
// returns how many found at least one or are still in the replay buffer
// (from on: those reach the shards' new destinations with its replay,
// below, and are not sent twice). Called with f.mu held.
func (f *Forwarder) reroute(items []item, gone string, routes map[int][]string, from time.Time) int {
	placed := 0
	woken := map[*peerQueue]bool{}
	for _, it := range items {
		if it.shard < 0 || it.to < 0 {
			continue // it went to every peer already
		}
		if !from.IsZero() && !it.o.offered.Before(from) {
			placed++
			continue
		}
		to, ok := routes[int(it.shard)]
		if !ok {
			continue
		}
		sent := false
		for _, id := range to {
			p, ok := f.peers[id]
			if id == gone || !ok || p.forgotten || slices.Contains(it.dest(), id) {
				continue
			}
			f.enqueue(p, it)
			woken[p], sent = true, true
		}
		if sent {
			placed++
			f.met.rerouted.Add(1)
		}
	}
	for p := range woken {
		f.trim(p)
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return placed
}

// stopAll stops every sender (each flushes) and forgets the peers.
func (f *Forwarder) stopAll() {
	f.runMu.Lock()
	defer f.runMu.Unlock()
	f.mu.Lock()
	f.running = false
	ps := make([]*peerQueue, 0, len(f.peers))
	for _, p := range f.peers {
		ps = append(ps, p)
	}
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(p.runner.Stop)
	}
	wg.Wait()
	f.mu.Lock()
	clear(f.peers)
	f.mu.Unlock()
}

// Queued is how many items wait for peer id, those being sent and those
// waiting to be retried included.
func (f *Forwarder) Queued(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.peers[id]; ok {
		return len(p.items) - p.head + len(p.urgent) + p.inflight + len(p.retry)
	}
	return 0
}

// waiting is how many items wait in p's queue, not yet taken.
func (f *Forwarder) waiting(p *peerQueue) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(p.items) - p.head + len(p.urgent)
}

// hasUrgent says whether hard failures wait for p: they are sent at
// once, without waiting to coalesce.
func (f *Forwarder) hasUrgent(p *peerQueue) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(p.urgent) > 0
}

// send is peer p's sender loop: wait for items, coalesce, deliver,
// retry with backoff; at the end, one last attempt.
func (f *Forwarder) send(ctx context.Context, p *peerQueue) {
	defer f.flush(p)
	failures := 0
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		if d, ok := f.nextRetry(p); ok {
			retry.Reset(d)
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-retry.C:
		}
		retry.Stop()
		f.promote(p)
		if !f.coalesce(ctx, p) {
			return
		}
		for {
			batch := f.take(p, f.batchLimit(p))
			if len(batch) == 0 {
				break
			}
			n, err := f.deliver(ctx, p, batch)
			batch = batch[n:]
			// A refusal of the whole request: sent again when that can
			// help, else dropped and counted (refused.go).
			if rf := (*refusedError)(nil); errors.As(err, &rf) {
				batch, err = f.salvage(ctx, p, batch, rf)
				if err == nil {
					f.putBack(p, batch)
					continue
				}
			}
			if err == nil {
				f.settle(p)
				if failures > 0 {
					f.log.Info("peer reachable again", "peer", p.id, "failed_attempts", failures)
				}
				failures = 0
				continue
			}
			f.putBack(p, batch)
			failures++
			if failures == 1 {
				f.log.Warn("cannot forward evidence to peer; retrying with backoff", "peer", p.id, "err", err)
			}
			if !sleep(ctx, f.backoff(failures)) {
				return
			}
		}
	}
}

// coalesce waits up to BatchWait for a full batch. It reports false when
// ctx ended.
func (f *Forwarder) coalesce(ctx context.Context, p *peerQueue) bool {
	if f.waiting(p) >= f.cfg.MaxBatch || f.hasUrgent(p) {
		return true
	}
	t := time.NewTimer(f.cfg.BatchWait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-p.wake:
			if f.waiting(p) >= f.cfg.MaxBatch || f.hasUrgent(p) {
				return true
			}
		}
	}
}

// flush makes one last attempt to deliver p's queue, within FlushTimeout.
func (f *Forwarder) flush(p *peerQueue) {
	ctx, cancel := context.WithTimeout(context.Background(), f.cfg.FlushTimeout)
	defer cancel()
	// Retries not yet due go now, or are dropped with the rest.
	f.mu.Lock()
	if !p.forgotten && len(p.retry)+len(p.urgent) > 0 {
		p.items = append(append(p.urgent, p.retry...), p.items[p.head:]...)
		p.head, p.retry, p.urgent = 0, nil, nil
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if n := len(p.retry); n > 0 {
			f.drop(p, n)
			p.retry = nil
		}
	}()
	for {
		batch := f.take(p, f.batchLimit(p))
		if len(batch) == 0 {
			return
		}
		if n, err := f.deliver(ctx, p, batch); err != nil {
			f.putBack(p, batch[n:])
			f.log.Warn("evidence not forwarded at stop", "peer", p.id, "items", f.Queued(p.id), "err", err)
			return
		}
		f.settle(p)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// backoff is the wait after the nth failure in a row: doubling from
// MinBackoff to MaxBackoff, with jitter so peers that come back are not
// met by every replica at once.
func (f *Forwarder) backoff(n int) time.Duration {
	d := f.cfg.MinBackoff << min(n-1, 20)
	if d <= 0 || d > f.cfg.MaxBackoff {
		d = f.cfg.MaxBackoff
	}
	return d/2 + rand.N(d/2+1)
}

// take removes up to n of p's oldest items.
func (f *Forwarder) take(p *peerQueue, n int) []item {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p.forgotten {
		return nil
	}
	// Hard failures first: they never wait behind bulk successes.
	u := min(n, len(p.urgent))
	n = min(n-u, len(p.items)-p.head)
	if n+u == 0 {
		return nil
	}
	batch := make([]item, 0, u+n)
	batch = append(batch, p.urgent[:u]...)
	clear(p.urgent[:u])
	p.urgent = p.urgent[u:]
	if len(p.urgent) == 0 {
		p.urgent = nil
	}
	batch = append(batch, p.items[p.head:p.head+n]...)
	clear(p.items[p.head : p.head+n])
	p.head += n
	p.inflight = n + u
	f.trim(p)
	return batch
}

// settle ends the sender's hold on the batch it took: delivered, or
// dropped.
func (f *Forwarder) settle(p *peerQueue) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p.inflight = 0
	if !p.forgotten {
		f.trim(p)
	}
}

// putBack returns batch, undelivered, to the head of p's queue; what no
// longer fits under the limit (the oldest) is dropped.
func (f *Forwarder) putBack(p *peerQueue, batch []item) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p.inflight = 0
	if p.forgotten {
		// Its peer stopped being live while the batch was out.
		f.drop(p, len(batch)-f.reroute(batch, p.id, f.routed, f.replayFrom()))
		return
	}
	p.items = append(batch, p.items[p.head:]...)
	p.head = 0
	f.trim(p)
}

// errRefused: the peer answered that the request itself is wrong (400,
// 413, 415, 422), or it could not be made; a *refusedError says how
// (refused.go).
var errRefused = errors.New("refused by the peer")

// deliver sends batch to p, in halves when its body would be over
// MaxBodyBytes. It returns how many of the items (from the first) were
// delivered.
func (f *Forwarder) deliver(ctx context.Context, p *peerQueue, batch []item) (int, error) {
	compact := f.compactFor(p)
	var (
		body []byte
		err  error
	)
	if compact {
		body, err = encodeBinary(batch)
	} else {
		body, err = encode(batch)
		if stripped := f.strippedFor(p); err == nil && len(stripped) > 0 {
			body, err = strip(body, stripped)
		}
	}
	if err != nil {
		return 0, &refusedError{detail: "encode: " + err.Error()}
	}
	if len(body) > MaxBodyBytes && len(batch) > 1 {
		half := len(batch) / 2
		if n, err := f.deliver(ctx, p, batch[:half]); err != nil {
			return n, err
		}
		n, err := f.deliver(ctx, p, batch[half:])
		return half + n, err
	}
	f.mu.Lock()
	addr := p.address
	f.mu.Unlock()
	contentType := "application/json"
	if compact {
		contentType = BinaryContentType
	}
	res, err := f.post(ctx, p.id, addr, body, contentType)
	if rf := (*refusedError)(nil); compact && errors.As(err, &rf) && rf.status == http.StatusUnsupportedMediaType {
		// A peer of the release before: JSON, for StripFor.
		f.mu.Lock()
		p.jsonUntil = time.Now().Add(f.cfg.StripFor)
		f.mu.Unlock()
		f.log.Info("peer takes no compact evidence bodies (a release before this one?); sending it JSON", "peer", p.id)
		return f.deliver(ctx, p, batch)
	}
	if err != nil {
		return 0, err
	}
	f.settleResult(p, batch, res)
	return len(batch), nil
}

// compactFor says whether p is sent BinaryContentType: unless it refused
// it within StripFor.
func (f *Forwarder) compactFor(p *peerQueue) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.cfg.JSON && time.Now().After(p.jsonUntil)
}

// settleResult counts what the peer answered for batch: the items it
// applied are delivered; those it refused for a reason a retry may fix
// wait to be sent again (RetryRefused times); the rest are refused,
// counted by reason, and raise evidence_refused. None of the refused is
// counted delivered.
func (f *Forwarder) settleResult(p *peerQueue, batch []item, res Result) {
	now := f.cfg.Now()
	refused := make(map[int]string, len(res.Refusals))
	for _, r := range res.Refusals {
		if r.Index >= 0 && r.Index < len(batch) {
			refused[r.Index] = r.Code
		}
	}
	final := map[string]int{}
	if unreported := res.Refused - len(refused); unreported > 0 {
		// A peer of the release before says how many, not which.
		final["unreported"] = unreported
	}
	var again []item
	delivered := 0
	for i, it := range batch {
		code, ok := refused[i]
		switch {
		case !ok:
			delivered++
			f.met.lag.Observe(now.Sub(it.o.offered).Seconds())
		case evaluator.Retryable(code) && int(it.retries) < f.cfg.RetryRefused:
			it.retries++
			// Real time, not Config.Now: the wait is for the peer's
			// copies to catch up, however its clock is set.
			it.due = time.Since(epoch) + f.cfg.RetryAfter<<(it.retries-1)
			again = append(again, it)
		default:
			final[code]++
		}
	}
	delivered = max(delivered-final["unreported"], 0)
	p.forwarded.Add(float64(delivered))
	if len(again) > 0 {
		f.mu.Lock()
		if !p.forgotten {
			p.retry = append(p.retry, again...)
			if over := len(p.retry) - f.cfg.QueueLimit; over > 0 {
				clear(p.retry[:over])
				p.retry = p.retry[over:]
				f.drop(p, over)
			}
		}
		f.mu.Unlock()
	}
	if len(final) > 0 {
		f.noteRefused(p, final, "")
	}
}

// noteRefused counts items p refused for good, by reason, and keeps the
// burst evidence_refused reports. The first refusal of a burst is logged;
// the burst's end, with its totals, is logged by RunOnce.
func (f *Forwarder) noteRefused(p *peerQueue, byReason map[string]int, detail string) {
	now := f.cfg.Now()
	total := 0
	for reason, n := range byReason {
		f.met.refused.WithLabelValues(p.id, reason).Add(float64(n))
		total += n
	}
	f.mu.Lock()
	first := p.burst == nil
	if first {
		p.burst, p.burstSince = map[string]int{}, now
	}
	for reason, n := range byReason {
		p.burst[reason] += n
	}
	p.lastRefused = now
	if detail != "" {
		p.burstDetail = detail
	}
	f.mu.Unlock()
	if first {
		f.log.Warn("peer refuses forwarded evidence; not counted delivered (evidence_refused)", "peer", p.id, "items", total,
			"reasons", byReason, "detail", detail)
	}
}

// nextRetry is how long until p's first item waiting to be retried is
// due; false when none waits.
func (f *Forwarder) nextRetry(p *peerQueue) (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(p.retry) == 0 {
		return 0, false
	}
	due := p.retry[0].due
	for _, it := range p.retry[1:] {
		due = min(due, it.due)
	}
	return max(due-time.Since(epoch), 0), true
}

// promote moves p's retries that are due to the head of its queue (they
// are older than what waits there).
func (f *Forwarder) promote(p *peerQueue) {
	now := time.Since(epoch)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(p.retry) == 0 || p.forgotten {
		return
	}
	var due, later []item
	for _, it := range p.retry {
		if it.due > now {
			later = append(later, it)
		} else {
			due = append(due, it)
		}
	}
	if len(due) == 0 {
		return
	}
	p.retry = later
	p.items = append(due, p.items[p.head:]...)
	p.head = 0
	f.trim(p)
}

// AlarmEvidenceRefused is raised, per peer, while a peer refuses evidence
// this replica forwards it (and for Config.RefusedAlarm after): those
// items never reached that replica's evaluator, which may be the owner
// deciding on them.
const AlarmEvidenceRefused = "evidence_refused"

// itemAlarms returns an AlarmEvidenceRefused for each peer that refused
// forwarded evidence items within Config.RefusedAlarm.
func (f *Forwarder) itemAlarms() []assembler.Alarm {
	now := f.cfg.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []assembler.Alarm
	for _, p := range f.peers {
		if p.burst == nil || now.Sub(p.lastRefused) > f.cfg.RefusedAlarm {
			continue
		}
		total := 0
		reasons := make([]string, 0, len(p.burst))
		for _, r := range slices.Sorted(maps.Keys(p.burst)) {
			total += p.burst[r]
			reasons = append(reasons, fmt.Sprintf("%s %d", r, p.burst[r]))
		}
		detail := fmt.Sprintf("replica %s refused %d evidence items this replica accepted and forwarded, since %s (%s); they did not reach its evaluator and were not counted delivered (those a retry could fix were retried %d times first)",
			p.id, total, p.burstSince.UTC().Format(time.RFC3339), strings.Join(reasons, ", "), f.cfg.RetryRefused)
		if p.burstDetail != "" {
			detail += "; its last answer: " + p.burstDetail
		}
		out = append(out, assembler.Alarm{Kind: AlarmEvidenceRefused, Since: p.burstSince, Detail: detail})
	}
	slices.SortFunc(out, func(a, b assembler.Alarm) int { return strings.Compare(a.Detail, b.Detail) })
	return out
}

// endBursts logs and closes the bursts of refusals that ended (no
// refusal for RefusedAlarm). Called by RunOnce.
func (f *Forwarder) endBursts() {
	f.mu.Lock()
	open := false
	for _, p := range f.peers {
		open = open || p.burst != nil
	}
	f.mu.Unlock()
	if !open {
		return // the clock is not read when there is nothing to end
	}
	now := f.cfg.Now()
	f.mu.Lock()
	type ended struct {
		peer    string
		reasons map[string]int
		since   time.Time
	}
	var done []ended
	for _, p := range f.peers {
		if p.burst != nil && now.Sub(p.lastRefused) > f.cfg.RefusedAlarm {
			done = append(done, ended{p.id, p.burst, p.burstSince})
			p.burst, p.burstDetail = nil, ""
		}
	}
	f.mu.Unlock()
	for _, e := range done {
		f.log.Info("peer no longer refuses forwarded evidence", "peer", e.peer, "since", e.since, "reasons", e.reasons)
	}
}

// encode groups consecutive items of one actor into one Batch.
func encode(items []item) ([]byte, error) {
	var b Body
	for i := range items {
		it := &items[i]
		if n := len(b.Batches); n > 0 && b.Batches[n-1].Actor == *it.o.actor {
			b.Batches[n-1].Reports = append(b.Batches[n-1].Reports, it.report())
			continue
		}
		b.Batches = append(b.Batches, Batch{Actor: *it.o.actor, Reports: []evaluator.Report{it.report()}})
	}
	return json.Marshal(b)
}

// maxAnswer bounds the answer read from a peer: a refusal of every item
// of a full batch fits.
const maxAnswer = 1 << 20

// post sends one body to addr and returns the peer's answer. A 2xx whose
// body is not a Result (none, or cut short) counts every item applied, as
// the release before did.
func (f *Forwarder) post(ctx context.Context, peerID, addr string, body []byte, contentType string) (Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, addr+Path, bytes.NewReader(body))
	if err != nil {
		return Result{}, &refusedError{detail: "build the request: " + err.Error()}
	}
	req.Header.Set("Content-Type", contentType)
	// Signed for this peer alone: another replica refuses the request.
	if err := f.cfg.Signer.Sign(ctx, req, peerID, body); err != nil {
		return Result{}, fmt.Errorf("sign: %w", err)
	}
	res, err := f.cfg.Client.Do(req)
	if err != nil {
		return Result{}, err
	}
	defer res.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(res.Body, maxAnswer))
	switch {
	case res.StatusCode/100 == 2:
		var out Result
		if json.Unmarshal(answer, &out) != nil {
			out = Result{}
		}
		return out, nil
	case res.StatusCode == http.StatusBadRequest, res.StatusCode == http.StatusRequestEntityTooLarge,
		res.StatusCode == http.StatusUnsupportedMediaType, res.StatusCode == http.StatusUnprocessableEntity:
		return Result{}, refusal(res.StatusCode, truncate(answer, 16<<10))
	}
	return Result{}, fmt.Errorf("%s: %s", res.Status, bytes.TrimSpace(truncate(answer, 1024)))
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
