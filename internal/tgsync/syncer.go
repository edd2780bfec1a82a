package tgsync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/worker"
	"github.com/musterhq/muster/resolver"
)

// Group is a target group's state as a backend reads it.
type Group struct {
	// Targets are the targets in the group now; targets already leaving
	// (ELBv2 "draining") are not among them.
	Targets []Have
	// Foreign are targets taking traffic that the backend cannot manage
	// (HAProxy servers outside the slot pool): always reported as
	// unmanaged, never touched.
	Foreign []Have
	// Ramps: the backend brings new targets up slowly itself (HAProxy
	// applies muster's ramping weights; an ELBv2 group with
	// slow_start.duration_seconds set), so additions are not stepped.
	Ramps bool
}

// Backend is one target group as tgsync drives it. Every method makes
// outward calls under ctx.
type Backend interface {
	// State reads the group.
	State(ctx context.Context) (Group, error)
	// Register adds targets at their weights.
	Register(ctx context.Context, ws []Want) error
	// Reweight sets the weights of targets already in the group.
	Reweight(ctx context.Context, ws []Want) error
	// Deregister takes targets out of the group.
	Deregister(ctx context.Context, hs []Have) error
}

// Source is where views come from: a *resolver.Client.
type Source interface {
	Resolve(service string) (resolver.Result, error)
	Updated() <-chan struct{}
}

// Bound is a binding with its backend.
type Bound struct {
	Binding Binding
	Backend Backend
	// ReadEvery, when positive, reads the group from the backend at most
	// this often: a cycle in between (a view change) plans against the
	// state last read plus the changes tgsync made since, which saves an
	// ELBv2 DescribeTargetHealth per view change. A failed cycle reads
	// again. 0 reads on every cycle (HAProxy: a local socket, and its
	// slots are handles only a read can tell).
	ReadEvery time.Duration
}

// SyncerConfig configures a Syncer.
type SyncerConfig struct {
	Source   Source
	Bindings []Bound
	// Interval is the periodic reconcile, and the window the
	// deregistration cap and addition steps count over. Default 30 s.
	Interval time.Duration
	// DryRun plans without changing anything.
	DryRun bool
	// StateDir keeps, per binding, the targets tgsync knows to be
	// muster's, so a restarted tgsync still deregisters a target whose
	// instance left while it was down instead of taking it for one
	// registered by hand. Empty: memory only.
	StateDir string
	// CallTimeout bounds one cycle's calls to a backend. Default 30 s.
	CallTimeout time.Duration
	Clock       func() time.Time
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
	// Rand returns a number in [0,1), for the retry backoff's jitter.
	Rand func() float64
}

// Report is what one binding's cycle saw and did.
type Report struct {
	Binding string `json:"binding"`
	Service string `json:"service"`
	Kind    string `json:"kind"`
	Target  string `json:"target"`
	// Version is the view version the plan was made from (0: no view).
	Version uint64 `json:"version"`
	// Hold is the resolver's hold, when its guard keeps a larger set.
	Hold       *resolver.Hold `json:"-"`
	Desired    int            `json:"desired"`
	Registered int            `json:"registered"`
	Plan       Plan           `json:"plan"`
	// Applied: the plan's changes were made (not a dry run, no error).
	Applied bool  `json:"applied"`
	Err     error `json:"-"`
}

// Syncer keeps every binding's group in step with the views: on every
// view change and every Interval.
type Syncer struct {
	cfg      SyncerConfig
	bindings []*binding
	m        *metrics
	runner   worker.Runner
	mu       sync.Mutex // one cycle at a time
}

type stamp struct {
	at time.Time
	n  int
}

type binding struct {
	Bound
	log      *slog.Logger
	known    map[Key]bool
	deregs   []stamp // capped deregistrations made, newest last
	adds     []stamp // stepped additions made
	failures int
	retryAt  time.Time
	lastHold uint64       // NewestVersion of the last hold logged
	lastSync atomic.Int64 // unix nanoseconds of the last good cycle
	pending  int          // deregistrations deferred by the last plan
	unlogged int          // unmanaged count last logged
	stateErr bool
	cached   Group     // the group as last read, with tgsync's changes since
	cachedAt time.Time // when it was read; zero: read it next cycle
}

// state reads the group, or (ReadEvery) reuses the state last read.
func (s *Syncer) state(ctx context.Context, b *binding) (Group, error) {
	now := s.cfg.Clock()
	if b.ReadEvery > 0 && !b.cachedAt.IsZero() && now.Sub(b.cachedAt) < b.ReadEvery {
		return Group{Targets: slices.Clone(b.cached.Targets), Foreign: b.cached.Foreign, Ramps: b.cached.Ramps}, nil
	}
	g, err := b.Backend.State(ctx)
	if err != nil {
		return Group{}, err
	}
	if b.ReadEvery > 0 {
		b.cached, b.cachedAt = g, now
	}
	return Group{Targets: slices.Clone(g.Targets), Foreign: g.Foreign, Ramps: g.Ramps}, nil
}

