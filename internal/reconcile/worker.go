package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/worker"
)

// Source is one authority on what exists: a Kubernetes cluster's
// EndpointSlices, an inventory snapshot. Every source has this one shape.
type Source interface {
	// Name is the source's name, the source of its instances
	// ("k8s/<cluster>", "snapshot/<name>").
	Name() string
	// Start starts whatever the source runs (informers); Stop stops it.
	Start(ctx context.Context) error
	Stop()
	// Read returns the source's full desired set. An error means no
	// reading (not synced yet, an invalid snapshot): nothing is applied.
	Read(ctx context.Context) (Reading, error)
	// Changed fires when the source has news (nil: polled only).
	Changed() <-chan struct{}
}

// Registry is what a worker needs of the registry.
type Registry interface {
	ReconciledInstances(ctx context.Context, source string) ([]registry.Instance, error)
	ApplyReconcile(ctx context.Context, source string, ch registry.ReconcileChange) (registry.ReconcileResult, error)
	SourceConfirmationsSince(ctx context.Context, source string, since time.Time) ([]registry.ReconcileConfirmation, error)
	MemberAuthorities(ctx context.Context, services []string) (map[string]registry.MemberAuthority, error)
}

// Evidence takes readiness evidence (the evaluator).
type Evidence interface {
	ObserveReadiness(source string, rs []evaluator.Readiness) int
}

// WorkerConfig configures one source's worker.
type WorkerConfig struct {
	Source   Source
	Registry Registry
	Evidence Evidence
	// Every is the pass period (default 5 s): readiness evidence is
	// restated each pass, so the self class never goes silent while the
	// source reports the instance.
	Every     time.Duration
	Disbelief Disbelief
	// Timeout bounds one pass's database and source work (default 10 s).
	Timeout time.Duration
	// Owns, when set, says whether this replica applies the source's
	// readings (one replica of the region does, the owner of
	// the source's shard). Every replica reads the source and hands its
	// readiness to its own evaluator (every replica evaluates every
	// service); only the owner writes the registry and counts believed
	// absences, so the disbelief threshold is the region's, not each
	// replica's. The tenure is taken as a pass starts and checked in the
	// transaction that applies it (Fence), so an owner deposed during the
	// pass (a pause) applies nothing; the pass is dropped and counted
	// (writer "reconcile"). Nil: this replica applies, unfenced.
	Owns func() (fence.Token, bool)
	// Fence checks the tenure Owns gave (nil: nothing is checked).
	Fence   *fence.Fence
	Now     func() time.Time
	Logger  *slog.Logger
	metrics *metrics
}

