// Package publisher is the worker between evaluation and propagation: it
// turns the evaluator's changes into assembled, versioned views (through the
// pure assembler) and hands them to the streaming hub.
//
// The evaluator calls it as its Sink from the evaluation loop; those calls
// only mark services dirty and wake the worker, so evaluation never waits
// on assembly or on subscribers. The worker re-reads each dirty service's
// snapshot, updates the assembler, and drains whatever the assembler says
// is due (withdrawals within their short batching window, additions on
// theirs), reserving versions from the region-wide counter.
package publisher

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/assembler"
	"github.com/musterhq/muster/eligibility"
	"github.com/musterhq/muster/evaluator"
	"github.com/musterhq/muster/guardlog"
	"github.com/musterhq/muster/stream"
	"github.com/musterhq/muster/worker"
)

// AlarmWithdrawalBudget is raised when a withdrawal reached subscribers
// later than the propagation budget allows (ADR-11).
const AlarmWithdrawalBudget = "withdrawal_budget"

// Config configures a Publisher.
type Config struct {
	// Snapshot reads a service's endpoints and verdicts (the evaluator's
	// Snapshot).
	Snapshot func(service string) (evaluator.ServiceSnapshot, bool)
	Hub      *stream.Hub
	Versions assembler.VersionSource
	Options  assembler.Options
	// WithdrawalBudget is the lag (first failed sample -> published
	// withdrawal) past which the withdrawal_budget alarm is raised: 5 s.
	WithdrawalBudget time.Duration
	Now              func() time.Time
	Logger           *slog.Logger
	Registerer       prometheus.Registerer
	// Traffic returns the current per-zone traffic weights (shift-backs,
	// ADR-13); nil means 1 everywhere. It is read once per RunOnce, so
	// every service assembled together sees one set of weights.
	Traffic func() assembler.TrafficWeights
	// GuardEvents, when set, is told of each zone whose fraction guard
	// tripped or cleared since the last RunOnce (from the publisher's
	// loop: it must not block), for the guard-trip history (guardlog).
	GuardEvents func([]guardlog.Event)
}

// Publisher is the assembly worker. It implements evaluator.Sink.
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
	wake      chan struct{}

	runner worker.Runner
}

type metrics struct {
	deltas  *prometheus.CounterVec
	lag     *prometheus.HistogramVec
	shed    prometheus.GaugeFunc
	episode prometheus.CounterFunc
	failed  prometheus.Counter
}

// New returns a stopped Publisher.
func New(cfg Config) (*Publisher, error) {
	if cfg.Snapshot == nil || cfg.Hub == nil || cfg.Versions == nil {
		return nil, errors.New("publisher: Snapshot, Hub and Versions are required")
	}
	if cfg.WithdrawalBudget == 0 {
		cfg.WithdrawalBudget = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Publisher{
		cfg: cfg, log: cfg.Logger.With("worker", "publisher"),
		dirty: map[string]struct{}{}, known: map[string]struct{}{}, firstFail: map[uuid.UUID]time.Time{},
		asm: assembler.New(cfg.Options), budget: map[string]assembler.Alarm{}, guards: map[[2]string]struct{}{},
		wake: make(chan struct{}, 1),
	}
	p.metrics = metrics{
		deltas: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_view_deltas_total", Help: "Deltas published, by queue (withdrawal or addition).",
		}, []string{"queue"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "muster_withdrawal_lag_seconds",
			Help:    "First failed sample to published withdrawal, per service.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 30, 60},
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
			Name: "muster_publish_failures_total", Help: "Drains that could not publish (no versions could be reserved); the changes stay queued.",
		}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{p.metrics.deltas, p.metrics.lag, p.metrics.shed, p.metrics.episode, p.metrics.failed} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// Transitions implements evaluator.Sink.
func (p *Publisher) Transitions(ts []eligibility.Transition) {
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
	p.poke()
}

// ServicesChanged implements evaluator.Sink.
func (p *Publisher) ServicesChanged(names []string) {
	p.mu.Lock()
	for _, n := range names {
		p.dirty[n] = struct{}{}
	}
	p.mu.Unlock()
	p.poke()
}

// TrafficChanged marks every known service dirty: a shift moved a zone's
// traffic weight, and each service with instances there needs a new
// version (the others assemble to no change and publish nothing).
func (p *Publisher) TrafficChanged() {
	p.mu.Lock()
	for n := range p.known {
		p.dirty[n] = struct{}{}
	}
	p.mu.Unlock()
	p.poke()
}

func (p *Publisher) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Start runs the worker until ctx ends or Stop is called.
func (p *Publisher) Start(ctx context.Context) error { return p.runner.Start(ctx, p.run) }

// Stop ends the worker and waits. Safe to call twice or before Start.
func (p *Publisher) Stop() { p.runner.Stop() }

func (p *Publisher) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.RunOnce()
		wait := time.Hour
		if due := p.nextDue(); !due.IsZero() {
			wait = max(due.Sub(p.cfg.Now()), time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-timer.C:
		}
	}
}

func (p *Publisher) nextDue() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asm.NextDue()
}

// RunOnce assembles every dirty service and publishes what is due. The
// worker calls it; tests call it to step deterministically.
func (p *Publisher) RunOnce() {
	p.mu.Lock()
	dirty := make([]string, 0, len(p.dirty))
	for n := range p.dirty {
		dirty = append(dirty, n)
	}
	clear(p.dirty)
	p.mu.Unlock()
	sort.Strings(dirty)

	now := p.cfg.Now()
	var traffic assembler.TrafficWeights
	if p.cfg.Traffic != nil && len(dirty) > 0 {
		traffic = p.cfg.Traffic()
	}
	for _, name := range dirty {
		snap, ok := p.cfg.Snapshot(name)
		p.mu.Lock()
		if !ok {
			p.asm.RemoveService(name, now)
			delete(p.known, name)
			p.mu.Unlock()
			continue
		}
		p.known[name] = struct{}{}
		in := assembler.ServiceInput{Name: name, MinHealthyFraction: snap.MinHealthyFraction, Capabilities: snap.Capabilities,
			Instances: make([]assembler.InstanceInput, len(snap.Instances)), Traffic: traffic}
		for i, ep := range snap.Instances {
			in.Instances[i] = assembler.InstanceInput{
				ID: ep.ID, Address: ep.Address, Port: ep.Port, Zone: ep.Zone, State: ep.State, Weight: ep.Weight,
				HealthKnown: ep.HealthKnown, Quarantined: ep.Quarantined, FirstFailureAt: p.firstFail[ep.ID],
				LeaseExpired: ep.LeaseExpired,
			}
			if o := ep.Override; o != nil {
				in.Instances[i].Override = &assembler.Override{ID: o.ID, Action: o.Action, Reason: o.Reason()}
			}
		}
		p.asm.Update(in, now)
		p.mu.Unlock()
	}

	if len(dirty) > 0 {
		p.noteGuards(now)
	}

	p.mu.Lock()
	published, err := p.asm.Drain(now, p.cfg.Versions)
	p.mu.Unlock()
	if err != nil {
		p.metrics.failed.Inc()
		p.log.Warn("publish views; the changes stay queued", "err", err)
		return
	}
	if len(published) == 0 {
		return
	}
	updates := make([]stream.Update, 0, len(published))
	for _, pub := range published {
		u := stream.Update{View: &stream.Frame{Kind: stream.KindView, Service: pub.View.Service, Version: pub.View.Version, JSON: pub.ViewJSON}}
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
