// Package publisher is the worker between evaluation and propagation: it
// turns the evaluator's changes into assembled, versioned views (through the
// pure assembler) and hands them to the streaming hub.
//
// Data flows one way: the publisher pulls. It takes the evaluator's changes
// (Config.Changes: evaluator.TakeChanges, woken by its Changed channel)
// and notices the shift-backs' new traffic weights (Config.Traffic: their
// Revision, woken by their Changed channel) and the services whose
// overrides in force changed (Config.Overrides: policy.InForce); the
// evaluation loop only queues and signals, so it never waits on assembly
// or on subscribers, and no upstream knows the publisher. RunOnce re-reads
// each dirty service's snapshot (the assembler's input: the evaluator's
// verdicts with policy's overrides in force applied, policy.Applied),
// updates the assembler, and drains whatever the assembler says
// is due (a withdrawal at once when its service's withdrawal queue is idle,
// otherwise at the end of the short window after the last one; additions
// on their window). A transition wakes the worker at once, whatever timer
// it had set for the next due change, so a withdrawal due at once never
// waits for one.
//
// Publication never waits for PostgreSQL. Versions come from an ownership
// epoch taken once, before the first publication (Prepare), and a local
// counter (assembler.Versions; the design is in assembler's doc.go): no
// I/O is done under the publisher's lock, and the next epoch is taken in
// the background long before the counter runs out. Each service's last
// published view is saved to PostgreSQL (published_views) by a second
// loop, coalesced per service and retried while the database is away, and
// restored into the assembler by Prepare after a restart, so that
// last_instance and the next delta compare with what clients hold. The
// restored views are not handed to the streaming hub: it serves only what
// is published after the rebuild.
//
// Several replicas: only a service's owner publishes it
// (Config.Owns). A loss forgets the service at once (OwnershipChanged); a
// gain is adopted (adopt) with a fresh epoch and the newest of the saved
// and the hub's view restored, so the new owner's first version is a
// delta above everything the previous owner published, marked Rebased for
// the hub. See docs/replicas.md, "Publication follows ownership".
package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/guardlog"
	"github.com/musterhq/muster/internal/lagstats"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/tenure"
	"github.com/musterhq/muster/internal/worker"
)

// AlarmWithdrawalBudget is raised when a withdrawal reached subscribers
// later than the propagation budget allows (ADR-11).
const AlarmWithdrawalBudget = "withdrawal_budget"

// Config configures a Publisher.
type Config struct {
	// Snapshot reads a service's endpoints and verdicts, as the assembler
	// takes them (the evaluator's Snapshot).
	Snapshot func(service string) (assembler.ServiceInput, bool)
	// Ready, when set, says whether Snapshot can answer for every service
	// (the evaluator has rebuilt: Evaluator.Ready). Until it does,
	// RunOnce assembles nothing and keeps what is dirty: a Snapshot that
	// is false because the evaluator is still rebuilding must not be
	// taken for a service that no longer exists, whose view would be
	// published emptied (a restarted replica adopting its
	// shards published an empty view of each).
	Ready func() bool
	// Changes, when set, is where the publisher pulls what changed (the
	// evaluator): RunOnce takes it first, and the worker wakes on Changed.
	Changes Changes
	Hub     *stream.Hub
	// Pool is where version epochs come from and where each service's
	// last published view is saved for a restart; the publishing path
	// never waits for it.
	Pool    *pgxpool.Pool
	Options assembler.Options
	// DBTimeout bounds each database call (taking an epoch, loading or
	// saving views): 5 s.
	DBTimeout time.Duration
	// SaveEvery is how often the published views not yet saved are
	// written (coalesced: only each service's newest one): 1 s. While
	// PostgreSQL is away the saves back off up to MaxSaveBackoff (10 s).
	SaveEvery      time.Duration
	MaxSaveBackoff time.Duration
	// WithdrawalBudget is the lag (first failed sample -> published
	// withdrawal) past which the withdrawal_budget alarm is raised: 5 s.
	WithdrawalBudget time.Duration
	// Lags, when set, also keeps each withdrawal's lag per service for
	// the admin UI (lagstats.Published).
	Lags       *lagstats.Recorder
	Now        func() time.Time
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Traffic, when set, gives the current per-zone traffic weights
	// (shift-backs, ADR-13); without it they are 1 everywhere. They are
	// read once per RunOnce, so every service assembled together sees one
	// set of weights, and every known service is assembled again when its
	// Revision moved.
	Traffic Traffic
	// Overrides, when set, is the overrides in force (policy.InForce),
	// which Snapshot has applied (policy.Applied): a service whose
	// overrides changed is assembled again, and nothing is assembled
	// before the copy has been loaded, so the first views after a
	// restart already carry every override.
	Overrides Overrides
	// GuardEvents, when set, is told of each zone whose fraction guard
	// tripped or cleared since the last RunOnce (from the publisher's
	// loop: it must not block), for the guard-trip history (guardlog).
	GuardEvents func([]guardlog.Event)
	// Owns, when set, says whether this replica owns a service's
	// publication now (ownership.Manager): a service it does
	// not own is neither assembled nor published. Nil: every service (a
	// replica alone).
	Owns func(service string) bool
	// Services, with Owns, lists the services known upstream (the
	// evaluator's), so that the services a gain brings are assembled.
	Services func() []string
	// HandingOver, when set, says whether a service Owns allows is one
	// this replica handed over to a new owner and publishes only until
	// that owner has (ownership.Manager.HandingOver): as soon as the hub
	// holds a version of it above this publisher's, the new owner has
	// published, and this replica forgets the service.
	HandingOver func(service string) bool

	// Adopting, when set, is called by each adoption of gained shards
	// (and the start's) before the services they bring are assembled,
	// with Owns: the evaluator restores the admissions on record of the
	// instances it holds as awaiting their first success
	// (evaluator.RestoreAdmissions), so that the new owner's first view
	// does not take out what the previous owner admitted. An error fails
	// the adoption, which is retried.
	Adopting func(ctx context.Context, owns func(service string) bool) error

	// Signer, when set, is the region's key: every version is signed
	// with it as it is encoded (assembler.SignWith, as Replica), each
	// version epoch is recorded as a sealed tenure of the shards this
	// replica holds when it is taken (internal/tenure), and a view is
	// restored only if it is signed by a key of ViewKeys. Nil (a keyless
	// replica): unsigned views, as before.
	Signer  seal.Signer
	Replica string
	// ViewKeys are the keys a restored view's signature is believed from
	// (the Signer's own and the trusted public keys).
	ViewKeys seal.Keys
	// AcceptUnsigned also restores unsigned views: a rolling upgrade from
	// a release that signs none (MUSTER_PEER_TRUST=upgrade).
	AcceptUnsigned bool
	// ShardOf is the shard of a service (false while the shard count is
	// not known), for the tenures: with a Signer and Owns, a service is
	// published only under an epoch recorded as a tenure of its shard.
	ShardOf func(service string) (int, bool)
}