// remember applies a plan tgsync carried out to the cached state.
func (b *binding) remember(g Group, p Plan) {
	if b.cachedAt.IsZero() {
		return
	}
	gone := map[Key]bool{}
	for _, h := range p.Deregister {
		gone[h.Key] = true
	}
	weight := map[Key]int{}
	for _, w := range p.Reweight {
		weight[w.Key] = w.Weight
	}
	out := make([]Have, 0, len(g.Targets)+len(p.Register))
	for _, h := range g.Targets {
		if gone[h.Key] {
			continue
		}
		if w, ok := weight[h.Key]; ok {
			h.Weight = w
		}
		out = append(out, h)
	}
	for _, w := range p.Register {
		h := Have{Key: w.Key, State: "registered"}
		if b.Binding.HAProxy != nil {
			h.Weight = w.Weight // ELBv2 has no weights: 0
		}
		out = append(out, h)
	}
	b.cached.Targets = out
}

// NewSyncer validates cfg and builds the Syncer; Start runs it.
func NewSyncer(cfg SyncerConfig) (*Syncer, error) {
	if cfg.Source == nil {
		return nil, errors.New("tgsync: SyncerConfig.Source is required")
	}
	if len(cfg.Bindings) == 0 {
		return nil, errors.New("tgsync: no bindings")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 30 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	s := &Syncer{cfg: cfg}
	for _, b := range cfg.Bindings {
		if b.Backend == nil {
			return nil, fmt.Errorf("tgsync: binding %s has no backend", b.Binding.Name)
		}
		nb := &binding{Bound: b, known: map[Key]bool{},
			log: cfg.Logger.With("binding", b.Binding.Name, "service", b.Binding.Service, "target", b.Binding.Target())}
		s.loadKnown(nb)
		s.bindings = append(s.bindings, nb)
	}
	m, err := newMetrics(cfg.Registerer, s)
	if err != nil {
		return nil, err
	}
	s.m = m
	for _, b := range s.bindings {
		// The counters show from the start, at 0, for rate() and alerts.
		m.apiErrors.WithLabelValues(b.Binding.Name)
		for _, op := range []string{"register", "reweight", "deregister"} {
			m.changes.WithLabelValues(b.Binding.Name, op)
		}
	}
	return s, nil
}

// Start runs the sync loop until Stop or ctx ends.
func (s *Syncer) Start(ctx context.Context) error { return s.runner.Start(ctx, s.loop) }

// Stop ends the loop and waits for it; safe to call twice or before Start.
func (s *Syncer) Stop() { s.runner.Stop() }

func (s *Syncer) loop(ctx context.Context) {
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for {
		updated := s.cfg.Source.Updated()
		s.RunOnce(ctx)
		wake := time.NewTimer(s.nextWake())
		select {
		case <-ctx.Done():
			wake.Stop()
			return
		case <-updated:
		case <-tick.C:
		case <-wake.C:
		}
		wake.Stop()
	}
}

// nextWake is how long until a binding can act again before the next
// tick: a failed cycle's retry, or a capped deregistration's budget.
func (s *Syncer) nextWake() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Clock()
	next := s.cfg.Interval
	for _, b := range s.bindings {
		if !b.retryAt.IsZero() {
			next = min(next, b.retryAt.Sub(now))
		}
		// The oldest capped deregistration leaving the window frees
		// budget; one already out of it was freed for the next cycle.
		if len(b.deregs) > 0 && b.pending > 0 {
			if d := b.deregs[0].at.Add(s.cfg.Interval).Sub(now); d > 0 {
				next = min(next, d)
			}
		}
	}
	return max(next, 10*time.Millisecond)
}

// RunOnce reconciles every binding once and reports what each saw and
// did. A binding whose last cycle failed waits for its backoff.
func (s *Syncer) RunOnce(ctx context.Context) []Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Report, 0, len(s.bindings))
	for _, b := range s.bindings {
		if !b.retryAt.IsZero() && s.cfg.Clock().Before(b.retryAt) {
			continue
		}
		out = append(out, s.reconcile(ctx, b))
	}
	return out
}

func used(st []stamp, now time.Time, window time.Duration) ([]stamp, int) {
	i := 0
	for i < len(st) && now.Sub(st[i].at) >= window {
		i++
	}
	st = st[i:]
	n := 0
	for _, x := range st {
		n += x.n
	}
	return st, n
}

