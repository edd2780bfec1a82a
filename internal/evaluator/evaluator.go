package evaluator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/worker"
)

// ErrNotReady means the evaluator is still rebuilding its state; callers
// answer 503 with a short Retry-After.
var ErrNotReady = errors.New("the evaluator is rebuilding its state after a start")

// Config configures an Evaluator.
type Config struct {
	Registry *registry.Registry
	Pool     *pgxpool.Pool
	// Now defaults to time.Now.
	Now func() time.Time
	// Tick is the evaluation period: 200 ms by default.
	Tick time.Duration
	// RefreshEvery is how often registry changes are picked up: 1 s.
	RefreshEvery time.Duration
	// FlushEvery is how often observed windows are written: 10 s, so they
	// are at most that far behind (ADR-02 allows 60 s).
	FlushEvery time.Duration
	// Retention is how much observed history the rebuild replays (5 min);
	// windows older than twice that are pruned.
	Retention time.Duration
	// TransitionBuffer bounds the transitions held while PostgreSQL is
	// away, and those held for the publisher (TakeChanges) if it stops
	// taking them.
	TransitionBuffer int
	// MaxPendingWindows bounds the observed windows kept in memory while
	// they cannot be written (2,000,000 rows, about 250 MB with the tenure
	// each was decided under; at 60,000 instances with three classes,
	// some two minutes of flushes); the oldest beyond it are dropped and
	// counted.
	MaxPendingWindows int
	// DBTimeout bounds each database call of the running loop: a registry
	// refresh, one COPY of observed windows or of transitions (3 s).
	// The refresh runs on the evaluation loop, so this is also the longest
	// a database that stops answering can hold up an evaluation tick. The
	// rebuild at start has no such bound (it may take long at region
	// scale); the connections' I/O backstop still ends it if PostgreSQL
	// stops answering.
	DBTimeout time.Duration
	// DatabaseUp, when set, says whether PostgreSQL answers (db.Monitor's
	// Up). While it says no, the loop skips registry refreshes, window
	// flushes and transition writes instead of waiting out their deadlines
	// again and again; windows keep counting and transitions stay buffered,
	// and both are written once it says yes again.
	DatabaseUp func() bool
	Engine     eligibility.Options
	// Overrides, when set, gives the overrides in force (policy.InForce),
	// shown beside verdicts and counted around lease-expired instances.
	Overrides OverrideSource
	// MayResolve, when set, says whether a caller may resolve a service
	// (the registry's AuthzCache): passive evidence is accepted only from
	// workloads it allows. Without it only a service's own workloads may
	// report passive evidence about it.
	MayResolve func(actor identity.Principal, service string) error
	// Fence, when set, says whether this replica writes a service's
	// observations, and under which tenure: a service's owner (and the
	// replica it is offered to, during a move) keep its evidence
	// (Evaluates), but only the owner writes
	// the observed windows and the transitions, so the database holds
	// each once, and an owner deposed between deciding and writing (a
	// pause) writes none (fence.Fence.ClaimUnlessOwned). While no other
	// replica is known to own a service (alone, a shard between owners,
	// the leases unreadable) any replica writes them unfenced, so nothing
	// observed is lost for want of an owner (see Evaluator.publish for
	// why that is safe). Nil: every service, unfenced.
	Fence *fence.Fence
	// Evaluates, when set, says whether this replica keeps the evidence
	// it takes about a service (it owns the service, or is being offered
	// it: ownership.Manager.Evaluates). Evidence about any other service
	// is attributed and answered as usual, then only handed to the
	// forwarder, which takes it to the replica that keeps it: so each
	// sample is held by one replica (two during a move), whatever their
	// number. Nil: every service. Forwarded evidence is always kept (the
	// sender routed it here).
	Evaluates func(service string) bool
	// Replica is this replica's id, written beside the windows it flushes
	// so that it does not read them back when following (FollowEvery).
	Replica string
	// FollowEvery, when positive, is how often the windows other replicas
	// wrote are read and applied to the services this replica does not
	// evaluate (Evaluates false), so that its state of every service is
	// at most a flush and this period behind the owner's: a replica dealt
	// a service (its owner died, or a move) decides on current windows,
	// and a read on any replica answers from them. 0: never (a replica
	// that evaluates everything, or the one-replica tests).
	FollowEvery time.Duration
	// FollowMargin is how far behind the database's now the follower
	// reads (DefaultFollowMargin): a window becomes visible when its
	// write commits, stamped with when the write began.
	FollowMargin time.Duration
	Logger       *slog.Logger
	Registerer   prometheus.Registerer
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	if c.Registry == nil || c.Pool == nil {
		return errors.New("evaluator: Registry and Pool are required")
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Tick, 200*time.Millisecond)
	def(&c.RefreshEvery, time.Second)
	def(&c.FlushEvery, 10*time.Second)
	def(&c.FollowMargin, DefaultFollowMargin)
	def(&c.Retention, 5*time.Minute)
	if c.FlushEvery > time.Minute {
		return fmt.Errorf("evaluator: FlushEvery %s exceeds the 60 s observed-state RPO", c.FlushEvery)
	}
	if c.TransitionBuffer == 0 {
		c.TransitionBuffer = 100_000
	}
	if c.MaxPendingWindows == 0 {
		c.MaxPendingWindows = 2_000_000
	}
	def(&c.DBTimeout, 3*time.Second)
	if c.MaxPendingWindows < 0 || c.DBTimeout < 0 {
		return fmt.Errorf("evaluator: MaxPendingWindows %d and DBTimeout %s must not be negative", c.MaxPendingWindows, c.DBTimeout)
	}
	if c.DatabaseUp == nil {
		c.DatabaseUp = func() bool { return true }
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

type instanceInfo struct {
	// The fields every report reads come first, so that with the map
	// key they mostly share one cache line of the map's slot: the map
	// holds a region's instances, and its lookup is the costliest step
	// of ingest.
	service string
	// svc is service's number (Evaluator.serviceNumber; 0: none), which
	// a prober's assignment is checked by without hashing the name.
	svc int32
	// win is where its accepted samples are counted into the current
	// observed window: reached from the instance's one lookup, so
	// counting a sample costs no second hash of its id.
	win     *instanceWindows
	zone    string
	address string
	port    int
	// credential is the hash of the instance's credential (unset: none),
	// which a self-report about it must present.
	credential registry.CredentialHash
}

type serviceInfo struct {
	version      int64 // contract version applied (0: defaults)
	caps         string
	capabilities []string
	minFraction  float64
	slowStart    time.Duration
	// applied is the service and contract applied, as the registry
	// holds them: a contract preview compares against it.
	applied registry.ServiceContract
}

// readinessSignal reports whether the service's new instances start out
// of rotation, awaiting their first success (see eligibility.AddInstance).
func (si *serviceInfo) readinessSignal() bool {
	if si == nil {
		return false
	}
	for _, c := range si.capabilities {
		if c == string(registry.CapProbe) || c == string(registry.CapReadiness) {
			return true
		}
	}
	return false
}

// Evaluator is the evaluation worker.
type Evaluator struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics

	ready atomic.Bool

	// followMu guards follow, where reading the windows other replicas
	// write resumes (follow.go); replayer is the reporter the rebuild and
	// the follower apply windows as.
	followMu sync.Mutex
	follow   followCursor
	replayer eligibility.ReporterID

	evalMu sync.Mutex // serialises runOnce, publication included

	mu        sync.Mutex // guards everything below
	engine    *eligibility.Engine
	instances map[uuid.UUID]instanceInfo
	byService map[string]map[uuid.UUID]struct{}
	services  map[string]*serviceInfo
	// ended and changed collect what the next tick hands on: the last
	// transitions of instances that left the registry, and services whose
	// membership or contract changed.
	ended   []eligibility.Transition
	changed map[string]struct{}
	probers map[string]*proberAssignment
	// serviceNumbers numbers every service name met, from 1, for
	// instanceInfo.svc and proberAssignment.named; never reused.
	// serviceNames[n-1] is the name numbered n, the one copy every
	// instance of it refers to (instanceInfo.service): ingest reads the
	// service of every report (routes, assignments), and one copy per
	// service stays in cache where one per instance would miss.
	serviceNumbers map[string]int32
	serviceNames   []string
	// assignGen counts the assignments ProberAssigned applied.
	assignGen uint64
	// afterAssignmentsRead, when set (tests only), runs in refresh just
	// after it read the prober assignments.
	afterAssignmentsRead atomic.Pointer[func(context.Context)]
	// unsealed are the instance rows not acted on as they stand, because
	// their seal does not verify, and unsealedContracts the services whose
	// stored contract is not applied for the same reason (seals.go).
	unsealed          map[uuid.UUID]unsealedInstance
	unsealedContracts map[string]unsealedContract
	// prechecked holds the seal checks of the batch being applied during
	// the rebuild, made in parallel beforehand (seals.go).
	prechecked map[uuid.UUID]precheck
	// replayChecked holds, for the batch being applied, the active rows
	// muster has a record of ending (replayCheck), and replays the rows
	// kept out of rotation for it (seals.go).
	replayChecked map[uuid.UUID]audit.End
	replays       map[uuid.UUID]replayedInstance
	// quarantined are the quarantines seen starting or restored, until
	// they end (QuarantineAlarms).
	quarantined map[uuid.UUID]quarantineNote
	// expired holds, per service, instances whose lease expired while
	// their zone's guard still needs them (expired.go).
	expired map[string]map[uuid.UUID]expiredInstance
	// windows are the instances counted into since the last flush, each
	// once: their counts (instanceInfo.win) are this window's while their
	// gen is winGen (store.go).
	windows  []*instanceWindows
	winGen   uint64
	winStart time.Time
	// loaded says the rebuild's read of the instances is done (load);
	// refreshes then read the rows changed after the cursor, the newest
	// (updated_at, id) applied.
	loaded   bool
	cursorAt time.Time
	cursorID uuid.UUID
	members  uint64 // bumped whenever an instance is added or removed
	replayed int
	// quarantines restored by the rebuild (still in force then), and how
	// long reading and restoring them took.
	quarantines     int
	quarantinesTook time.Duration
	// admissions restored by the rebuild, and how long that took.
	admissions     int
	admissionsTook time.Duration
	// rebuildRows counts the instance rows the rebuild read, and
	// registryTook is how long loading the registry took.
	rebuildRows  int
	registryTook time.Duration

	reporterMu sync.Mutex
	reporters  map[string]eligibility.ReporterID

	transitions *transitionWriter
	// changes holds what evaluations changed until the publisher takes it.
	changes *changeQueue
	// flushMu serialises window flushes; pendingWindows (oldest first) are
	// the windows earlier flushes could not write.
	flushMu        sync.Mutex
	pendingWindows []pendingWindow
	// kick asks the loop for an early registry refresh: ingest met an
	// instance it does not know and could not look up (learn.go), most
	// likely one registered a moment ago.
	kick chan struct{}
	// urgent asks for an evaluation before the next tick: a hard failure
	// arrived, and withdrawing it should not wait up to a whole tick.
	urgent chan struct{}
	// misses remembers ids reports named that have no instance or whose
	// instance ended; lookupSlots bounds the on-demand lookups running at
	// once (learn.go).
	misses      *missCache
	lookupSlots chan struct{}

	runner worker.Runner
}

// New returns a stopped Evaluator.
func New(cfg Config) (*Evaluator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	e := &Evaluator{
		cfg:               cfg,
		log:               cfg.Logger.With("worker", "evaluator"),
		metrics:           m,
		engine:            eligibility.NewEngine(cfg.Engine),
		instances:         map[uuid.UUID]instanceInfo{},
		byService:         map[string]map[uuid.UUID]struct{}{},
		services:          map[string]*serviceInfo{},
		changed:           map[string]struct{}{},
		probers:           map[string]*proberAssignment{},
		serviceNumbers:    map[string]int32{},
		expired:           map[string]map[uuid.UUID]expiredInstance{},
		unsealed:          map[uuid.UUID]unsealedInstance{},
		replays:           map[uuid.UUID]replayedInstance{},
		quarantined:       map[uuid.UUID]quarantineNote{},
		unsealedContracts: map[string]unsealedContract{},
		reporters:         map[string]eligibility.ReporterID{},
		winGen:            1,
		kick:              make(chan struct{}, 1),
		urgent:            make(chan struct{}, 1),

		misses:      newMissCache(missCapacity, missTTL),
		lookupSlots: make(chan struct{}, lookupSlots),
	}
	e.changes = newChangeQueue(cfg.TransitionBuffer)
	// The registration hand-off: the registry tells its follower of what
	// it commits (registry.Follower).
	cfg.Registry.Follow(e)
	e.transitions = newTransitionWriter(cfg.Pool, cfg.Fence, cfg.TransitionBuffer, cfg.DBTimeout, cfg.DatabaseUp, m, e.log)
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(newCollector(e)); err != nil {
			return nil, fmt.Errorf("evaluator: register metrics: %w", err)
		}
		if err := cfg.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_instances_unsealed",
			Help: "Instance rows the evaluator does not act on as they stand because their seal does not verify: inserted or re-pointed outside muster (no traffic), or ended outside muster (traffic kept). docs/overrides.md: what muster writes is sealed. Anything above 0 deserves a look.",
		}, func() float64 { return float64(e.UnsealedInstances()) })); err != nil {
			return nil, fmt.Errorf("evaluator: register metrics: %w", err)
		}
		if err := cfg.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_instances_replayed",
			Help: "Instance rows that read active but are not routed because muster has a record of ending them (the audit log's end.record): an ended row written back outside muster. docs/keys.md: replays. Anything above 0 deserves a look.",
		}, func() float64 { return float64(e.ReplayedInstances()) })); err != nil {
			return nil, fmt.Errorf("evaluator: register metrics: %w", err)
		}
		if err := cfg.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_contracts_unsealed",
			Help: "Services whose stored health contract the evaluator does not apply because its seal does not verify: written outside muster. Anything above 0 deserves a look.",
		}, func() float64 { return float64(e.UnsealedContracts()) })); err != nil {
			return nil, fmt.Errorf("evaluator: register metrics: %w", err)
		}
	}
	return e, nil
}