// AlarmSavedViewForged is raised, per service, when a saved or held view
// a new owner would restore is not signed by a trusted key (or does not
// match its signature): it is ignored, never used as a base, and the
// service's first version is a full view.
const AlarmSavedViewForged = "saved_view_forged"

// Changes is the evaluator as the publisher pulls from it.
type Changes interface {
	// Changed receives a value when changes wait to be taken.
	Changed() <-chan struct{}
	// TakeChanges returns what changed since the last call.
	TakeChanges() evaluator.Changes
}

// Traffic is the shift-backs (shift.Service) as the publisher reads them.
type Traffic interface {
	Weights() assembler.TrafficWeights
	// Revision moves whenever the weights may have changed.
	Revision() uint64
	// Changed receives a value after Revision moved.
	Changed() <-chan struct{}
}

// Overrides is the overrides in force (policy.InForce) as the publisher
// follows them.
type Overrides interface {
	// Loaded reports whether they have been read at least once.
	Loaded() bool
	// ServicesChangedSince names the services whose overrides changed
	// after revision rev, and returns the revision to pass next.
	ServicesChangedSince(rev uint64) ([]string, uint64)
	// Changed receives a value after they changed.
	Changed() <-chan struct{}
}

// Publisher is the assembly worker.
type Publisher struct {
	cfg     Config
	log     *slog.Logger
	metrics metrics

	mu        sync.Mutex
	dirty     map[string]struct{}
	known     map[string]struct{} // services assembled and not removed
	firstFail map[uuid.UUID]time.Time
	asm       *assembler.Assembler
	budget    map[string]assembler.Alarm // open withdrawal_budget alarms by service
	guards    map[[2]string]struct{}     // zones whose guard is tripped, as last told to GuardEvents
	// versions is nil until Prepare has taken an epoch and restored the
	// saved views: nothing is published before.
	versions *assembler.Versions
	// heldEpoch is an epoch Prepare took but could not use yet (loading
	// the saved views failed): the retry uses it rather than another, so
	// a database outage at start does not spend one epoch per retry.
	heldEpoch uint64
	// beforeLoad, when set (tests), runs before Prepare loads the saved
	// views; an error fails the load.
	beforeLoad func() error
	// gained counts the gains of shards told by OwnershipChanged;
	// adopted is the count the last adoption covered. While they differ,
	// a service this process does not hold waits (see adopt).
	gained, adopted uint64
	// rebased holds the services restored by an adoption whose next
	// publication is the first: its delta is Rebased for the hub.
	rebased   map[string]struct{}
	adoptMu   sync.Mutex // one adoption at a time
	adoptWake chan struct{}
	wake      chan struct{}
	// trafficRev is the Traffic revision last assembled with;
	// overridesRev the Overrides revision last taken.
	trafficRev, overridesRev uint64

	// forged holds the open saved_view_forged alarms by service.
	forged map[string]assembler.Alarm
	// tenured is the set of shards recorded as this replica's tenures
	// under the current epoch; nil when tenures are not recorded (no key,
	// or no ownership).
	tenured map[int]bool

	store       viewStore
	runner      worker.Runner
	saveRunner  worker.Runner
	adoptRunner worker.Runner
}

// AlarmEpochsLow is raised while fewer than EpochsLowAt version epochs are
// left: each start (and each epoch used up by 2^31 publications) takes
// one of the 2^21−1 an epoch sequence holds, and once they run out no
// version above what clients hold can be issued.
const AlarmEpochsLow = "version_epochs_low"