func (s *Syncer) reconcile(ctx context.Context, b *binding) Report {
	bd := b.Binding
	rep := Report{Binding: bd.Name, Service: bd.Service, Kind: bd.Kind(), Target: bd.Target()}
	r, err := s.cfg.Source.Resolve(bd.Service)
	if err != nil {
		// No view yet (cold, nothing cached): nothing is known, so
		// nothing is done.
		rep.Err = fmt.Errorf("no view of %s: %w", bd.Service, err)
		b.log.Info("tgsync: no view yet; the group is left as it is", "err", err)
		return rep
	}
	snap := r.Snapshot
	rep.Version, rep.Hold = snap.Version(), r.Hold
	port := 0
	if bd.ELBv2 != nil {
		port = bd.ELBv2.Port
	} else {
		port = bd.HAProxy.Port
	}
	desired := Desired(snap.Targets(), port)
	inView := map[Key]bool{}
	for _, e := range snap.Endpoints() {
		k := Key{Addr: e.Address, Port: e.Port}
		if port != 0 {
			k.Port = port
		}
		inView[k] = true
	}
	rep.Desired = len(desired)
	s.logHold(b, r)

	cctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	g, err := s.state(cctx, b)
	if err != nil {
		s.failed(b, &rep, "read the group", err)
		return rep
	}
	rep.Registered = len(g.Targets)
	// Known: the view's endpoints, and what was known and is still in
	// the group (a target that left the view is still muster's to
	// deregister; once out of the group it is forgotten).
	inGroup := map[Key]bool{}
	for _, h := range g.Targets {
		inGroup[h.Key] = true
	}
	known := map[Key]bool{}
	for k := range inView {
		known[k] = true
	}
	for k := range b.known {
		if inGroup[k] {
			known[k] = true
		}
	}
	now := s.cfg.Clock()
	var deregUsed, addUsed int
	b.deregs, deregUsed = used(b.deregs, now, s.cfg.Interval)
	b.adds, addUsed = used(b.adds, now, s.cfg.Interval)
	registered, regKnown := snap.Registered()
	p := Compute(Input{
		Desired: desired, Current: g.Targets,
		Known:      func(k Key) bool { return known[k] },
		InView:     func(k Key) bool { return inView[k] },
		Registered: registered, RegisteredKnown: regKnown, Policy: bd.Policy,
		DeregisteredRecently: deregUsed, RegisteredRecently: addUsed, BackendRamps: g.Ramps,
	})
	p.Unmanaged = append(p.Unmanaged, g.Foreign...)
	rep.Plan = p
	b.pending = len(p.DeferredDeregister)
	s.m.observe(bd.Name, rep, r.Hold != nil || p.Held != "")
	s.logPlan(b, rep)
	if s.cfg.DryRun || p.Empty() {
		rep.Applied = !s.cfg.DryRun
		s.succeeded(b, now, known)
		return rep
	}
	// Additions first, so a swap never leaves the group smaller than it
	// has to be in between.
	if len(p.Register) > 0 {
		if err := b.Backend.Register(cctx, p.Register); err != nil {
			s.failed(b, &rep, "register", err)
			return rep
		}
		for _, w := range p.Register {
			known[w.Key] = true
			b.log.Info("tgsync: registered", "addr", w.Key.String(), "instance", w.InstanceID, "zone", w.Zone, "weight", w.Weight, "version", rep.Version)
		}
		s.m.changes.WithLabelValues(bd.Name, "register").Add(float64(len(p.Register)))
		if !g.Ramps && len(g.Targets) > 0 {
			b.adds = append(b.adds, stamp{at: now, n: len(p.Register)})
		}
	}
	if len(p.Reweight) > 0 {
		if err := b.Backend.Reweight(cctx, p.Reweight); err != nil {
			s.failed(b, &rep, "reweight", err)
			return rep
		}
		for _, w := range p.Reweight {
			b.log.Info("tgsync: reweighted", "addr", w.Key.String(), "instance", w.InstanceID, "weight", w.Weight, "version", rep.Version)
		}
		s.m.changes.WithLabelValues(bd.Name, "reweight").Add(float64(len(p.Reweight)))
	}
	if len(p.Deregister) > 0 {
		if err := b.Backend.Deregister(cctx, p.Deregister); err != nil {
			s.failed(b, &rep, "deregister", err)
			return rep
		}
		for _, h := range p.Deregister {
			b.log.Info("tgsync: deregistered", "addr", h.Key.String(), "version", rep.Version)
		}
		s.m.changes.WithLabelValues(bd.Name, "deregister").Add(float64(len(p.Deregister)))
		if capped := len(p.Deregister) - p.Explained; capped > 0 {
			b.deregs = append(b.deregs, stamp{at: now, n: capped})
		}
	}
	rep.Applied = true
	rep.Registered = len(g.Targets) + len(p.Register) - len(p.Deregister)
	b.remember(g, p)
	s.m.registered.WithLabelValues(bd.Name).Set(float64(rep.Registered))
	s.succeeded(b, now, known)
	return rep
}