// Ready reports whether the rebuild is done and verdicts are published.
func (e *Evaluator) Ready() bool { return e.ready.Load() }

// Start rebuilds state in the background and then evaluates on every tick
// until ctx ends or Stop is called.
func (e *Evaluator) Start(ctx context.Context) error { return e.runner.Start(ctx, e.run) }

// Stop ends the loops, flushes what it can, and waits. Safe to call twice
// or before Start.
func (e *Evaluator) Stop() { e.runner.Stop() }

func (e *Evaluator) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { e.transitions.run(ctx) })
	defer wg.Wait()

	for {
		err := e.rebuild(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		e.log.Warn("rebuild failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}

	// Evaluation never waits on PostgreSQL: registry refreshes and window
	// flushes run in a loop of their own, so a database that hangs delays
	// what the registry says, never a withdrawal.
	wg.Go(func() { e.databaseLoop(ctx) })
	if e.cfg.FollowEvery > 0 {
		wg.Go(func() { e.followLoop(ctx) })
	}
	tick := time.NewTicker(e.cfg.Tick)
	defer tick.Stop()
	// A hard failure is evaluated at once unless an early evaluation ran
	// within minUrgentInterval; then one more runs at the interval's end
	// for all that arrived meanwhile (held: its timer), never a sleep, so
	// the loop still answers ctx and the tick.
	pace := urgentPacer{interval: minUrgentInterval}
	held := time.NewTimer(time.Hour)
	held.Stop()
	defer held.Stop()
	var heldC <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			e.runOnce()
			if heldC != nil {
				// This evaluation saw every hard failure the held one
				// was for.
				held.Stop()
				heldC = nil
			}
		case <-e.urgent:
			if heldC != nil {
				continue // the held evaluation will see it
			}
			if wait := pace.wait(time.Now()); wait > 0 {
				held.Reset(wait)
				heldC = held.C
				continue
			}
			e.runOnce()
			pace.ran(time.Now())
		case <-heldC:
			heldC = nil
			e.runOnce()
			pace.ran(time.Now())
		}
	}
}