// EpochsLowAt is the number of version epochs left below which
// version_epochs_low is raised: a week of restarts once a minute.
const EpochsLowAt = 10_000

// Prepared reports whether the publisher can publish: its version epoch
// is taken and the saved views restored (Prepare succeeded).
func (p *Publisher) Prepared() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.versions != nil
}

// superseded reports whether the hub holds a version of service above
// the last this publisher published: another replica, a newer owner,
// published it since. Called with p.mu held.
func (p *Publisher) supersededLocked(service string) bool {
	f, ok := p.cfg.Hub.View(service)
	if !ok {
		return false
	}
	v, held := p.asm.View(service)
	return !held || f.Version > v.Version
}

// HandingOver lists the services this replica handed over and still
// publishes because the hub holds nothing newer of them yet: the new
// owner has not published them. A replica that stops waits for this to
// be empty (bounded) before it lets its subscribers go.
func (p *Publisher) HandingOver() []string {
	if p.cfg.HandingOver == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, name := range p.asm.Services() {
		if p.cfg.HandingOver(name) && !p.supersededLocked(name) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// EpochsLeft is how many version epochs remain after the one this
// process publishes under (0 before it has one, and when none is left).
func (p *Publisher) EpochsLeft() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.epochsLeftLocked()
}

func (p *Publisher) epochsLeftLocked() uint64 {
	if p.versions == nil {
		return 0
	}
	return assembler.MaxEpoch - p.versions.Floor()>>assembler.CounterBits
}

type metrics struct {
	deltas  *prometheus.CounterVec
	lag     *prometheus.HistogramVec
	shed    prometheus.GaugeFunc
	episode prometheus.CounterFunc
	failed  prometheus.Counter
	unsaved prometheus.GaugeFunc
	saveErr prometheus.Counter
	epoch   prometheus.GaugeFunc
	left    prometheus.GaugeFunc
}

// New returns a stopped Publisher.
func New(cfg Config) (*Publisher, error) {
	if cfg.Snapshot == nil || cfg.Hub == nil || cfg.Pool == nil {
		return nil, errors.New("publisher: Snapshot, Hub and Pool are required")
	}
	if cfg.DBTimeout <= 0 {
		cfg.DBTimeout = 5 * time.Second
	}
	if cfg.SaveEvery <= 0 {
		cfg.SaveEvery = time.Second
	}
	if cfg.MaxSaveBackoff <= 0 {
		cfg.MaxSaveBackoff = 10 * time.Second
	}
	cfg.MaxSaveBackoff = max(cfg.MaxSaveBackoff, cfg.SaveEvery)
	if cfg.WithdrawalBudget == 0 {
		cfg.WithdrawalBudget = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Signer != nil {
		if cfg.Replica == "" {
			return nil, errors.New("publisher: a Signer needs this replica's id")
		}
		log := cfg.Logger.With("worker", "publisher")
		// A local key file signs without I/O; the context is for a KMS
		// behind the same interface, which a publication must not wait on.
		cfg.Options.Sign = assembler.SignWith(cfg.Replica, cfg.Signer.KeyID(),
			func(msg []byte) ([]byte, error) { return cfg.Signer.Sign(context.Background(), msg) },
			func(err error) {
				log.Error("a view is published unsigned: peers and verifying clients will refuse it", "err", err)
			})
		cfg.ViewKeys = cfg.ViewKeys.With(cfg.Signer)
	}
	p := &Publisher{
		cfg: cfg, log: cfg.Logger.With("worker", "publisher"), forged: map[string]assembler.Alarm{},
		dirty: map[string]struct{}{}, known: map[string]struct{}{}, firstFail: map[uuid.UUID]time.Time{},
		asm: assembler.New(cfg.Options), budget: map[string]assembler.Alarm{}, guards: map[[2]string]struct{}{},
		wake: make(chan struct{}, 1), adoptWake: make(chan struct{}, 1), rebased: map[string]struct{}{},
		store: viewStore{pool: cfg.Pool, timeout: cfg.DBTimeout, pending: map[string]savedView{}},
	}
	p.metrics = metrics{
		deltas: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_view_deltas_total", Help: "Deltas published, by queue (withdrawal or addition).",
		}, []string{"queue"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "muster_withdrawal_lag_seconds",
			Help: "First failed sample to published withdrawal, per service.",
			// From 1 ms: a lone withdrawal is published at once (the
			// withdrawal queue's leading edge), a batched one within 50 ms.
			Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 30, 60},
		}, []string{"service"}),
		shed: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_additions_shedding", Help: "1 while the addition window is grown under saturation (a shed episode).",
		}, func() float64 {
			if p.Stats().Shedding {
				return 1
			}
			return 0
		}),
		episode: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "muster_shed_episodes_total", Help: "Shed episodes declared since start.",
		}, func() float64 { return float64(p.Stats().ShedEpisodes) }),
		failed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_publish_failures_total", Help: "Drains that could not publish (the version epoch was used up with no next one held); the changes stay queued.",
		}),
		unsaved: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_published_views_unsaved", Help: "Services whose last published view is not yet saved to PostgreSQL (for a restart).",
		}, func() float64 { return float64(p.store.unsaved()) }),
		saveErr: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_published_view_save_failures_total", Help: "Attempts to save published views (or take the next version epoch) that failed; they are retried.",
		}),
		epoch: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_view_version_epoch", Help: "The epoch in the high bits of the versions this process publishes (0 before it has one).",
		}, func() float64 {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.versions == nil {
				return 0
			}
			return float64(p.versions.Floor() >> assembler.CounterBits)
		}),
		left: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_view_version_epochs_left", Help: "Version epochs left after the one this process publishes under (each start takes one; version_epochs_low is raised below 10,000).",
		}, func() float64 { return float64(p.EpochsLeft()) }),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{p.metrics.deltas, p.metrics.lag, p.metrics.shed, p.metrics.episode, p.metrics.failed,
			p.metrics.unsaved, p.metrics.saveErr, p.metrics.epoch, p.metrics.left} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// take pulls what changed upstream: the evaluator's changes, and every