// Validate checks the configuration and fills defaults.
func (c *WorkerConfig) Validate() error {
	if c.Source == nil || c.Registry == nil {
		return errors.New("reconcile: Source and Registry are required")
	}
	if c.Every == 0 {
		c.Every = 5 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c.Disbelief.Validate()
}

// Status is a source's state after its last pass.
type Status struct {
	Source string `json:"source"`
	// LastPass is when the last pass ran; LastReading when the source
	// last gave a reading.
	LastPass    time.Time `json:"last_pass"`
	LastReading time.Time `json:"last_reading"`
	// Error is the last pass's error ("" when it applied).
	Error string `json:"error,omitempty"`
	// Stale says why the last reading is the source's last state.
	Stale     string `json:"stale,omitempty"`
	Endpoints int    `json:"endpoints"`
	Live      int    `json:"live"`
	Hold      *Hold  `json:"hold,omitempty"`
	// Unauthorised are the last reading's claims of services that do not
	// take members from where they came (alarm reconcile_unauthorised).
	Unauthorised []Claim `json:"unauthorised,omitempty"`
	// Unsealed are services of the last reading whose member sources row
	// does not verify, with why (alarm member_sources_unsealed).
	Unsealed map[string]string `json:"unsealed,omitempty"`
	// Applying: this replica applied the last pass (it owns the source;
	// WorkerConfig.Owns). Every replica reads; one applies.
	Applying bool `json:"applying"`
	// ReplaceRefused are reconciled endpoints waiting because ending the
	// live instance at their address would exceed the disruption budget,
	// by instance id, with the refusal.
	ReplaceRefused map[string]string `json:"replace_refused,omitempty"`
}

// Worker reconciles one source into the registry.
type Worker struct {
	cfg    WorkerConfig
	log    *slog.Logger
	runner worker.Runner
	kick   chan struct{}

	mu     sync.Mutex
	status Status
	view   SourceView
	hold   *Hold
	// heldServices are the last pass's held instances and their services.
	heldServices map[uuid.UUID]string
	// believed are the absences believed (under the threshold) within the
	// last window, counted against the next readings (DecideAfter).
	believed []believedAt
	// claimedSince is when each unauthorised claim (Claim.key) was first
	// seen; refusedAudited are the creations whose refused replacement has
	// been audited (registry.ReconcileChange.QuietRefusals), and since when.
	claimedSince   map[string]time.Time
	refusedAudited map[uuid.UUID]time.Time
}

// believedAt is one pass's believed absences, by service.
type believedAt struct {
	at time.Time
	by map[string]int
}

// recentBelieved drops believed absences older than the window and counts
// the rest by service. Called with w.mu held.
func (w *Worker) recentBelieved(now time.Time) map[string]int {
	w.believed = slices.DeleteFunc(w.believed, func(b believedAt) bool { return !now.Before(b.at.Add(w.cfg.Disbelief.Window)) })
	n := map[string]int{}
	for _, b := range w.believed {
		for svc, k := range b.by {
			n[svc] += k
		}
	}
	return n
}

// NewWorker returns the worker of one source.
func NewWorker(cfg WorkerConfig) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.metrics == nil {
		cfg.metrics = newMetrics()
	}
	name := cfg.Source.Name()
	return &Worker{cfg: cfg, log: cfg.Logger.With("worker", "reconcile", "source", name), kick: make(chan struct{}, 1),
		status: Status{Source: name}, view: SourceView{Name: name}}, nil
}

// Name is the source's name.
func (w *Worker) Name() string { return w.cfg.Source.Name() }

// Start starts the source and the pass loop: a pass every Every, and one
// soon after the source says it changed.
func (w *Worker) Start(ctx context.Context) error {
	if err := w.cfg.Source.Start(ctx); err != nil {
		return fmt.Errorf("start source %s: %w", w.Name(), err)
	}
	return w.runner.Start(ctx, func(ctx context.Context) {
		changed := w.cfg.Source.Changed()
		t := time.NewTicker(w.cfg.Every)
		defer t.Stop()
		w.RunOnce(ctx)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-changed:
			case <-w.kick:
			}
			w.RunOnce(ctx)
		}
	})
}

// Stop stops the loop, then the source. Safe to call twice.
func (w *Worker) Stop() {
	w.runner.Stop()
	w.cfg.Source.Stop()
}

// Kick asks for a pass soon (after an operator's confirmation).
func (w *Worker) Kick() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// RunOnce runs one pass: read the source, decide, apply through the
// registry, hand readiness to the evaluator. A failed read or write
// changes nothing and is retried at the next pass; the registry keeps
// what the last good pass left (fail-static).
func (w *Worker) RunOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	name := w.Name()
	m := w.cfg.metrics
	now := w.cfg.Now()
	err := w.pass(ctx, now)
	w.mu.Lock()
	w.status.LastPass = now
	w.status.Error = ""
	if err != nil {
		w.status.Error = err.Error()
	}
	st := w.status
	w.mu.Unlock()
	switch {
	case errors.Is(err, ErrNotSynced):
		w.log.Debug("source not synced yet", "err", err)
	case err != nil:
		m.errors.WithLabelValues(name).Inc()
		w.log.Warn("reconcile pass failed; the registry keeps the last applied state", "err", err)
	}
	held := 0.0
	if st.Hold != nil {
		held = float64(st.Hold.Lacking)
	}
	m.held.WithLabelValues(name).Set(held)
	stale := 0.0
	if st.Stale != "" {
		stale = 1
	}
	m.stale.WithLabelValues(name).Set(stale)
	m.endpoints.WithLabelValues(name).Set(float64(st.Endpoints))
	if !st.LastReading.IsZero() {
		m.lag.WithLabelValues(name).Set(now.Sub(st.LastReading).Seconds())
	}
	return err
}