// urgentPacer paces the evaluations hard failures bring forward: the first
// runs at once (the leading edge), and a burst costs at most one more per
// interval. It takes every time as a parameter.
type urgentPacer struct {
	interval time.Duration
	last     time.Time // when the last early evaluation ended; zero: none yet
}

// wait returns how long an early evaluation asked for at now must wait:
// 0 if none ran within the interval before now.
func (u *urgentPacer) wait(now time.Time) time.Duration {
	if u.last.IsZero() {
		return 0
	}
	return max(0, u.last.Add(u.interval).Sub(now))
}

// ran records that an early evaluation ended at now.
func (u *urgentPacer) ran(now time.Time) { u.last = now }

// databaseLoop picks up registry changes (on its ticker, or early when
// ingest saw an instance it does not know) and flushes observed windows.
func (e *Evaluator) databaseLoop(ctx context.Context) {
	refresh := time.NewTicker(e.cfg.RefreshEvery)
	flush := time.NewTicker(e.cfg.FlushEvery)
	defer refresh.Stop()
	defer flush.Stop()

	var lastKick time.Time
	for {
		select {
		case <-ctx.Done():
			// Flush what was observed since the last window, on a fresh
			// context: shutdown is when it matters most.
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := e.flushWindows(fctx); err != nil {
				e.log.Warn("final flush of observed windows", "err", err)
			}
			cancel()
			return
		case <-refresh.C:
			e.refreshBounded(ctx)
		case <-e.kick:
			if time.Since(lastKick) < minKickInterval {
				continue
			}
			lastKick = time.Now()
			e.refreshBounded(ctx)
		case <-flush.C:
			if !e.cfg.DatabaseUp() {
				continue // the windows keep counting; the next flush writes them
			}
			if err := e.flushWindows(ctx); err != nil && ctx.Err() == nil {
				e.log.Warn("flush observed windows", "err", err)
			}
		}
	}
}