// known service when the traffic weights moved.
func (p *Publisher) take() {
	if p.cfg.Changes != nil {
		c := p.cfg.Changes.TakeChanges()
		p.transitions(c.Transitions)
		p.markDirty(c.Services)
	}
	if p.cfg.Traffic != nil {
		rev := p.cfg.Traffic.Revision()
		p.mu.Lock()
		moved := rev != p.trafficRev
		p.trafficRev = rev
		p.mu.Unlock()
		if moved {
			p.markKnownDirty()
		}
	}
	if p.cfg.Overrides != nil {
		p.mu.Lock()
		names, rev := p.cfg.Overrides.ServicesChangedSince(p.overridesRev)
		p.overridesRev = rev
		// Only services already assembled: the others carry the overrides
		// in force from their first assembly.
		for _, n := range names {
			if _, ok := p.known[n]; ok {
				p.dirty[n] = struct{}{}
			}
		}
		p.mu.Unlock()
	}
}

// transitions marks the services of ts dirty and tracks each instance's
// first failure, for the withdrawal lag.
func (p *Publisher) transitions(ts []eligibility.Transition) {
	if len(ts) == 0 {
		return
	}
	p.mu.Lock()
	for _, t := range ts {
		id := uuid.UUID(t.Instance)
		switch {
		case t.To == eligibility.Ineligible && !t.FirstFailureAt.IsZero():
			p.firstFail[id] = t.FirstFailureAt
		case t.To.InRotation():
			delete(p.firstFail, id)
		}
		p.dirty[t.Service] = struct{}{}
	}
	p.mu.Unlock()
}

// ServicesChanged marks services dirty: their view may have changed (the
// evaluator's changes say which; tests name them).
func (p *Publisher) ServicesChanged(names []string) {
	p.markDirty(names)
	p.poke()
}

func (p *Publisher) markDirty(names []string) {
	if len(names) == 0 {
		return
	}
	p.mu.Lock()
	for _, n := range names {
		p.dirty[n] = struct{}{}
	}
	p.mu.Unlock()
}

// TrafficChanged marks every known service dirty: a shift moved a zone's
// traffic weight, and each service with instances there needs a new
// version (the others assemble to no change and publish nothing).
// RunOnce does the same when the Traffic revision moved.
func (p *Publisher) TrafficChanged() {
	p.markKnownDirty()
	p.poke()
}

func (p *Publisher) markKnownDirty() {
	p.mu.Lock()
	for n := range p.known {
		p.dirty[n] = struct{}{}
	}
	p.mu.Unlock()
}

func (p *Publisher) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Prepare takes this process's version epoch and restores each service's
// last saved view into the assembler, so that the first publication after
// a restart is compared with what clients hold and numbered above it.
// Until it has succeeded RunOnce publishes nothing (the services it is told
// about wait). Start calls it, retrying with backoff while PostgreSQL is
// away; tests that step the publisher call it once. After a success it
// does nothing until this replica gains shards again (OwnershipChanged),
// when it adopts them (see adopt).
func (p *Publisher) Prepare(ctx context.Context) error { return p.adopt(ctx) }

// OwnershipChanged is told (ownership.Manager.OnChange) that this replica
// gained or lost shards. A loss takes effect at once: every service no
// longer owned is forgotten without publishing anything, so none of its
// versions is published once the callback has returned (the manager calls
// it before anyone else may take the shard). A gain is adopted in the
// background (adopt): until then the services it brought wait.
func (p *Publisher) OwnershipChanged(gained, lost []int) {
	p.mu.Lock()
	if len(lost) > 0 {
		p.forgetUnownedLocked()
	}
	if len(gained) > 0 {
		p.gained++
	}
	p.mu.Unlock()
	if len(gained) > 0 {
		select {
		case p.adoptWake <- struct{}{}:
		default:
		}
	}
}

// LapseEnded is told (ownership.Manager.OnLapseEnd) that shards whose
// tenure had lapsed are no longer this replica's to publish.
func (p *Publisher) LapseEnded([]int) {
	p.mu.Lock()
	p.forgetUnownedLocked()
	p.mu.Unlock()
}

