package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/worker"
)

// AlarmStale is raised while a source's reading is its last state (an
// informer that lost its watch; a snapshot that cannot be read).
const AlarmStale = "reconcile_stale"

// Store is what the reconciler needs of the registry beyond its workers'.
type Store interface {
	Registry
	LiveInstancesOf(ctx context.Context, services []string) ([]registry.Instance, error)
	ConfirmReconcile(ctx context.Context, actor identity.Principal, source string, scope disbelief.Scope, reason string, known bool, held map[uuid.UUID]string) (registry.ReconcileConfirmation, error)
}

// Config configures a Reconciler: its sources and their common settings.
type Config struct {
	Sources   []Source
	Registry  Store
	Evidence  Evidence
	Every     time.Duration
	Disbelief Disbelief
	Now       func() time.Time
	Logger    *slog.Logger
	// Registerer receives the metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Fence, when set, says whether this replica applies a source's
	// readings, and under which tenure (WorkerConfig.Owns): the owner of
	// Key(source) does. Nil: this replica applies every source.
	Fence *fence.Fence
	// Key is the ownership key of a source (the source's name when nil).
	Key func(source string) string
}

// Reconciler is the set of workers, one per source, and what spans them:
// the diff, the alarms, confirmations.
type Reconciler struct {
	cfg     Config
	workers []*Worker
	metrics *metrics
}

// New builds a worker per source.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Registry == nil {
		return nil, errors.New("reconcile: Registry is required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := newMetrics()
	if err := m.register(cfg.Registerer); err != nil {
		return nil, err
	}
	rc := &Reconciler{cfg: cfg, metrics: m}
	seen := map[string]bool{}
	for _, s := range cfg.Sources {
		if seen[s.Name()] {
			return nil, fmt.Errorf("reconcile: source %s configured twice", s.Name())
		}
		seen[s.Name()] = true
		var owns func() (fence.Token, bool)
		if cfg.Fence != nil {
			key := s.Name()
			if cfg.Key != nil {
				key = cfg.Key(key)
			}
			owns = func() (fence.Token, bool) { return cfg.Fence.Claim(key) }
		}
		w, err := NewWorker(WorkerConfig{Source: s, Registry: cfg.Registry, Evidence: cfg.Evidence, Every: cfg.Every,
			Disbelief: cfg.Disbelief, Now: cfg.Now, Logger: cfg.Logger, Owns: owns, Fence: cfg.Fence, metrics: m})
		if err != nil {
			return nil, err
		}
		rc.workers = append(rc.workers, w)
	}
	return rc, nil
}

// Workers are the reconciler's workers, one per source, to start and stop.
func (rc *Reconciler) Workers() []*Worker { return rc.workers }

// Worker returns the worker of the named source.
func (rc *Reconciler) Worker(source string) (*Worker, bool) {
	for _, w := range rc.workers {
		if w.Name() == source {
			return w, true
		}
	}
	return nil, false
}

// Statuses lists each source's state.
func (rc *Reconciler) Statuses() []Status {
	out := make([]Status, len(rc.workers))
	for i, w := range rc.workers {
		out[i] = w.Status()
	}
	return out
}

// Diff is the body of GET /v1/reconcile/diff.
type Diff struct {
	At      time.Time        `json:"at"`
	Sources []Status         `json:"sources"`
	Counts  map[DiffKind]int `json:"counts"`
	Items   []DiffItem       `json:"items"`
}