// refreshBounded is the database loop's registry refresh: skipped while
// the database is down, and given DBTimeout.
func (e *Evaluator) refreshBounded(ctx context.Context) {
	if !e.cfg.DatabaseUp() {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, e.cfg.DBTimeout)
	defer cancel()
	if err := e.refresh(rctx); err != nil && ctx.Err() == nil {
		e.log.Warn("refresh from the registry", "err", err)
	}
}

// refreshOverlap is how far behind its newest row each incremental
// refresh starts reading again.
const refreshOverlap = 10 * time.Second

// minUrgentInterval bounds how often hard failures may bring an
// evaluation forward (see urgentPacer): the first is immediate, a burst
// gets one more per interval.
const minUrgentInterval = 20 * time.Millisecond

// minKickInterval bounds how often unknown instances in reports may force
// an early registry refresh.
const minKickInterval = 100 * time.Millisecond

// runOnce evaluates every instance once and hands on the transitions.
func (e *Evaluator) runOnce() {
	// One evaluation at a time, publication included: whoever returns from
	// runOnce (the loop, an early evaluation, EvaluateNow) knows that every
	// transition computed before it is queued for the publisher.
	e.evalMu.Lock()
	defer e.evalMu.Unlock()
	start := time.Now()
	e.mu.Lock()
	now := e.cfg.Now()
	e.holdFollowedSilence(now)
	ts := append(e.ended, e.engine.Tick(now)...)
	e.ended = nil
	e.noteQuarantines(ts)
	// Health becoming known or unknown, or a quarantine ending, changes
	// the view without a transition.
	for _, name := range e.engine.Changed() {
		e.changed[name] = struct{}{}
	}
	var changed []string
	for name := range e.changed {
		changed = append(changed, name)
	}
	clear(e.changed)
	e.mu.Unlock()
	e.metrics.tick.Observe(time.Since(start).Seconds())
	e.publish(ts, changed)
}

// holdFollowedSilence holds silence off, at now, for every service
// another replica evaluates (eligibility.Engine.HoldSilence): this
// replica hears of them only through their owner's windows, which come a
// flush and a follow late, and a replica dealt one of them (its owner
// died) must take it with the verdicts the owner held, not with every
// instance gone silent in the gaps, where a hard failure alone could no
// longer withdraw one. Called with e.mu held.
func (e *Evaluator) holdFollowedSilence(now time.Time) {
	if e.cfg.Evaluates == nil || e.cfg.FollowEvery <= 0 {
		return
	}
	for name := range e.services {
		if !e.cfg.Evaluates(name) {
			e.engine.HoldSilence(name, now)
		}
	}
}