// forgetUnownedLocked forgets every service held that Owns no longer
// allows. Called with p.mu held.
func (p *Publisher) forgetUnownedLocked() {
	if p.cfg.Owns == nil {
		return
	}
	for _, name := range p.asm.Services() {
		if !p.cfg.Owns(name) {
			p.asm.Forget(name)
			delete(p.known, name)
			delete(p.dirty, name)
			delete(p.rebased, name)
			delete(p.budget, name)
		}
	}
}

// adopt makes this replica ready to publish the services it owns and does
// not hold: it takes a fresh version epoch (the sequence hands it out
// above every epoch taken before, so above every version the previous
// owner published: that owner stopped publishing before this replica
// could take the shard) and restores each such service's last view, the
// newer of the one saved in PostgreSQL and the one this replica's hub
// holds (relayed from the previous owner), so that the next version is a
// delta from what clients hold. The first delta after a restore is
// Rebased: the hub vouches for it only at exactly its base.
//
// The first adoption is the start's (Prepare). An epoch taken while the
// views cannot be loaded is kept for the retry, so a database outage
// does not spend one epoch per attempt.
func (p *Publisher) adopt(ctx context.Context) error {
	p.adoptMu.Lock()
	defer p.adoptMu.Unlock()
	p.mu.Lock()
	gen, done := p.gained, p.versions != nil && p.gained == p.adopted
	epoch := p.heldEpoch
	p.mu.Unlock()
	if done {
		return nil
	}
	if epoch == 0 {
		e, err := p.store.takeEpoch(ctx)
		if err != nil {
			return err
		}
		epoch = e
		p.mu.Lock()
		p.heldEpoch = epoch
		p.mu.Unlock()
	}
	vs, err := assembler.NewVersions(epoch)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithTimeout(ctx, p.cfg.DBTimeout)
	defer cancel()
	// Every attempt records the tenures of what is held now: a shard
	// gained since an earlier attempt under the same epoch gets its own.
	tenured, err := p.recordTenures(lctx, epoch)
	if err != nil {
		return err
	}
	if p.beforeLoad != nil {
		if err := p.beforeLoad(); err != nil {
			return err
		}
	}
	if p.cfg.Adopting != nil {
		if err := p.cfg.Adopting(lctx, p.cfg.Owns); err != nil {
			return fmt.Errorf("publisher: restore the admissions of gained services: %w", err)
		}
	}
	views, skipped, err := p.store.load(lctx)
	if err != nil {
		return err
	}
	for _, err := range skipped {
		p.log.Warn("a saved view cannot be restored; its service starts from nothing", "err", err)
	}
	// The hub's views, relayed from their owners, may be newer than the
	// saved ones (saved asynchronously: a SIGKILLed owner's last ones are
	// not). Only a view that verifies is a candidate, so a forged one
	// never hides a genuine older one.
	best := map[string]*assembler.View{}
	var forged []*assembler.View
	for _, v := range views {
		if p.believe(v) {
			best[v.Service] = v
		} else {
			forged = append(forged, v)
		}
	}
	for _, f := range p.cfg.Hub.Snapshot() {
		if b, ok := best[f.Service]; ok && b.Version >= f.Version || p.cfg.Owns != nil && !p.cfg.Owns(f.Service) {
			continue // decode only what this adoption may restore
		}
		var v assembler.View
		if err := json.Unmarshal(f.JSON, &v); err != nil || v.Service != f.Service || v.Version != f.Version {
			p.log.Warn("a relayed view cannot be restored", "service", f.Service, "version", f.Version, "err", err)
			continue
		}
		if !p.believe(&v) {
			forged = append(forged, &v)
			continue
		}
		best[f.Service] = &v
	}
	p.noteForged(forged, best)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.versions != nil && epoch <= p.versions.Floor()>>assembler.CounterBits {
		p.heldEpoch = 0
		return fmt.Errorf("publisher: version epoch %d is not above the current one", epoch)
	}
	restored := 0
	for name, v := range best {
		if p.cfg.Owns != nil && !p.cfg.Owns(name) || p.asm.Holds(name) {
			continue
		}
		if v.Version >= vs.Floor() {
			// Only a database restored out of step with its sequence
			// can hold this; clients get a full view instead.
			p.log.Warn("a saved view is not below this process's epoch; not restored",
				"service", v.Service, "version", v.Version, "epoch", epoch)
			continue
		}
		if err := p.asm.Restore(v); err != nil {
			p.log.Warn("a saved view cannot be restored; its service starts from nothing", "err", err)
			continue
		}
		p.rebased[name] = struct{}{}
		restored++
	}
	first := p.versions == nil
	p.versions, p.heldEpoch, p.adopted = vs, 0, gen
	p.tenured = tenured
	// Every owned service is assembled afresh: those restored publish
	// their first version from the restored base, the others their first
	// view.
	if p.cfg.Services != nil {
		for _, name := range p.cfg.Services() {
			if p.cfg.Owns == nil || p.cfg.Owns(name) {
				p.dirty[name] = struct{}{}
			}
		}
	}
	left := assembler.MaxEpoch - epoch
	if first {
		p.log.Info("publisher prepared", "epoch", epoch, "epochs_left", left, "first_version", vs.Floor(), "restored_views", restored)
	} else {
		p.log.Info("adopted the services of gained shards", "epoch", epoch, "epochs_left", left, "first_version", vs.Floor(), "restored_views", restored)
	}
	if left < EpochsLowAt {
		p.log.Warn("few version epochs are left; see the version_epochs_low alarm", "epochs_left", left)
	}
	return nil
}