// Diff compares every source's last reading with the registry's live
// instances of the services the sources cover, and sets
// muster_reconcile_diff.
func (rc *Reconciler) Diff(ctx context.Context) (Diff, error) {
	views := make([]SourceView, len(rc.workers))
	services := map[string]bool{}
	for i, w := range rc.workers {
		views[i] = w.View()
		for _, s := range views[i].Services {
			services[s] = true
		}
	}
	var live []registry.Instance
	if len(services) > 0 {
		var err error
		if live, err = rc.cfg.Registry.LiveInstancesOf(ctx, slices.Sorted(maps.Keys(services))); err != nil {
			return Diff{}, err
		}
	}
	reg := make([]Registered, len(live))
	for i, in := range live {
		reg[i] = Registered{Live: Live{ID: in.ID, Service: in.Service, Address: in.Address, Port: in.Port, Zone: in.Zone}, Source: in.Source}
	}
	items := DiffOf(views, reg)
	d := Diff{At: rc.cfg.Now(), Sources: rc.Statuses(), Counts: map[DiffKind]int{}, Items: items}
	if d.Items == nil {
		d.Items = []DiffItem{}
	}
	per := map[string]map[DiffKind]int{}
	for _, w := range rc.workers {
		per[w.Name()] = map[DiffKind]int{}
	}
	for _, it := range items {
		d.Counts[it.Kind]++
		if per[it.Source] == nil {
			per[it.Source] = map[DiffKind]int{}
		}
		per[it.Source][it.Kind]++
	}
	for _, k := range DiffKinds {
		if _, ok := d.Counts[k]; !ok {
			d.Counts[k] = 0
		}
	}
	for src, counts := range per {
		for _, k := range DiffKinds {
			rc.metrics.diff.WithLabelValues(src, string(k)).Set(float64(counts[k]))
		}
	}
	return d, nil
}

// GatePrefix begins the disbelief gate name of a source's removals:
// "reconcile/<source>".
const GatePrefix = registry.GatePrefixReconcile

// Holds lists each source's held removals as the one removal rule's holds
// (disbelief.Hold, gate reconcile/<source>): the source as a scope when
// its reading is suspect as a whole, else each service suspect on its own.
func (rc *Reconciler) Holds() []disbelief.Hold {
	var out []disbelief.Hold
	for _, w := range rc.workers {
		st := w.Status()
		h := st.Hold
		if h == nil {
			continue
		}
		byService := map[string][]uuid.UUID{}
		for id, svc := range w.HeldServices() {
			byService[svc] = append(byService[svc], id)
		}
		gate := GatePrefix + st.Source
		what := "instances"
		if h.Empty {
			what = "instances (the reading has no endpoints at all)"
		}
		if h.Whole {
			d := disbelief.Hold{Gate: gate, Scope: disbelief.Scope{Kind: disbelief.Source, Name: st.Source}, Since: h.Since,
				Had: h.Had, Lacking: h.Lacking, Threshold: w.cfg.Disbelief.Fraction, Services: slices.Clone(h.Services)}
			var ids []uuid.UUID
			for _, svc := range h.Services {
				ids = append(ids, byService[svc]...)
			}
			d.Name(ids)
			d.Describe(what)
			out = append(out, d)
			continue
		}
		for _, svc := range h.Services {
			c := h.ByService[svc]
			d := disbelief.Hold{Gate: gate, Scope: disbelief.Scope{Kind: disbelief.Service, Name: svc}, Since: h.Since,
				Had: c.Had, Lacking: c.Lacking, Threshold: w.cfg.Disbelief.Fraction, Services: []string{svc}}
			d.Name(byService[svc])
			d.Describe(what)
			out = append(out, d)
		}
	}
	return out
}

// Alarms lists reconcile_stale for each source whose reading is its last
// state, and the membership alarms; held removals are the removal rule's
// (Holds, alarm removal_held).
func (rc *Reconciler) Alarms() []assembler.Alarm {
	var out []assembler.Alarm
	for _, w := range rc.workers {
		st := w.Status()
		if st.Stale != "" {
			out = append(out, assembler.Alarm{Kind: AlarmStale, Since: st.LastReading, Detail: fmt.Sprintf(
				"%s: %s; its instances are kept as last read (fail-static)", st.Source, st.Stale)})
		}
		out = append(out, w.membershipAlarms(st)...)
	}
	return out
}