func (w *Worker) pass(ctx context.Context, now time.Time) error {
	name := w.Name()
	// Whether this pass applies is decided as it starts, under the
	// tenure held then; the apply checks that same tenure.
	var tenure fence.Token
	owns := true
	if w.cfg.Owns != nil {
		tenure, owns = w.cfg.Owns()
	}
	r, err := w.cfg.Source.Read(ctx)
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	for i := range r.Endpoints {
		e := &r.Endpoints[i]
		e.ID = registry.ReconciledID(name, e.Service, e.Key)
	}
	if r.At.IsZero() {
		r.At = now
	}
	w.mu.Lock()
	w.status.LastReading, w.status.Stale, w.status.Endpoints = r.At, r.Stale, len(r.Endpoints)
	prev := w.hold
	recent := w.recentBelieved(now)
	w.mu.Unlock()

	rows, err := w.cfg.Registry.ReconciledInstances(ctx, name)
	if err != nil {
		return err
	}
	live := make([]Live, len(rows))
	for i, in := range rows {
		live[i] = Live{ID: in.ID, Service: in.Service, Address: in.Address, Port: in.Port, Zone: in.Zone, Since: in.CreatedAt}
	}
	// Membership is authorised where it enters: an endpoint its service
	// does not take from here adds nothing (and ends nothing).
	claimed := map[string]bool{}
	for _, e := range r.Endpoints {
		claimed[e.Service] = true
	}
	var claims []Claim
	unsealed := map[string]string{}
	if len(claimed) > 0 {
		auth, err := w.cfg.Registry.MemberAuthorities(ctx, slices.Sorted(maps.Keys(claimed)))
		if err != nil {
			return err
		}
		for svc, a := range auth {
			if a.SealErr != nil {
				unsealed[svc] = a.SealErr.Error()
			}
		}
		r, claims = Authorise(name, r, live, auth)
	}
	w.noteClaims(now, claims, unsealed)
	// Every confirmation given since the hold began counts: they are given
	// service by service, by each service's team. Every replica reads them
	// from the database and applies them to its own hold the same way;
	// the owner of the source's shard ends the instances.
	var confirmed Confirmation
	if prev != nil {
		rows, err := w.cfg.Registry.SourceConfirmationsSince(ctx, name, prev.Since)
		if err != nil {
			return err
		}
		cs := make([]Confirmation, len(rows))
		for i, c := range rows {
			cs[i] = Confirmation{At: c.ConfirmedAt, Instances: c.Instances}
		}
		confirmed = VouchedSince(cs, prev.Since)
	}
	plan := DecideAfter(w.cfg.Disbelief, r, live, prev, confirmed, now, recent)
	switch {
	case plan.Hold != nil && prev == nil:
		w.log.Warn("reading not believed: removals held until the source recovers or an operator confirms", "had", plan.Hold.Had, "lacking", plan.Hold.Lacking, "empty", plan.Hold.Empty)
	case plan.Released != "":
		w.log.Info("held removals released", "why", plan.Released, "ended", len(plan.End))
	case len(plan.Confirmed) > 0:
		w.log.Info("held removals of confirmed services released; the rest stay held", "confirmed", plan.Confirmed, "still_held", plan.Hold.Services)
	}
	create := make([]registry.Instance, len(plan.Create))
	for i, e := range plan.Create {
		create[i] = registry.Instance{ID: e.ID, Service: e.Service, Address: e.Address, Port: e.Port, Zone: e.Zone}
	}
	var res registry.ReconcileResult
	if owns && (len(create) > 0 || len(plan.End) > 0) {
		w.mu.Lock()
		quiet := make(map[uuid.UUID]bool, len(w.refusedAudited))
		for id := range w.refusedAudited {
			quiet[id] = true
		}
		w.mu.Unlock()
		check := func(ctx context.Context, q *db.Queries) error { return w.cfg.Fence.Check(ctx, q, tenure) }
		res, err = w.cfg.Registry.ApplyReconcile(ctx, name, registry.ReconcileChange{Create: create, End: plan.End, QuietRefusals: quiet, Fence: check})
		switch {
		case fence.IsNotOwner(err):
			// Deposed since the pass began: the new owner applies the
			// source (it reads it too), and this pass counts nothing.
			w.cfg.Fence.Dropped("reconcile", 1)
			w.log.Info("reconciliation pass dropped: this replica no longer owns the source", "tenure", tenure.String())
			owns, res, err = false, registry.ReconcileResult{}, nil
		case err != nil:
			return err
		}
	}
	w.mu.Lock()
	w.status.Applying = owns
	w.mu.Unlock()
	w.noteRefusals(now, res.ReplaceRefused)
	m := w.cfg.metrics
	m.changes.WithLabelValues(name, "added").Add(float64(len(res.Created)))
	m.changes.WithLabelValues(name, "ended").Add(float64(len(res.Ended)))
	m.changes.WithLabelValues(name, "replaced").Add(float64(len(res.Replaced)))
	if w.cfg.Evidence != nil {
		rs := make([]evaluator.Readiness, 0, len(plan.Readiness))
		for _, e := range plan.Readiness {
			if _, skipped := res.Skipped[e.ID]; skipped {
				continue
			}
			rs = append(rs, evaluator.Readiness{Instance: e.ID, Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating})
		}
		w.cfg.Evidence.ObserveReadiness(name, rs)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case plan.Released != "":
		w.believed = nil // recovery or an operator vouched for what is gone
	case len(plan.Believed) > 0 && owns:
		// Counted only where applied: a replica that applies nothing
		// ends nothing it believed.
		w.believed = append(w.believed, believedAt{at: now, by: plan.Believed})
	}
	w.hold = plan.Hold
	w.status.Hold = plan.Hold
	w.heldServices = make(map[uuid.UUID]string, len(plan.Held))
	for _, id := range plan.Held {
		w.heldServices[id] = ""
	}
	for _, l := range live {
		if _, held := w.heldServices[l.ID]; held {
			w.heldServices[l.ID] = l.Service
		}
	}
	w.status.Live = len(live) + len(res.Created) - len(res.Ended)
	services := map[string]bool{}
	for _, e := range r.Endpoints {
		services[e.Service] = true
	}
	for _, l := range live {
		services[l.Service] = true
	}
	w.view = SourceView{Name: name, Reading: r, Plan: plan, Skipped: res.Skipped, Services: slices.Sorted(maps.Keys(services))}
	return nil
}