// adoptLoop adopts gains as they are told, retrying with backoff while
// PostgreSQL is away.
func (p *Publisher) adoptLoop(ctx context.Context) {
	backoff := time.Duration(0)
	// A gain told while the start's Prepare was under way (it adopts only
	// the gains it saw begin) is noticed by the next tick at the latest.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var retry <-chan time.Time
		if backoff > 0 {
			retry = time.After(backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-p.adoptWake:
		case <-retry:
		case <-tick.C:
		}
		p.mu.Lock()
		pending := p.gained != p.adopted
		p.mu.Unlock()
		if !pending {
			backoff = 0
			continue
		}
		if err := p.adopt(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			p.log.Warn("adopt gained shards; retrying", "err", err, "in", backoff)
			continue
		}
		backoff = 0
		p.poke()
	}
}

// Start prepares (see Prepare) and then runs the worker until ctx ends or
// Stop is called; a second loop saves published views and takes the next
// version epoch when one is wanted.
func (p *Publisher) Start(ctx context.Context) error {
	if err := p.saveRunner.Start(ctx, p.saveLoop); err != nil {
		return err
	}
	if err := p.adoptRunner.Start(ctx, p.adoptLoop); err != nil {
		return err
	}
	return p.runner.Start(ctx, p.run)
}

// Stop ends the worker and waits, saving what it can of the views not yet
// saved. Safe to call twice or before Start.
func (p *Publisher) Stop() {
	p.runner.Stop()
	p.adoptRunner.Stop()
	p.saveRunner.Stop()
}

func (p *Publisher) run(ctx context.Context) {
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 10*time.Second) {
		err := p.Prepare(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		p.log.Warn("prepare to publish; retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var changes, traffic, overrides <-chan struct{}
	if p.cfg.Changes != nil {
		changes = p.cfg.Changes.Changed()
	}
	if p.cfg.Traffic != nil {
		traffic = p.cfg.Traffic.Changed()
	}
	if p.cfg.Overrides != nil {
		overrides = p.cfg.Overrides.Changed()
	}
	for {
		p.RunOnce()
		wait := time.Hour
		if due := p.nextDue(); !due.IsZero() {
			wait = max(due.Sub(p.cfg.Now()), time.Millisecond)
		}
		if p.cfg.Ready != nil && !p.cfg.Ready() {
			// What waited for the rebuild goes out once it is done.
			wait = min(wait, 100*time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-changes:
		case <-traffic:
		case <-overrides:
		case <-timer.C:
		}
	}
}

// saveLoop saves published views every SaveEvery, backing off while
// PostgreSQL is away, and saves what it can once more when stopped.
func (p *Publisher) saveLoop(ctx context.Context) {
	tick := time.NewTicker(p.cfg.SaveEvery)
	defer tick.Stop()
	var retryAt time.Time
	backoff := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), p.cfg.DBTimeout)
			err := p.store.flush(fctx)
			cancel()
			if err != nil {
				p.log.Warn("save published views at shutdown", "err", err, "unsaved", p.store.unsaved())
			}
			return
		case now := <-tick.C:
			if now.Before(retryAt) {
				continue
			}
		}
		if err := p.SaveOnce(ctx); err != nil {
			if ctx.Err() != nil {
				continue
			}
			p.metrics.saveErr.Inc()
			backoff = min(max(2*backoff, p.cfg.SaveEvery), p.cfg.MaxSaveBackoff)
			retryAt = time.Now().Add(backoff)
			p.log.Warn("save published views; retrying", "err", err, "in", backoff, "unsaved", p.store.unsaved())
			continue
		}
		backoff, retryAt = 0, time.Time{}
	}
}

// SaveOnce takes the next version epoch if one is wanted and writes the
// published views not yet saved (each service's newest). The save loop
// calls it; tests call it to step deterministically. On failure the views
// stay pending.
func (p *Publisher) SaveOnce(ctx context.Context) error {
	return errors.Join(p.takeNextEpoch(ctx), p.store.flush(ctx))
}

// takeNextEpoch takes the next epoch when the current one is more than
// half used, off the publisher's lock, and hands it in.
func (p *Publisher) takeNextEpoch(ctx context.Context) error {
	p.mu.Lock()
	want := p.versions != nil && p.versions.WantEpoch()
	p.mu.Unlock()
	if !want {
		return nil
	}
	e, err := p.store.takeEpoch(ctx)
	if err != nil {
		return err
	}
	// A shard gained since the current epoch was taken is adopted under
	// an epoch of its own, so the shards held now cover what the next
	// epoch will publish.
	if _, err := p.recordTenures(ctx, e); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.versions.AddEpoch(e); err != nil {
		return fmt.Errorf("next version epoch: %w", err)
	}
	p.log.Info("took the next version epoch", "epoch", e)
	return nil
}

func (p *Publisher) nextDue() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asm.NextDue()
}