// publish records the transitions and queues them, with the services
// changed without one, for the publisher.
func (e *Evaluator) publish(ts []eligibility.Transition, changed []string) {
	defer e.changes.add(ts, changed)
	if len(ts) == 0 {
		return
	}
	for _, t := range ts {
		e.metrics.transitions.WithLabelValues(t.To.String()).Inc()
		if t.To == eligibility.Ineligible && !t.FirstFailureAt.IsZero() {
			e.metrics.damping.WithLabelValues(t.Service).Observe(t.At.Sub(t.FirstFailureAt).Seconds())
		}
	}
	// The tenure is taken now, when the transition is decided, and
	// checked when it is written: an owner deposed in between (a pause
	// longer than its local deadline) records nothing the new owner
	// records too. A transition of a service no other replica is known
	// to own is written unfenced, by every replica that computed it: a
	// shard between owners lasts at most a lease TTL and a round, and the
	// cost is the same transition recorded once per replica in that
	// interval (the timeline shows it twice; the rebuild reads only the
	// newest per instance), where fencing it would need a lease nobody
	// holds, and lose the record when a replica dies with its shards.
	owned := make([]fencedTransition, 0, len(ts))
	for _, t := range ts {
		if tenure, writes := e.cfg.Fence.ClaimUnlessOwned(t.Service); writes {
			owned = append(owned, fencedTransition{Transition: t, tenure: tenure})
		}
	}
	e.transitions.add(owned)
}

// Services lists every service the evaluator knows (with a contract or an
// instance), sorted.
func (e *Evaluator) Services() []string {
	e.mu.Lock()
	set := make(map[string]struct{}, len(e.services))
	for name := range e.services {
		set[name] = struct{}{}
	}
	for _, in := range e.instances {
		set[in.service] = struct{}{}
	}
	e.mu.Unlock()
	return slices.Sorted(maps.Keys(set))
}

// rebuild loads the registry, replays retained observed windows and
// restores recent quarantines, then marks the evaluator ready.
func (e *Evaluator) rebuild(ctx context.Context) error {
	start := time.Now()
	// Rows from before the instance seals are adopted (once per database)
	// before any is read, so none of them is taken for a forgery.
	if _, err := e.cfg.Registry.AdoptUnsealed(ctx); err != nil {
		return err
	}
	if err := e.refresh(ctx); err != nil {
		return err
	}
	loaded := time.Since(start)
	astart := time.Now()
	admitted, err := e.restoreAdmissions(ctx)
	if err != nil {
		return err
	}
	atook := time.Since(astart)
	if err := e.startFollowing(ctx); err != nil {
		return err
	}
	n, err := e.replayWindows(ctx)
	if err != nil {
		return err
	}
	qstart := time.Now()
	held, err := e.restoreQuarantines(ctx)
	if err != nil {
		return err
	}
	qtook := time.Since(qstart)
	e.mu.Lock()
	// The first evaluation after a rebuild restates what was computed
	// before the restart; it is not a change and is not published.
	e.engine.Tick(e.cfg.Now())
	e.ended = nil
	count := len(e.instances)
	e.replayed = n
	e.quarantines, e.quarantinesTook = held, qtook
	e.admissions, e.admissionsTook = admitted, atook
	e.registryTook = loaded
	e.mu.Unlock()
	e.ready.Store(true)
	took := time.Since(start)
	e.metrics.rebuild.Set(took.Seconds())
	e.log.Info("rebuilt evaluation state", "instances", count, "admissions", admitted, "windows", n, "quarantines", held,
		"registry", loaded.Round(time.Millisecond), "quarantines_took", qtook.Round(time.Millisecond),
		"took", took.Round(time.Millisecond))
	return nil
}

// refresh applies registry changes: contracts, prober assignments, and
// instances changed since the last refresh.
func (e *Evaluator) refresh(ctx context.Context) error {
	scs, err := e.cfg.Registry.ServiceContracts(ctx)
	if err != nil {
		return err
	}
	// An assignment ProberAssigned applies after this read is newer than
	// what the read returns: the end of the refresh keeps it.
	e.mu.Lock()
	readGen := e.assignGen
	e.mu.Unlock()
	assignments, err := e.cfg.Registry.AllProberAssignments(ctx)
	if err != nil {
		return err
	}
	if hook := e.afterAssignmentsRead.Load(); hook != nil {
		(*hook)(ctx)
	}
	e.mu.Lock()
	for _, sc := range scs {
		e.applyService(sc)
	}
	e.mu.Unlock()

	e.mu.Lock()
	loaded := e.loaded
	e.mu.Unlock()
	if !loaded {
		if err := e.load(ctx); err != nil {
			return err
		}
	} else if err := e.refreshInstances(ctx); err != nil {
		return err
	}

	if e.ready.Load() {
		// Not during the rebuild: verdicts are not replayed yet.
		e.mu.Lock()
		e.pruneExpired(e.cfg.Now())
		e.mu.Unlock()
	}

	// Prober assignments last, so assigned services resolve to the
	// instances just loaded.
	// Re-assigning a prober rebuilds (and sorts) its target set in the
	// engine, under the lock ingest and evaluation need; it is done only
	// when the assignment or the membership of a service changed.
	e.mu.Lock()
	probers := make(map[string]*proberAssignment, len(assignments))
	for _, a := range assignments {
		if cur := e.probers[a.Prober]; cur != nil && cur.gen > readGen {
			continue // assigned after the read: kept below
		}
		probers[a.Prober] = e.applyAssignment(a)
	}
	for name, cur := range e.probers {
		if cur.gen > readGen { // assigned after the read: newer than it
			pa := e.applyAssignment(cur.src)
			pa.gen = cur.gen
			probers[name] = pa
		}
	}
	e.probers = probers
	e.mu.Unlock()
	return nil
}