func (s *Syncer) succeeded(b *binding, now time.Time, known map[Key]bool) {
	b.failures, b.retryAt = 0, time.Time{}
	b.lastSync.Store(now.UnixNano())
	if !s.cfg.DryRun && !maps.Equal(b.known, known) {
		b.known = known
		s.saveKnown(b)
	}
}

// failed keeps the desired state (it is recomputed from the view next
// time) and backs off: full jitter, 1 s doubling up to the interval.
func (s *Syncer) failed(b *binding, rep *Report, what string, err error) {
	b.cachedAt = time.Time{} // what the group holds is in doubt: read it
	rep.Err = fmt.Errorf("%s %s: %w", what, b.Binding.Target(), err)
	b.failures++
	s.m.apiErrors.WithLabelValues(b.Binding.Name).Inc()
	back := min(s.cfg.Interval, time.Second<<min(b.failures-1, 10))
	b.retryAt = s.cfg.Clock().Add(time.Duration(s.cfg.Rand() * float64(back)))
	b.log.Error("tgsync: cycle failed; the desired set is kept and tried again", "err", rep.Err, "failures", b.failures, "version", rep.Version)
}

func (s *Syncer) logHold(b *binding, r resolver.Result) {
	h := r.Hold
	if h == nil {
		if b.lastHold != 0 {
			b.log.Info("tgsync: the resolver's hold ended", "version", r.Version())
		}
		b.lastHold = 0
		return
	}
	if h.NewestVersion == b.lastHold {
		return
	}
	b.lastHold = h.NewestVersion
	b.log.Warn("tgsync: the client guard holds a larger set; the group keeps it",
		"reason", h.Reason, "held_version", h.HeldVersion, "held_routable", h.HeldRoutable,
		"newest_version", h.NewestVersion, "newest_routable", h.NewestRoutable, "follow_at", h.FollowAt)
}

func (s *Syncer) logPlan(b *binding, rep Report) {
	p := rep.Plan
	if p.Held != "" {
		b.log.Warn("tgsync: the view routes to nothing; the group is not emptied", "version", rep.Version, "registered", rep.Registered)
	}
	if n := len(p.DeferredDeregister); n > 0 && p.Held == "" {
		b.log.Warn("tgsync: deregistrations capped; the rest drain gradually", "now", len(p.Deregister), "pending", n,
			"cap", Capped(b.Binding.Policy.MaxDeregisterFraction, rep.Registered), "interval", s.cfg.Interval, "version", rep.Version)
	}
	if n := len(p.Unmanaged); n != b.unlogged {
		b.unlogged = n
		if n > 0 {
			addrs := make([]string, 0, n)
			for _, h := range p.Unmanaged {
				addrs = append(addrs, h.Key.String())
			}
			b.log.Warn("tgsync: targets in the group that muster did not put there are left alone (own_group manages them)", "unmanaged", addrs)
		}
	}
	if s.cfg.DryRun && !p.Empty() {
		b.log.Info("tgsync: dry run, nothing changed", "plan", p.Describe(), "version", rep.Version)
	}
}

func (s *Syncer) statePath(b *binding) string {
	return filepath.Join(s.cfg.StateDir, "tgsync-"+b.Binding.Name+".known.json")
}

func (s *Syncer) loadKnown(b *binding) {
	if s.cfg.StateDir == "" {
		return
	}
	data, err := os.ReadFile(s.statePath(b))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			b.log.Warn("tgsync: known targets not read; targets muster registered may show as unmanaged", "err", err)
		}
		return
	}
	var keys []string
	if err := json.Unmarshal(data, &keys); err != nil {
		b.log.Warn("tgsync: known targets file unreadable; ignored", "err", err)
		return
	}
	for _, k := range keys {
		if key, ok := parseKey(k); ok {
			b.known[key] = true
		}
	}
}

func (s *Syncer) saveKnown(b *binding) {
	if s.cfg.StateDir == "" {
		return
	}
	keys := make([]string, 0, len(b.known))
	for k := range b.known {
		keys = append(keys, k.String())
	}
	slices.Sort(keys)
	data, _ := json.Marshal(keys)
	tmp := s.statePath(b) + ".tmp"
	err := os.MkdirAll(s.cfg.StateDir, 0o755)
	if err == nil {
		err = os.WriteFile(tmp, data, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, s.statePath(b))
	}
	if err != nil && !b.stateErr {
		b.log.Warn("tgsync: known targets not saved", "err", err)
	}
	b.stateErr = err != nil
}

func parseKey(s string) (Key, bool) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 {
		return Key{}, false
	}
	p, err := strconv.Atoi(s[i+1:])
	if err != nil || p < 0 || p > 65535 {
		return Key{}, false
	}
	return Key{Addr: s[:i], Port: p}, true
}