// RunOnce pulls what changed upstream, assembles every dirty service and
// publishes what is due. The worker calls it; tests call it to step
// deterministically. Before Prepare has succeeded it assembles nothing,
// and the dirty services wait.
func (p *Publisher) RunOnce() {
	p.take()
	if p.cfg.Overrides != nil && !p.cfg.Overrides.Loaded() {
		return // the dirty services wait for the overrides in force
	}
	if p.cfg.Ready != nil && !p.cfg.Ready() {
		return // the dirty services wait for the evaluator's rebuild
	}
	p.mu.Lock()
	if p.versions == nil {
		p.mu.Unlock()
		return
	}
	dirty := make([]string, 0, len(p.dirty))
	adopting := p.gained != p.adopted
	for n := range p.dirty {
		if p.cfg.Owns != nil && !p.cfg.Owns(n) {
			// Not this replica's to publish: its owner does. A gain
			// marks it again.
			delete(p.dirty, n)
			continue
		}
		if p.cfg.HandingOver != nil && p.asm.Holds(n) && p.cfg.HandingOver(n) && p.supersededLocked(n) {
			// Handed over, and the new owner has published: its
			// versions are above this replica's, so what this replica
			// would publish now would only be dropped.
			delete(p.dirty, n)
			continue
		}
		if adopting && !p.asm.Holds(n) {
			continue // waits for the adoption (it may restore a view)
		}
		if !p.tenuredLocked(n) {
			// Owned since a moment ago, and its gain not yet told (the
			// manager says so before it tells): its shard has no tenure
			// under this epoch, so peers would refuse what this replica
			// published. The gain's adoption takes an epoch with one.
			continue
		}
		dirty = append(dirty, n)
		delete(p.dirty, n)
	}
	p.mu.Unlock()
	sort.Strings(dirty)

	now := p.cfg.Now()
	var traffic assembler.TrafficWeights
	if p.cfg.Traffic != nil && len(dirty) > 0 {
		traffic = p.cfg.Traffic.Weights()
	}
	for _, name := range dirty {
		in, ok := p.cfg.Snapshot(name)
		p.mu.Lock()
		if !ok {
			p.asm.RemoveService(name, now)
			delete(p.known, name)
			p.mu.Unlock()
			continue
		}
		p.known[name] = struct{}{}
		// The snapshot is the assembler's input, handed out fresh: only
		// what the publisher itself tracks is added.
		in.Traffic = traffic
		for i := range in.Instances {
			in.Instances[i].FirstFailureAt = p.firstFail[in.Instances[i].ID]
		}
		p.asm.Update(in, now)
		p.mu.Unlock()
	}

	if len(dirty) > 0 {
		p.noteGuards(now)
	}

	p.mu.Lock()
	published, err := p.asm.Drain(now, p.versions)
	saves := make([]savedView, len(published))
	rebased := make([]bool, len(published))
	for i, pub := range published {
		if _, ok := p.rebased[pub.View.Service]; ok {
			rebased[i] = pub.Delta != nil
			delete(p.rebased, pub.View.Service)
		}
		saves[i] = savedView{service: pub.View.Service, version: pub.View.Version, view: pub.ViewJSON, at: pub.View.GeneratedAt}
		if _, held := p.asm.View(pub.View.Service); !held {
			saves[i].view = nil // removed: the emptied view was its last
		}
	}
	p.mu.Unlock()
	if err != nil {
		p.metrics.failed.Inc()
		p.log.Warn("publish views; the changes stay queued", "err", err)
		return
	}
	if len(published) == 0 {
		return
	}
	p.store.put(saves)
	updates := make([]stream.Update, 0, len(published))
	for i, pub := range published {
		u := stream.Update{View: &stream.Frame{Kind: stream.KindView, Service: pub.View.Service, Version: pub.View.Version, JSON: pub.ViewJSON}, Rebased: rebased[i]}
		if pub.Delta != nil {
			u.Delta = &stream.Frame{Kind: stream.KindDelta, Service: pub.Delta.Service, FromVersion: pub.Delta.FromVersion,
				Version: pub.Delta.Version, JSON: pub.DeltaJSON, Withdrawal: pub.Delta.Withdrawal}
			queue := "addition"
			if pub.Delta.Withdrawal {
				queue = "withdrawal"
			}
			p.metrics.deltas.WithLabelValues(queue).Inc()
		}
		updates = append(updates, u)
		p.noteLags(pub.View.Service, pub.WithdrawalLags, now)
	}
	p.cfg.Hub.Publish(updates)
}

// noteGuards tells GuardEvents which zones' guards tripped or cleared:
// the assembler decides the guard on Update, so its open fraction_guard
// alarms are compared with those last told.
func (p *Publisher) noteGuards(now time.Time) {
	if p.cfg.GuardEvents == nil {
		return
	}
	p.mu.Lock()
	var events []guardlog.Event
	open := map[[2]string]struct{}{}
	for _, a := range p.asm.Alarms() {
		if a.Kind != assembler.AlarmFractionGuard {
			continue
		}
		k := [2]string{a.Service, a.Zone}
		open[k] = struct{}{}
		if _, seen := p.guards[k]; !seen {
			events = append(events, guardlog.Event{Service: a.Service, Zone: a.Zone, Tripped: true, At: a.Since, Detail: a.Detail})
		}
	}
	for k := range p.guards {
		if _, still := open[k]; !still {
			events = append(events, guardlog.Event{Service: k[0], Zone: k[1], At: now})
		}
	}
	p.guards = open
	p.mu.Unlock()
	if len(events) > 0 {
		sort.SliceStable(events, func(i, j int) bool { return events[i].At.Before(events[j].At) })
		p.cfg.GuardEvents(events)
	}
}