// refreshPage is how many instance rows one registry read returns.
const refreshPage = 5000

// load is the first read of the instances (the rebuild's): the live ones,
// those that read ended without an end time, and those ended within
// ExpiredHorizon, through indexes of those rows only
// (Registry.InstancesToRebuild). Nothing older matters to the evaluator:
// an instance that ended before the horizon holds no guard (keepExpired),
// its quarantines are not restored (restoreQuarantines restores those of
// live instances only), and a replay of one (its row written back to
// 'active') is a live row, checked against muster's record of the end
// like every live row (replayCheck). Ids are never reused, so the rows
// left out are most of the table, and only grow.
//
// The cursor the incremental refreshes go on from is taken before the
// read, refreshOverlap early (the overlap's reasoning, in
// refreshInstances): a row committed after the read passed it, or stamped
// just before the read began and committed after, is read again by the
// next refresh. The newest stamp on record bounds it too, so an evaluator
// clock running ahead of the writers' loses nothing.
func (e *Evaluator) load(ctx context.Context) error {
	begin := e.cfg.Now()
	newest, found, err := e.cfg.Registry.NewestInstanceChange(ctx)
	if err != nil {
		return err
	}
	endedSince := begin.Add(-ExpiredHorizon)
	var c registry.RebuildCursor
	for !c.Done() {
		var batch []registry.Instance
		if batch, c, err = e.cfg.Registry.InstancesToRebuild(ctx, endedSince, c, refreshPage); err != nil {
			return err
		}
		if err := e.applyBatch(ctx, batch, false); err != nil {
			return err
		}
	}
	var cursor time.Time // none on record: the next refresh reads from the start
	if found {
		cursor = begin
		if newest.Before(cursor) {
			cursor = newest
		}
		cursor = cursor.Add(-refreshOverlap)
	}
	e.mu.Lock()
	e.cursorAt, e.cursorID, e.loaded = cursor, uuid.Nil, true
	e.mu.Unlock()
	return nil
}

// refreshInstances applies the instance rows changed since the last read.
func (e *Evaluator) refreshInstances(ctx context.Context) error {
	// updated_at comes from the writers' clocks and commits land out of
	// order, so a row stamped just before the newest one seen may commit
	// just after it. Such a row is stamped after now−refreshOverlap, so
	// while the cursor is inside that window each refresh re-reads from
	// its start (applying a row twice changes nothing); once the cursor is
	// older than the window, reading past it exactly is enough.
	e.mu.Lock()
	since, after := e.cursorAt, e.cursorID
	if low := e.cfg.Now().Add(-refreshOverlap); !since.IsZero() && since.After(low) {
		since, after = low, uuid.Nil
	}
	e.mu.Unlock()
	for {
		batch, err := e.cfg.Registry.InstancesChangedSince(ctx, since, after, refreshPage)
		if err != nil {
			return err
		}
		if err := e.applyBatch(ctx, batch, true); err != nil {
			return err
		}
		if len(batch) < refreshPage {
			return nil
		}
		since, after = batch[len(batch)-1].UpdatedAt, batch[len(batch)-1].ID
	}
}

// applyBatch applies instance rows read from the registry, after checking
// them for replays; advance moves the refresh cursor past them (rows read
// in updated_at order).
func (e *Evaluator) applyBatch(ctx context.Context, batch []registry.Instance, advance bool) error {
	now := e.cfg.Now()
	var pre map[uuid.UUID]precheck
	if !e.ready.Load() {
		// The rebuild meets rows new to it, each needing a seal check:
		// they run on every core, outside the lock (seals.go).
		pre = e.precheck(batch)
	}
	replays, err := e.replayCheck(ctx, batch, pre)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.ready.Load() {
		e.rebuildRows += len(batch)
	}
	e.prechecked, e.replayChecked = pre, replays
	for _, in := range batch {
		e.applyInstance(in, now)
		if advance && (in.UpdatedAt.After(e.cursorAt) || (in.UpdatedAt.Equal(e.cursorAt) && bytes.Compare(in.ID[:], e.cursorID[:]) > 0)) {
			e.cursorAt, e.cursorID = in.UpdatedAt, in.ID
		}
	}
	e.prechecked, e.replayChecked = nil, nil
	return nil
}