// Status is the source's state after its last pass.
func (w *Worker) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status
}

// View is the source's last reading and plan, for the diff.
func (w *Worker) View() SourceView {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.view
}

// Held are the ids whose removal the last pass held.
func (w *Worker) Held() []uuid.UUID {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]uuid.UUID(nil), w.view.Plan.Held...)
}

// HeldServices are the instances whose removal the last pass held, with
// their services: what an operator's confirmation vouches for.
func (w *Worker) HeldServices() map[uuid.UUID]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.heldServices)
}

type metrics struct {
	errors    *prometheus.CounterVec
	changes   *prometheus.CounterVec
	held      *prometheus.GaugeVec
	stale     *prometheus.GaugeVec
	endpoints *prometheus.GaugeVec
	lag       *prometheus.GaugeVec
	diff      *prometheus.GaugeVec
	// unauthorised counts the endpoints of the last reading claimed
	// without their service's authority, by source and service.
	unauthorised *prometheus.GaugeVec
}

func newMetrics() *metrics {
	return &metrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_reconcile_errors_total",
			Help: "Reconciliation passes that failed (an unreadable or invalid reading, the registry away), by source; nothing was applied."}, []string{"source"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_reconcile_changes_total",
			Help: "Instances added, ended or replaced by reconciliation, by source."}, []string{"source", "change"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "muster_reconcile_held",
			Help: "Removals a disbelief threshold holds, by source."}, []string{"source"}),
		stale: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "muster_reconcile_stale",
			Help: "1 while a source's reading is its last state (a lost watch), by source."}, []string{"source"}),
		endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "muster_reconcile_endpoints",
			Help: "Endpoints in a source's last reading."}, []string{"source"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "muster_reconcile_lag_seconds",
			Help: "Age of a source's last reading at the last pass (reconciliation lag)."}, []string{"source"}),
		diff: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "muster_reconcile_diff",
			Help: "Divergences between the sources and the registry at the last diff, by source and kind (missing, leak, mismatch, held)."}, []string{"source", "kind"}),
		unauthorised: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "muster_reconcile_unauthorised",
			Help: "Endpoints of a source's last reading claimed for a service that does not take members from where they came (alarm reconcile_unauthorised), by source and service; none of them was added."}, []string{"source", "service"}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{m.errors, m.changes, m.held, m.stale, m.endpoints, m.lag, m.diff, m.unauthorised} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("reconcile: register metrics: %w", err)
		}
	}
	return nil
}