// noteLags records withdrawal lags and raises (or clears) the
// withdrawal_budget alarm for the service.
func (p *Publisher) noteLags(service string, lags []time.Duration, now time.Time) {
	if len(lags) == 0 {
		return
	}
	worst := time.Duration(0)
	for _, l := range lags {
		p.metrics.lag.WithLabelValues(service).Observe(l.Seconds())
		p.cfg.Lags.Observe(service, lagstats.Published, l)
		worst = max(worst, l)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if worst > p.cfg.WithdrawalBudget {
		if _, open := p.budget[service]; !open {
			p.budget[service] = assembler.Alarm{Kind: AlarmWithdrawalBudget, Service: service, Since: now,
				Detail: "a withdrawal was published " + worst.Round(time.Millisecond).String() + " after the first failed sample; the budget is " + p.cfg.WithdrawalBudget.String()}
		}
	} else {
		delete(p.budget, service)
	}
}

// Alarms returns the open alarms: the assembler's (fraction_guard,
// last_instance) and withdrawal_budget.
func (p *Publisher) Alarms() []assembler.Alarm {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.asm.Alarms()
	for _, a := range p.budget {
		out = append(out, a)
	}
	for _, a := range p.forged {
		out = append(out, a)
	}
	if p.versions != nil {
		if left := p.epochsLeftLocked(); left < EpochsLowAt {
			out = append(out, assembler.Alarm{Kind: AlarmEpochsLow, Detail: fmt.Sprintf(
				"%d version epochs are left of %d: each start of a muster process takes one; when none is left no process can publish a version above what clients hold (renumbering needs every client to resubscribe from version 0)",
				left, assembler.MaxEpoch)})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		if out[i].Service != out[j].Service {
			return out[i].Service < out[j].Service
		}
		return out[i].Zone < out[j].Zone
	})
	return out
}

// Stats reports the assembler's queues.
func (p *Publisher) Stats() assembler.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asm.Stats()
}

// View returns a service's last published view (shared and immutable), for
// readers such as the admin UI that want its zones and version without
// decoding the encoded frame.
func (p *Publisher) View(service string) (*assembler.View, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asm.View(service)
}

// recordTenures records epoch as a sealed tenure of every shard this
// replica holds now (internal/tenure), before any version of it is
// published: peers believe a view only within such a tenure. Without a
// key, or without ownership (a replica alone), there is nothing to
// record.
func (p *Publisher) recordTenures(ctx context.Context, epoch uint64) (map[int]bool, error) {
	if p.cfg.Signer == nil || p.cfg.Owns == nil || p.cfg.ShardOf == nil {
		return nil, nil
	}
	shards, err := tenure.Record(ctx, p.cfg.Pool, p.cfg.Signer, p.cfg.Replica, epoch)
	if err != nil {
		return nil, err
	}
	p.log.Debug("recorded tenures", "epoch", epoch, "shards", len(shards))
	out := make(map[int]bool, len(shards))
	for _, s := range shards {
		out[s] = true
	}
	return out, nil
}

// tenuredLocked reports whether service may be published under the
// current epoch: its shard's tenure under it is recorded (or tenures are
// not recorded at all). Called with p.mu held.
func (p *Publisher) tenuredLocked(service string) bool {
	if p.tenured == nil {
		return true
	}
	s, ok := p.cfg.ShardOf(service)
	return ok && p.tenured[s]
}

// believe reports whether a view may be restored as a base: with a key,
// only one signed by a trusted key over exactly its contents (or, in a
// rolling upgrade, an unsigned one).
func (p *Publisher) believe(v *assembler.View) bool {
	if p.cfg.Signer == nil {
		return true
	}
	_, err := assembler.VerifyView(p.cfg.ViewKeys, v)
	if err == nil || p.cfg.AcceptUnsigned && errors.Is(err, assembler.ErrUnsigned) {
		return true
	}
	p.log.Warn("a saved view is not signed by the region's key; it is ignored, never used as a base",
		"service", v.Service, "version", v.Version, "err", err)
	return false
}

// noteForged raises saved_view_forged for each view refused by believe,
// and ends it for the services whose view an adoption believed.
func (p *Publisher) noteForged(views []*assembler.View, believed map[string]*assembler.View) {
	now := p.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for name := range believed {
		delete(p.forged, name)
	}
	for _, v := range views {
		if _, open := p.forged[v.Service]; open {
			continue
		}
		p.forged[v.Service] = assembler.Alarm{Kind: AlarmSavedViewForged, Service: v.Service, Since: now, Detail: fmt.Sprintf(
			"a saved or relayed view of %s (version %d) is not signed by the region's key over its contents: it was ignored, and this replica publishes the service from its own verdicts (clients get a full view)",
			v.Service, v.Version)}
	}
}