// applyAssignment returns the in-memory copy of a prober's assignments,
// re-assigning its targets in the engine only when the assignment or the
// membership of a service changed. Called with e.mu held.
func (e *Evaluator) applyAssignment(a registry.ProberAssignments) *proberAssignment {
	key := fmt.Sprint(a.Services, a.Instances)
	if old := e.probers[a.Prober]; old != nil && old.key == key && old.members == e.members {
		return old
	}
	pa := &proberAssignment{id: e.internReporter("prober:" + a.Prober), services: map[string]bool{}, instances: map[uuid.UUID]bool{},
		key: key, members: e.members, src: a}
	var targets []eligibility.InstanceID
	for _, s := range a.Services {
		pa.services[s] = true
		n := e.serviceNumber(s)
		if int(n) >= len(pa.named) {
			pa.named = append(pa.named, make([]bool, int(n)+1-len(pa.named))...)
		}
		pa.named[n] = true
		for id := range e.byService[s] {
			targets = append(targets, eligibility.InstanceID(id))
		}
	}
	for _, id := range a.Instances {
		pa.instances[id] = true
		targets = append(targets, eligibility.InstanceID(id))
	}
	e.assignProber(pa.id, a.Prober, targets)
	return pa
}

// ProberAssigned applies a prober's new assignments at once, as the next
// refresh would (the registry's ProberAssigned hook calls it after the
// commit), so the prober's first reports are not refused as not assigned.
//
// It applies them during the rebuild too: the rebuild's refresh may have
// read the assignments before this one committed, and its end keeps an
// assignment stamped after its read (refresh), as any refresh's does.
func (e *Evaluator) ProberAssigned(a registry.ProberAssignments) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.assignGen++
	pa := e.applyAssignment(a)
	pa.gen = e.assignGen
	e.probers[a.Prober] = pa
}

// applyService sets a service's contract in the engine unless the same
// version and capabilities are already applied. Called with e.mu held.
func (e *Evaluator) applyService(sc registry.ServiceContract) {
	if !e.contractSealed(sc) {
		return // keeps the contract it applied before
	}
	key := fmt.Sprint(sc.Service.Capabilities)
	if si, ok := e.services[sc.Service.Name]; ok && si.version == sc.ContractVersion && si.caps == key {
		return
	}
	contract := contractOf(sc)
	e.engine.SetService(sc.Service.Name, contract)
	caps := make([]string, len(sc.Service.Capabilities))
	for i, c := range sc.Service.Capabilities {
		caps[i] = string(c)
	}
	e.services[sc.Service.Name] = &serviceInfo{version: sc.ContractVersion, applied: sc, caps: key, capabilities: caps,
		minFraction: sc.Contract.MinHealthyFraction, slowStart: contract.SlowStart}
	e.changed[sc.Service.Name] = struct{}{}
}

// applyInstance adds a new active instance or retires an ended one. An
// instance already known and still active, or unknown and ended, changes
// nothing, so the refresh, the registration hand-off and the on-demand
// load may apply the same row in any order. Called with e.mu held.
func (e *Evaluator) applyInstance(in registry.Instance, now time.Time) {
	_, known := e.instances[in.ID]
	in, ok := e.sealed(in, known, now)
	if !ok {
		return
	}
	switch {
	case in.State == registry.StateExpired && !known && !e.ready.Load():
		// Expired before this process started (the rebuild reads those
		// that ended within ExpiredHorizon): kept in case its zone's guard
		// still needs it.
		// Whether it ever served is not known yet: an instance of a
		// service with a readiness signal counts as awaiting until the
		// rebuild finds its admission on record (restoreAdmissions).
		if _, kept := e.expired[in.Service][in.ID]; !kept {
			e.keepExpired(in, instanceInfo{service: in.Service, zone: in.Zone, address: in.Address, port: in.Port},
				e.services[in.Service].readinessSignal(), now)
		}
	case in.State == registry.StateActive && !known:
		if err := e.engine.AddInstance(eligibility.InstanceID(in.ID), in.Service, now); err != nil {
			e.log.Warn("add instance", "instance", in.ID, "err", err)
			return
		}
		svc := e.serviceNumber(in.Service)
		e.instances[in.ID] = instanceInfo{service: e.serviceNames[svc-1], svc: svc, zone: in.Zone, address: in.Address, port: in.Port, credential: in.CredentialHash(),
			win: &instanceWindows{id: in.ID}}
		e.changed[in.Service] = struct{}{}
		e.members++
		if e.byService[in.Service] == nil {
			e.byService[in.Service] = map[uuid.UUID]struct{}{}
		}
		e.byService[in.Service][in.ID] = struct{}{}
	case in.State != registry.StateActive && known:
		// The instance leaves: its last transition goes on record (lease
		// expiry is a hard failure, deregistration a graceful exit) before
		// it is forgotten.
		if v, ok := e.engine.Verdict(eligibility.InstanceID(in.ID), now); ok && v.State != eligibility.Ineligible {
			reason := "deregistered"
			switch in.State {
			case registry.StateExpired:
				reason = ReasonLeaseExpired
			case registry.StateReplaced:
				reason = "replaced by a new registration of its endpoint"
			}
			e.ended = append(e.ended, eligibility.Transition{
				Instance: eligibility.InstanceID(in.ID), Service: in.Service,
				From: v.State, To: eligibility.Ineligible, At: now, Reason: reason,
			})
		}
		e.changed[in.Service] = struct{}{}
		e.members++
		if in.State == registry.StateExpired {
			r, _ := e.engine.Routing(eligibility.InstanceID(in.ID), now)
			e.keepExpired(in, e.instances[in.ID], r.Awaiting, now)
		}
		e.engine.RemoveInstance(eligibility.InstanceID(in.ID))
		delete(e.instances, in.ID)
		delete(e.byService[in.Service], in.ID)
		// Its runtime and its callers may report on it a while longer;
		// they are told it ended without a lookup.
		e.misses.add(in.ID, in.State, now)
	}
}

