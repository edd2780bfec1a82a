package routingcontrol

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/worker"
)

// Defaults of Config.
const (
	DefaultInterval = 5 * time.Second
	DefaultTimeout  = 2 * time.Second
)

// Alarm kinds.
const (
	// AlarmStale is raised while no good reading has come for longer than
	// Config.StaleAfter: the controls in force are the last good ones (or,
	// with none, every region On), and may not be what the source says.
	AlarmStale = "routing_control_stale"
	// AlarmAllOff is raised while the source says every known region is
	// Off: taken for a mistake (at least one region must stay On, as
	// ARC's safety rules require), the previous controls stay in force.
	AlarmAllOff = "routing_control_all_off"
)

// ReasonAllOff is the read-failure reason of a reading refused by the
// safety rule.
const ReasonAllOff = "all_off"

// auditActor is the actor of the audit rows.
const auditActor = "system:routing-control"

// Audit actions.
const (
	ActionChange  = "region.routing_control"
	ActionRefused = "region.routing_control_all_off"
)

// Auditor appends to the audit log (audit.Log).
type Auditor interface {
	Append(ctx context.Context, now time.Time, e audit.Entry) (audit.Event, error)
}

// Config configures Controls.
type Config struct {
	// Source is where the controls are read; required.
	Source Source
	// Interval is how often the source is read: DefaultInterval (5 s).
	Interval time.Duration
	// Timeout bounds one read: DefaultTimeout (2 s), never above
	// Interval.
	Timeout time.Duration
	// StaleAfter is how long without a good reading before the state is
	// stale (AlarmStale): three intervals, at least 15 s.
	StaleAfter time.Duration
	// Regions are the regions known besides those the source names (this
	// muster's own, its peers): each is On unless the source says Off, and
	// each counts for the safety rule.
	Regions []string
	// Replica names this replica in the audit rows.
	Replica string
	// Audit, when set, receives a row per change (and per refused
	// all-off reading); rows that cannot be written now (PostgreSQL
	// away) are kept, up to 1000, and written at a later read.
	Audit Auditor
	// Owns, when set, reports whether this replica owns a key: only the
	// owner of AuditOwnershipKey writes the rows (every replica reads the
	// same source, and would write each change once per replica). A row
	// waits up to a minute for this replica to own the key (at start,
	// before shard leases are read), then is left to the owner. Nil: this
	// replica writes every row (it is alone).
	Owns       func(key string) bool
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now is the clock: time.Now.
	Now func() time.Time
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	if c.Source == nil {
		return errors.New("routingcontrol: Source is required")
	}
	if c.Interval < 0 || c.Timeout < 0 || c.StaleAfter < 0 {
		return errors.New("routingcontrol: durations must not be negative")
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	c.Timeout = min(c.Timeout, c.Interval)
	if c.StaleAfter == 0 {
		c.StaleAfter = max(3*c.Interval, 15*time.Second)
	}
	for _, r := range c.Regions {
		if !ValidRegion(r) {
			return fmt.Errorf("routingcontrol: region %q is not a region name", r)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Change is one region's control changing.
type Change struct {
	Region   string    `json:"region"`
	From     State     `json:"from"`
	To       State     `json:"to"`
	At       time.Time `json:"at"`
	Revision string    `json:"revision,omitempty"`
}

// RegionStatus is one region's control as in force here.
type RegionStatus struct {
	Region string `json:"region"`
	State  State  `json:"state"`
	// Since is when it took this state here (for a region On by default,
	// when this replica first knew of it).
	Since time.Time `json:"since"`
	// Named: the last good reading names the region (otherwise it is On
	// because the source does not name it).
	Named bool `json:"named"`
}

// Status is the controls in force and the state of their source, for GET
// /v1/routing-controls.
type Status struct {
	Source          string  `json:"source"`
	Location        string  `json:"location"`
	IntervalSeconds float64 `json:"interval_seconds"`
	// LastRead is the last good reading's time; LastAttempt the last
	// read's, good or not.
	LastRead    time.Time `json:"last_read,omitzero"`
	LastAttempt time.Time `json:"last_attempt,omitzero"`
	Revision    string    `json:"revision,omitempty"`
	// Stale: no good reading for longer than StaleSeconds; the controls
	// below are the last good ones (fail static).
	Stale        bool    `json:"stale"`
	StaleSeconds float64 `json:"stale_after_seconds"`
	// LastError is why the last read failed, if it did.
	LastError string `json:"last_error,omitempty"`
	// AllOffRefused: the source says every region is Off; refused by the
	// safety rule.
	AllOffRefused bool           `json:"all_off_refused"`
	Regions       []RegionStatus `json:"regions"`
}

type regionState struct {
	state State
	since time.Time
	named bool
}

// Controls reads a Source every interval and keeps the controls in force.
type Controls struct {
	cfg     Config
	log     *slog.Logger
	metrics metrics
	runner  worker.Runner

	mu          sync.Mutex
	regions     map[string]regionState
	born        time.Time
	lastGood    time.Time
	lastAttempt time.Time
	revision    string
	lastErr     error
	allOffSince time.Time
	listeners   []func(Change)
	pending     []pendingEntry
}

// AuditOwnershipKey is what the routing controls' audit rows hash onto
// the region's shards as: the replica owning it writes them
// (Config.Owns). A service name cannot take this form (no colon).
const AuditOwnershipKey = "routing-control:audit"

// ownerWait is how long a row waits for this replica to own
// AuditOwnershipKey before it is left to the owner.
const ownerWait = time.Minute

type pendingEntry struct {
	at time.Time
	e  audit.Entry
}

// maxPending bounds the audit rows kept while they cannot be written.
const maxPending = 1000

// New returns Controls; Start runs them. Until the first good reading
// every region is On.
func New(cfg Config) (*Controls, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Controls{cfg: cfg, log: cfg.Logger.With("worker", "routing-control", "source", cfg.Source.Kind()+":"+cfg.Source.Location()),
		regions: map[string]regionState{}, born: cfg.Now()}
	for _, r := range cfg.Regions {
		c.regions[r] = regionState{state: On, since: c.born}
	}
	var err error
	if c.metrics, err = newMetrics(cfg.Registerer, c); err != nil {
		return nil, err
	}
	for r := range c.regions {
		c.metrics.on.WithLabelValues(r).Set(1)
	}
	return c, nil
}

// Start reads the source at once, then every interval, until ctx ends or
// Stop is called.
func (c *Controls) Start(ctx context.Context) error { return c.runner.Start(ctx, c.run) }

// Stop stops reading. Safe to call twice or before Start.
func (c *Controls) Stop() { c.runner.Stop() }

func (c *Controls) run(ctx context.Context) {
	c.RunOnce(ctx)
	worker.Every(ctx, c.cfg.Interval, c.RunOnce)
}

// On reports whether region's control is On: true for a region the source
// does not name, and while nothing good was ever read.
func (c *Controls) On(region string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.regions[region]
	return !ok || st.state == On
}

// OnChange registers f, called (from the reading goroutine, outside any
// lock) with every change of a region's control. Register before Start.
func (c *Controls) OnChange(f func(Change)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listeners = append(c.listeners, f)
}

// RunOnce reads the source once and applies what it says, then writes
// the audit rows pending.
func (c *Controls) RunOnce(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	c.mu.Lock()
	last := c.revision
	c.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	reading, err := c.cfg.Source.Read(rctx, last)
	cancel()
	if ctx.Err() != nil {
		return // stopping: not the source's fault
	}
	now := c.cfg.Now()
	var changes []Change
	c.mu.Lock()
	c.lastAttempt = now
	if err != nil {
		c.failed(now, err)
	} else {
		changes = c.apply(now, reading)
	}
	c.metrics.stale.Set(b2f(c.staleLocked(now)))
	listeners := slices.Clone(c.listeners)
	c.mu.Unlock()
	for _, ch := range changes {
		for _, f := range listeners {
			f(ch)
		}
	}
	c.flushAudit(ctx)
}

// failed records a failed read; c.mu held. The controls in force stay.
func (c *Controls) failed(now time.Time, err error) {
	reason := ReasonOf(err)
	c.metrics.failures.WithLabelValues(reason).Inc()
	if c.lastErr == nil || ReasonOf(c.lastErr) != reason {
		c.log.Warn("routing controls could not be read: the last good controls stay in force", "reason", reason, "err", err,
			"last_good", c.lastGood)
	}
	c.lastErr = err
}

// apply applies a good reading; c.mu held.
func (c *Controls) apply(now time.Time, r Reading) []Change {
	if r.NotModified {
		// Unchanged since the reading in force, which left a region on.
		c.allOffSince = time.Time{}
		c.metrics.allOff.Set(0)
		c.good(now)
		return nil
	}
	next := map[string]regionState{}
	for region, st := range c.regions {
		next[region] = regionState{state: On, since: st.since}
	}
	for region, st := range r.Regions {
		next[region] = regionState{state: st, named: true, since: now}
	}
	if !slices.ContainsFunc(slices.Collect(maps.Values(next)), func(s regionState) bool { return s.state == On }) && len(next) > 0 {
		err := &ReadError{Reason: ReasonAllOff, Err: fmt.Errorf("the source (revision %s) says every region is off (%s): refused; at least one region must stay on",
			r.Revision, strings.Join(slices.Sorted(maps.Keys(next)), ", "))}
		if c.allOffSince.IsZero() {
			c.allOffSince = now
			c.metrics.allOff.Set(1)
			c.log.Error("routing controls refused: every region would be off; the previous controls stay in force", "revision", r.Revision)
			c.queueAudit(now, audit.Entry{ActorKind: "system", Actor: auditActor, Action: ActionRefused,
				TargetKind: "routing_control", Target: c.cfg.Source.Kind() + ":" + c.cfg.Source.Location(), Outcome: audit.Refused,
				Reason: c.replicaNote() + err.Error(), After: r.Regions})
		}
		c.failed(now, err)
		return nil
	}
	if !c.allOffSince.IsZero() {
		c.log.Info("routing controls accepted again: a region is on", "revision", r.Revision)
	}
	c.allOffSince = time.Time{}
	c.metrics.allOff.Set(0)
	first := c.lastGood.IsZero()
	c.good(now)
	c.revision = r.Revision
	var changes []Change
	for _, region := range slices.Sorted(maps.Keys(next)) {
		st := next[region]
		old, known := c.regions[region]
		if !known {
			old = regionState{state: On, since: now}
		}
		if old.state == st.state {
			st.since = old.since
			next[region] = st
			continue
		}
		st.since = now
		next[region] = st
		ch := Change{Region: region, From: old.state, To: st.state, At: now, Revision: r.Revision}
		changes = append(changes, ch)
		c.metrics.changes.WithLabelValues(region, string(st.state)).Inc()
		c.log.Warn("region routing control changed", "region", region, "from", old.state, "to", st.state, "revision", r.Revision)
		note := ""
		if first {
			note = " (the first good reading since this replica started)"
		}
		c.queueAudit(now, audit.Entry{ActorKind: "system", Actor: auditActor, Action: ActionChange,
			TargetKind: "region", Target: region, Outcome: audit.Accepted,
			Reason: fmt.Sprintf("%sthe routing control source %s:%s (revision %s) turned region %s %s%s", c.replicaNote(),
				c.cfg.Source.Kind(), c.cfg.Source.Location(), r.Revision, region, st.state, note),
			Before: map[string]State{"state": old.state}, After: ch})
	}
	c.regions = next
	for region, st := range next {
		c.metrics.on.WithLabelValues(region).Set(b2f(st.state == On))
	}
	return changes
}

func (c *Controls) good(now time.Time) {
	if c.lastErr != nil {
		c.log.Info("routing controls read again", "after", c.lastErr)
	}
	c.lastGood, c.lastErr = now, nil
}

func (c *Controls) replicaNote() string {
	if c.cfg.Replica == "" {
		return ""
	}
	return "replica " + c.cfg.Replica + ": "
}

// queueAudit keeps e for flushAudit; c.mu held.
func (c *Controls) queueAudit(now time.Time, e audit.Entry) {
	if c.cfg.Audit == nil {
		return
	}
	if len(c.pending) >= maxPending {
		c.metrics.auditDropped.Inc()
		c.pending = c.pending[1:]
	}
	c.pending = append(c.pending, pendingEntry{at: now, e: e})
}

// flushAudit writes the pending rows in order, stopping at the first that
// fails (kept for the next read).
func (c *Controls) flushAudit(ctx context.Context) {
	if c.cfg.Audit == nil {
		return
	}
	if c.cfg.Owns != nil && !c.cfg.Owns(AuditOwnershipKey) {
		now := c.cfg.Now()
		c.mu.Lock()
		c.pending = slices.DeleteFunc(c.pending, func(p pendingEntry) bool { return now.Sub(p.at) >= ownerWait })
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	pending := slices.Clone(c.pending)
	c.mu.Unlock()
	written := 0
	for _, p := range pending {
		actx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		_, err := c.cfg.Audit.Append(actx, p.at, p.e)
		cancel()
		if fence.IsNotOwner(err) {
			// Deposed between the check above and the write: the
			// owner, which read the same change, writes the row.
			c.log.Info("routing control change left to the replica owning the audit key", "target", p.e.Target)
			written++
			continue
		}
		if err != nil {
			c.log.Warn("routing control change not yet in the audit log; kept for the next read", "target", p.e.Target, "err", err)
			break
		}
		written++
	}
	if written == 0 {
		return
	}
	c.mu.Lock()
	// Entries are queued and removed only by RunOnce's goroutine, so
	// the first written are still the first.
	c.pending = c.pending[written:]
	c.mu.Unlock()
}

func (c *Controls) staleLocked(now time.Time) bool {
	ref := c.lastGood
	if ref.IsZero() {
		ref = c.born
	}
	return now.Sub(ref) > c.cfg.StaleAfter
}

// Status returns the controls in force and their source's state.
func (c *Controls) Status() Status {
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Status{Source: c.cfg.Source.Kind(), Location: c.cfg.Source.Location(), IntervalSeconds: c.cfg.Interval.Seconds(),
		LastRead: c.lastGood, LastAttempt: c.lastAttempt, Revision: c.revision, Stale: c.staleLocked(now),
		StaleSeconds: c.cfg.StaleAfter.Seconds(), AllOffRefused: !c.allOffSince.IsZero(), Regions: []RegionStatus{}}
	if c.lastErr != nil {
		st.LastError = c.lastErr.Error()
	}
	for _, region := range slices.Sorted(maps.Keys(c.regions)) {
		r := c.regions[region]
		st.Regions = append(st.Regions, RegionStatus{Region: region, State: r.state, Since: r.since, Named: r.named})
	}
	return st
}

// Alarms returns AlarmStale and AlarmAllOff while they hold.
func (c *Controls) Alarms() []assembler.Alarm {
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []assembler.Alarm
	where := c.cfg.Source.Kind() + ":" + c.cfg.Source.Location()
	if c.staleLocked(now) {
		since, what := c.lastGood, "since "+c.lastGood.UTC().Format(time.RFC3339)
		if since.IsZero() {
			since, what = c.born, "since this replica started"
		}
		why := ""
		if c.lastErr != nil {
			why = " (the last attempt: " + c.lastErr.Error() + ")"
		}
		out = append(out, assembler.Alarm{Kind: AlarmStale, Since: since, Detail: fmt.Sprintf(
			"the routing controls have not been read from %s %s%s: the last good controls stay in force (a missing signal turns no region off)",
			where, what, why)})
	}
	if !c.allOffSince.IsZero() {
		out = append(out, assembler.Alarm{Kind: AlarmAllOff, Since: c.allOffSince, Detail: fmt.Sprintf(
			"%s says every region is off: taken for a mistake (at least one region must stay on); the previous controls stay in force until a reading leaves a region on",
			where)})
	}
	return out
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

type metrics struct {
	on           *prometheus.GaugeVec
	stale        prometheus.Gauge
	allOff       prometheus.Gauge
	failures     *prometheus.CounterVec
	changes      *prometheus.CounterVec
	auditDropped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, c *Controls) (metrics, error) {
	m := metrics{
		on: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "muster_routing_control_on", Help: "1 while the region's out-of-band routing control is On here, 0 while it is Off.",
		}, []string{"region"}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_routing_control_stale", Help: "1 while no good reading of the routing controls has come within the stale threshold (the last good controls stay in force).",
		}),
		allOff: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_routing_control_all_off", Help: "1 while the routing control source says every region is Off, refused by the safety rule.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_routing_control_read_failures_total", Help: "Reads of the routing control source that failed, by reason (unreachable, timeout, status, malformed, too_large, missing, all_off).",
		}, []string{"reason"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_routing_control_changes_total", Help: "Changes of a region's routing control, by region and new state.",
		}, []string{"region", "state"}),
		auditDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_routing_control_audit_dropped_total", Help: "Routing control audit rows dropped because more than 1000 were waiting for the audit log.",
		}),
	}
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "muster_routing_control_read_age_seconds", Help: "Seconds since the last good reading of the routing controls (since start while there was none).",
	}, func() float64 {
		now := c.cfg.Now()
		c.mu.Lock()
		defer c.mu.Unlock()
		ref := c.lastGood
		if ref.IsZero() {
			ref = c.born
		}
		return now.Sub(ref).Seconds()
	})
	if reg != nil {
		for _, col := range []prometheus.Collector{m.on, m.stale, m.allOff, m.failures, m.changes, m.auditDropped, age} {
			if err := reg.Register(col); err != nil {
				return metrics{}, err
			}
		}
	}
	return m, nil
}