// membershipAlarms are a source's reconcile_unauthorised,
// member_sources_unsealed and reconcile_replace_refused alarms.
func (w *Worker) membershipAlarms(st Status) []assembler.Alarm {
	w.mu.Lock()
	since := maps.Clone(w.claimedSince)
	refusedSince := maps.Clone(w.refusedAudited)
	w.mu.Unlock()
	var out []assembler.Alarm
	for _, c := range st.Unauthorised {
		where := "its entries"
		if c.Namespace != "" || c.KubeService != "" {
			where = fmt.Sprintf("Service %s/%s", c.Namespace, c.KubeService)
		}
		kept := ""
		if c.Kept > 0 {
			kept = fmt.Sprintf(" (%d of them were members already and are kept until the source stops reporting them)", c.Kept)
		}
		out = append(out, assembler.Alarm{Kind: AlarmUnauthorised, Service: c.Service, Since: since[c.key()], Detail: fmt.Sprintf(
			"source %s, namespace %q, service %q claims %d endpoints for %s, which does not take members from there; none was added%s. If they belong to %s, its owning team or an admin authorises them (PUT /v1/services/%s/member-sources); otherwise remove the annotation",
			c.Source, c.Namespace, c.KubeService, c.Endpoints, c.Service, kept, c.Service, c.Service) + " (" + where + ")"})
	}
	for _, svc := range slices.Sorted(maps.Keys(st.Unsealed)) {
		out = append(out, assembler.Alarm{Kind: AlarmMemberSourcesUnsealed, Service: svc, Since: st.LastPass, Detail: fmt.Sprintf(
			"the member sources of %s were not written by muster (%s): they authorise nothing, and %s takes members only as the reconciliation config vouches; its owning team or an admin writes them again through PUT /v1/services/%s/member-sources",
			svc, st.Unsealed[svc], svc, svc)})
	}
	for _, id := range slices.Sorted(maps.Keys(st.ReplaceRefused)) {
		u, _ := uuid.Parse(id)
		out = append(out, assembler.Alarm{Kind: AlarmReplaceRefused, Since: refusedSince[u], Detail: fmt.Sprintf(
			"%s: reconciled instance %s is not added: %s; it is retried each pass (the registered instance can be deregistered through DELETE /v1/instances/{id}, under the same budget)",
			st.Source, id, st.ReplaceRefused[id])})
	}
	return out
}

// Confirm records actor's confirmation that the removals source holds in
// scope (the source as a whole, or one of its services) are real
// (audited, refused ones too) and asks for a pass. It vouches for the
// instances this replica's last pass held in scope; every replica
// applies it at its next pass (registry.SourceConfirmationsSince).
func (rc *Reconciler) Confirm(ctx context.Context, actor identity.Principal, source string, scope disbelief.Scope, reason string) (registry.ReconcileConfirmation, error) {
	w, ok := rc.Worker(source)
	var held map[uuid.UUID]string
	if ok {
		held = w.HeldServices()
	}
	c, err := rc.cfg.Registry.ConfirmReconcile(ctx, actor, source, scope, reason, ok, held)
	if err == nil {
		w.Kick()
	}
	return c, err
}

// DiffEvery is how often DiffWorker refreshes muster_reconcile_diff.
const DiffEvery = 30 * time.Second

// DiffWorker keeps muster_reconcile_diff current between diff requests,
// so an alert on leaks or startup failures needs nobody to open the page:
// one diff (one query over the covered services' live instances) every
// DiffEvery.
func (rc *Reconciler) DiffWorker() *DiffRefresher { return &DiffRefresher{rc: rc} }

// DiffRefresher is the worker DiffWorker returns.
type DiffRefresher struct {
	rc     *Reconciler
	runner worker.Runner
}

// Start refreshes the diff every DiffEvery until Stop.
func (d *DiffRefresher) Start(ctx context.Context) error {
	return d.runner.Start(ctx, func(ctx context.Context) {
		worker.Every(ctx, DiffEvery, func(ctx context.Context) { _ = d.RunOnce(ctx) })
	})
}

// Stop stops it. Safe to call twice.
func (d *DiffRefresher) Stop() { d.runner.Stop() }

// RunOnce computes the diff once, bounded by 10 s.
func (d *DiffRefresher) RunOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := d.rc.Diff(ctx)
	if err != nil && d.rc.cfg.Logger != nil {
		d.rc.cfg.Logger.Warn("reconcile diff", "err", err)
	}
	return err
}