// serviceNumber is service's number, given at its first mention. Called
// with e.mu held.
func (e *Evaluator) serviceNumber(service string) int32 {
	n, ok := e.serviceNumbers[service]
	if !ok {
		name := strings.Clone(service)
		e.serviceNames = append(e.serviceNames, name)
		n = int32(len(e.serviceNames))
		e.serviceNumbers[name] = n
	}
	return n
}

func (e *Evaluator) internReporter(name string) eligibility.ReporterID {
	e.reporterMu.Lock()
	defer e.reporterMu.Unlock()
	id, ok := e.reporters[name]
	if !ok {
		id = eligibility.ReporterID(len(e.reporters) + 1)
		e.reporters[name] = id
	}
	return id
}

// contractOf turns the registry's contract into the core's.
func contractOf(sc registry.ServiceContract) eligibility.Contract {
	var caps eligibility.Capabilities
	for _, c := range sc.Service.Capabilities {
		switch c {
		case registry.CapProbe:
			caps.Probe = true
		case registry.CapSelf:
			caps.Self = true
		case registry.CapPassive:
			caps.Passive = true
		case registry.CapReadiness:
			caps.Readiness = true
		}
	}
	k := sc.Contract
	sec := func(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
	c := eligibility.DefaultContract(caps)
	c.Interval, c.HalfLife, c.MinDwell, c.SlowStart = sec(k.IntervalSeconds), sec(k.HalfLifeSeconds), sec(k.MinDwellSeconds), sec(k.SlowStartSeconds)
	c.RemovalThreshold, c.ReentryThreshold = k.RemovalThreshold, k.ReentryThreshold
	c.PassivePrimaryRPS = k.PassivePrimaryRPS
	c.MinPassiveReporters = k.MinPassiveReporters // 0 (stored before the field) reads as the default
	c.RequireReadiness = k.RequireReadiness
	c.Weights = [3]float64{}
	c.Weights[eligibility.Probe] = k.Weights[registry.CapProbe]
	c.Weights[eligibility.Self] = k.Weights[registry.CapSelf]
	c.Weights[eligibility.Passive] = k.Weights[registry.CapPassive]
	c.Dependencies = make(map[string]eligibility.Dependency, len(k.Dependencies))
	for _, d := range k.Dependencies {
		a := eligibility.Weight
		switch d.Authority {
		case registry.AuthorityInformational:
			a = eligibility.Informational
		case registry.AuthorityUnready:
			a = eligibility.Unready
		}
		c.Dependencies[d.Name] = eligibility.Dependency{Shared: d.Shared, Authority: a}
	}
	return c
}

// Stats is a summary for tools and logs.
type Stats struct {
	Services, Instances, WindowsReplayed int
	// QuarantinesRestored counts the quarantines the rebuild found still in
	// force; QuarantinesTook is how long reading and restoring every
	// recent quarantine (ended ones set the next one's step) took.
	QuarantinesRestored int
	QuarantinesTook     time.Duration
	// AdmissionsRestored counts the instances the rebuild found had been
	// in rotation before the restart (see doc.go); AdmissionsTook is how
	// long reading and restoring them took.
	AdmissionsRestored int
	AdmissionsTook     time.Duration
	// InstanceRowsRead counts the instance rows the rebuild read from the
	// registry; RegistryTook is how long loading them (and the contracts
	// and prober assignments) took.
	InstanceRowsRead int
	RegistryTook     time.Duration
}

// Stats returns a summary of the evaluator's state.
func (e *Evaluator) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Stats{Services: len(e.services), Instances: len(e.instances), WindowsReplayed: e.replayed,
		QuarantinesRestored: e.quarantines, QuarantinesTook: e.quarantinesTook,
		AdmissionsRestored: e.admissions, AdmissionsTook: e.admissionsTook,
		InstanceRowsRead: e.rebuildRows, RegistryTook: e.registryTook}
}

// EvaluateNow runs one evaluation tick at once, as the ticker would. Tools
// and tests use it to step the evaluator deterministically.
func (e *Evaluator) EvaluateNow() { e.runOnce() }

// SyncNow picks up registry changes at once, as the refresh ticker would.
func (e *Evaluator) SyncNow(ctx context.Context) error { return e.refresh(ctx) }

// FlushNow writes the observed windows counted so far, as the flush ticker
// would.
func (e *Evaluator) FlushNow(ctx context.Context) error { return e.flushWindows(ctx) }

// FollowNow reads and applies the windows other replicas wrote since the
// last follow (see follow.go), and returns how many it applied.
func (e *Evaluator) FollowNow(ctx context.Context) (int, error) { return e.followWindows(ctx) }