// noteClaims records the pass's unauthorised claims and unverifiable
// member sources (status, alarms, the metric), logging each new claim
// once.
func (w *Worker) noteClaims(now time.Time, claims []Claim, unsealed map[string]string) {
	name := w.Name()
	w.mu.Lock()
	since := make(map[string]time.Time, len(claims))
	var fresh []Claim
	for _, c := range claims {
		t, ok := w.claimedSince[c.key()]
		if !ok {
			t = now
			fresh = append(fresh, c)
		}
		since[c.key()] = t
	}
	oldUnsealed := w.status.Unsealed
	w.claimedSince = since
	w.status.Unauthorised = claims
	w.status.Unsealed = nil
	if len(unsealed) > 0 {
		w.status.Unsealed = unsealed
	}
	w.mu.Unlock()
	for _, c := range fresh {
		w.log.Warn("a source claims members for a service that does not take them from there; ignored",
			"alarm", AlarmUnauthorised, "namespace", c.Namespace, "kube_service", c.KubeService, "service", c.Service, "endpoints", c.Endpoints, "kept", c.Kept)
	}
	for svc, why := range unsealed {
		if _, ok := oldUnsealed[svc]; !ok {
			w.log.Error("member sources written outside muster authorise nothing", "alarm", AlarmMemberSourcesUnsealed, "service", svc, "err", why)
		}
	}
	m := w.cfg.metrics
	m.unauthorised.DeletePartialMatch(prometheus.Labels{"source": name})
	by := map[string]int{}
	for _, c := range claims {
		by[c.Service] += c.Endpoints
	}
	for svc, n := range by {
		m.unauthorised.WithLabelValues(name, svc).Set(float64(n))
	}
}

// noteRefusals records the replacements the budget refused this pass:
// each is audited once (while it keeps being refused) and logged once.
func (w *Worker) noteRefusals(now time.Time, refused map[uuid.UUID]string) {
	w.mu.Lock()
	audited := make(map[uuid.UUID]time.Time, len(refused))
	var fresh []uuid.UUID
	var status map[string]string
	for id, why := range refused {
		t, ok := w.refusedAudited[id]
		if !ok {
			t = now
			fresh = append(fresh, id)
		}
		audited[id] = t
		if status == nil {
			status = map[string]string{}
		}
		status[id.String()] = why
	}
	w.refusedAudited = audited
	w.status.ReplaceRefused = status
	w.mu.Unlock()
	for _, id := range fresh {
		w.log.Warn("a reconciled endpoint waits: ending the instance at its address would exceed the disruption budget",
			"alarm", AlarmReplaceRefused, "instance", id, "why", refused[id])
	}
}

// AlarmReplaceRefused is raised while a reconciled endpoint waits because
// ending the live instance at its address would exceed the disruption
// budget an operator's deregistration needs.
const AlarmReplaceRefused = "reconcile_replace_refused"
