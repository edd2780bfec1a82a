package resolver

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Option configures a Cache.
type Option func(*config)

type config struct {
	regions      []string
	clock        func() time.Time
	random       func() uint64
	dir          string
	maxShrink    float64
	confirmAfter time.Duration
	hook         func(Event)
	eject        EjectionPolicy
	viewKeys     map[string]ed25519.PublicKey
}

// WithClock sets the clock Resolve stamps results with and Apply stamps
// snapshots with (default time.Now).
func WithClock(now func() time.Time) Option { return func(c *config) { c.clock = now } }

// WithRandom sets the source of uniformly random 64-bit values Pick uses.
// It is called concurrently unless the caller serialises Pick; the default,
// math/rand/v2's Uint64, is a lock-free per-thread ChaCha8.
func WithRandom(r func() uint64) Option { return func(c *config) { c.random = r } }

// WithDir keeps last-known-good views in dir: New loads them, and every
// view routing switches to is written there atomically.
func WithDir(dir string) Option { return func(c *config) { c.dir = dir } }

// WithMaxShrink sets the largest fraction of the routable set one update
// may remove beyond what the registry removed (default DefaultMaxShrink);
// 1 disables the shrink cap (an update that empties the service is still
// held unless the registry explains it).
func WithMaxShrink(f float64) Option { return func(c *config) { c.maxShrink = f } }

// WithConfirmAfter sets how long the server must stand by a smaller set
// the shrink guard holds back before routing follows it (see Hold). Zero
// or negative takes DefaultConfirmAfter (60 s).
func WithConfirmAfter(d time.Duration) Option { return func(c *config) { c.confirmAfter = d } }

// WithEventHook receives every refusal, followed hold, broken update,
// corrupt cache file and persist failure. It is called synchronously
// after the update's lock is released, so it may call back into the
// Cache, but it must be quick.
func WithEventHook(h func(Event)) Option { return func(c *config) { c.hook = h } }

// WithEjection sets the local passive ejection policy (see
// EjectionPolicy; zero fields take the defaults).
func WithEjection(p EjectionPolicy) Option { return func(c *config) { c.eject = p } }

// Event reports an update or file the Cache did not take as is, or a
// hold it ended by following the newest update (Err wraps
// ErrHoldFollowed). Err wraps one of the sentinel errors.
type Event struct {
	Service string
	// Version is the update's version (0 for a file that did not decode).
	Version uint64
	Err     error
	// Routable is the routable count the update described; Held is the
	// routable count routing kept (for a followed hold: the count it
	// held until then).
	Routable, Held int
}

// Stats counts what the Cache did since New.
type Stats struct {
	Applied            uint64 // updates routing switched to
	Loaded             uint64 // views loaded from disk
	Stale              uint64
	Gaps               uint64
	ChecksumMismatches uint64
	// SignatureRefusals counts views and deltas refused because they are
	// not signed by the region's key (WithViewKeys).
	SignatureRefusals uint64
	Invalid           uint64
	WouldEmpty        uint64
	ShrinkCapped      uint64
	CorruptFiles      uint64
	PersistErrors     uint64
	// Ejections counts endpoints ejected locally; EjectionsCapped the
	// ejections the cap refused; Unejections the ejections that ended.
	Ejections, EjectionsCapped, Unejections uint64
	// OutcomesUnknown counts Record calls naming an endpoint the Cache
	// does not hold.
	OutcomesUnknown uint64
	// RegistryShrinks counts updates taken at once although they shrink
	// the routable set beyond the cap or to nothing, because the
	// registry's counts say the instances left (a scale-down, a
	// decommission).
	RegistryShrinks uint64
	// HoldsFollowed counts holds that ended with routing following the
	// newest update because the server stood by it for the confirm time;
	// HoldsReleased those Release ended.
	HoldsFollowed, HoldsReleased uint64
	// Holding is how many services the shrink guard is holding now.
	Holding int
}

type stats struct {
	applied, loaded, stale, gaps, checksum, invalid, wouldEmpty, shrink, corrupt, persist atomic.Uint64
	ejections, ejectCapped, unejections, unknownOutcomes                                  atomic.Uint64
	registryShrinks, followed, released                                                   atomic.Uint64
	signature                                                                             atomic.Uint64
}

// Cache holds the routing snapshot of each configured service. Resolve and
// Pick are lock-free and allocation-free; updates to one service are
// serialised by that service's lock, which readers never take.
type Cache struct {
	cfg      config
	services map[string]*service // fixed at New; read concurrently
	names    []string            // services' keys, sorted
	st       stats
}

type service struct {
	name  string
	mu    sync.Mutex // serialises writers and ejection changes
	state atomic.Pointer[state]
	// outcomes holds the caller's outcome counters and ejection state by
	// instance id. The map is copied on write (when ids are added or
	// pruned, under mu) so Record reads it without a lock.
	outcomes atomic.Pointer[map[string]*outcome]
	ejected  int // outcomes with ejectedUntil set; guarded by mu
	// routed: routing has had a routable endpoint since New (from the
	// stream or a last-known-good file).
	routed atomic.Bool
	// fallback are the service's series in the peer regions (WithRegions),
	// in order of preference; fixed at New.
	fallback []*service
}

// state pairs the snapshot routing uses with the newest one recorded; they
// differ while a client guard holds a larger set, and then hold says
// since when and why. Deltas chain on latest. table is routing's pick
// table minus locally ejected endpoints.
type state struct {
	routing, latest *Snapshot
	hold            *Hold
	table           *pickTable
	ejected         int // routable endpoints of routing left out of table
}

// NewCache returns a Cache for services. With WithDir it loads each service's
// last-known-good view; a missing file leaves the service cold and a
// corrupt one is ignored and reported through the event hook and Stats.
func NewCache(services []string, opts ...Option) (*Cache, error) {
	cfg := config{clock: time.Now, random: rand.Uint64, maxShrink: DefaultMaxShrink}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.confirmAfter <= 0 {
		cfg.confirmAfter = DefaultConfirmAfter
	}
	if !(cfg.maxShrink >= 0 && cfg.maxShrink <= 1) {
		return nil, fmt.Errorf("resolver: max shrink %v outside [0,1]", cfg.maxShrink)
	}
	if err := cfg.eject.fill(); err != nil {
		return nil, err
	}
	if cfg.clock == nil || cfg.random == nil {
		return nil, errors.New("resolver: nil clock or random source")
	}
	services, fallbacks, err := expandRegions(services, cfg.regions)
	if err != nil {
		return nil, err
	}
	c := &Cache{cfg: cfg, services: make(map[string]*service, len(services))}
	for _, name := range services {
		if name == "" {
			return nil, errors.New("resolver: empty service name")
		}
		if _, dup := c.services[name]; dup {
			return nil, fmt.Errorf("resolver: service %q configured twice", name)
		}
		svc := &service{name: name}
		svc.outcomes.Store(&map[string]*outcome{})
		c.services[name] = svc
	}
	c.names = slices.Sorted(maps.Keys(c.services))
	for name, fb := range fallbacks {
		for _, f := range fb {
			c.services[name].fallback = append(c.services[name].fallback, c.services[f])
		}
	}
	if cfg.dir != "" {
		if err := os.MkdirAll(cfg.dir, 0o755); err != nil {
			return nil, fmt.Errorf("resolver: create cache dir: %w", err)
		}
		for _, name := range slices.Sorted(maps.Keys(c.services)) {
			c.load(c.services[name])
		}
	}
	return c, nil
}

func (c *Cache) load(svc *service) {
	v, err := LoadView(c.cfg.dir, svc.name)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		c.st.corrupt.Add(1)
		c.emit(Event{Service: svc.name, Version: v.Version, Err: err})
		return
	}
	eps := v.Endpoints // sorted and checksummed by LoadView
	snap := newSnapshot(svc.name, v.Version, pointers(eps), eps, v.Zones, v.GeneratedAt, c.cfg.clock(), v.Checksum, sumOf(eps))
	svc.mu.Lock()
	c.setState(svc, snap, snap, snap.eps, nil)
	svc.mu.Unlock()
	c.st.loaded.Add(1)
}

func (c *Cache) emit(evs ...Event) {
	if c.cfg.hook == nil {
		return
	}
	for _, e := range evs {
		c.cfg.hook(e)
	}
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	holding := 0
	for _, svc := range c.services {
		if st := svc.state.Load(); st != nil && st.hold != nil {
			holding++
		}
	}
	return Stats{
		Applied: c.st.applied.Load(), Loaded: c.st.loaded.Load(), Stale: c.st.stale.Load(),
		Gaps: c.st.gaps.Load(), ChecksumMismatches: c.st.checksum.Load(), SignatureRefusals: c.st.signature.Load(), Invalid: c.st.invalid.Load(),
		WouldEmpty: c.st.wouldEmpty.Load(), ShrinkCapped: c.st.shrink.Load(),
		CorruptFiles: c.st.corrupt.Load(), PersistErrors: c.st.persist.Load(),
		Ejections: c.st.ejections.Load(), EjectionsCapped: c.st.ejectCapped.Load(),
		Unejections: c.st.unejections.Load(), OutcomesUnknown: c.st.unknownOutcomes.Load(),
		RegistryShrinks: c.st.registryShrinks.Load(), HoldsFollowed: c.st.followed.Load(),
		HoldsReleased: c.st.released.Load(), Holding: holding,
	}
}

// Resolve returns the snapshot routing uses for service. It does no I/O,
// takes no lock and does not allocate. Errors are the bare sentinels
// ErrUnknownService and ErrNoView.
func (c *Cache) Resolve(service string) (Result, error) {
	svc := c.services[service]
	if svc == nil {
		return Result{}, ErrUnknownService
	}
	st := svc.state.Load()
	if st == nil {
		return Result{}, ErrNoView
	}
	return Result{Snapshot: st.routing, Now: c.cfg.clock(), Held: st.latest.version, Ejected: st.ejected, Hold: st.hold}, nil
}

// routedOnce reports whether routing for service has had a routable
// endpoint since New.
func (c *Cache) routedOnce(service string) bool {
	svc := c.services[service]
	return svc != nil && svc.routed.Load()
}

// Pick returns a routable endpoint of service chosen with probability
// proportional to its weight, skipping locally ejected endpoints. It is
// safe for concurrent use, takes no lock and does not allocate. Errors are
// the bare sentinels ErrUnknownService, ErrNoView and ErrNoEndpoints.
func (c *Cache) Pick(service string) (Endpoint, error) {
	svc := c.services[service]
	if svc == nil {
		return Endpoint{}, ErrUnknownService
	}
	if svc.fallback != nil {
		return c.pickRegional(svc)
	}
	return c.pickOne(svc)
}

// pickOne is Pick from svc's own view.
func (c *Cache) pickOne(svc *service) (Endpoint, error) {
	st := svc.state.Load()
	if st == nil {
		return Endpoint{}, ErrNoView
	}
	k, ok := st.table.pick(c.cfg.random())
	if !ok {
		return Endpoint{}, ErrNoEndpoints
	}
	return *st.routing.eps[k], nil
}

// ApplyView replaces service v.Service's view with v. The Cache takes
// ownership of v's endpoint capability slices and zone values; v itself
// may be reused.
//
// ErrStale: v is not newer than the held version; ignored. ErrChecksum or
// ErrInvalid: nothing changed. ErrWouldEmpty or ErrShrinkCapped: v was
// recorded (deltas may follow it) but routing keeps the larger set it
// held for now (see Hold); do not refetch.
func (c *Cache) ApplyView(v View) error {
	svc := c.services[v.Service]
	if svc == nil {
		return fmt.Errorf("apply view of %q: %w", v.Service, ErrUnknownService)
	}
	evs, err := c.applyView(svc, v)
	c.emit(evs...)
	return err
}

func (c *Cache) applyView(svc *service, v View) ([]Event, error) {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	cur := svc.state.Load()
	if cur != nil && v.Version <= cur.latest.version {
		c.st.stale.Add(1)
		return nil, fmt.Errorf("apply view %s v%d (held v%d): %w", svc.name, v.Version, cur.latest.version, ErrStale)
	}
	eps := slices.Clone(v.Endpoints)
	if !slices.IsSortedFunc(eps, compareEndpoints) {
		slices.SortFunc(eps, compareEndpoints)
	}
	if err := checkUnique(eps); err != nil {
		c.st.invalid.Add(1)
		err = fmt.Errorf("apply view %s v%d: %w: %w", svc.name, v.Version, err, ErrInvalid)
		return []Event{{Service: svc.name, Version: v.Version, Err: err}}, err
	}
	sum := sumOf(eps)
	if !sum.matches(v.Checksum) {
		c.st.checksum.Add(1)
		err := fmt.Errorf("apply view %s v%d: got %s, view says %s: %w", svc.name, v.Version, sum, v.Checksum, ErrChecksum)
		return []Event{{Service: svc.name, Version: v.Version, Err: err}}, err
	}
	if c.verifies(svc) {
		if err := verifySignature(c.cfg.viewKeys, v.Signature, v.Service, v.Version, sum, v.Zones); err != nil {
			c.st.signature.Add(1)
			err = fmt.Errorf("apply view %s v%d: %w", svc.name, v.Version, err)
			return []Event{{Service: svc.name, Version: v.Version, Err: err}}, err
		}
	}
	zones := maps.Clone(v.Zones)
	ptrs := pointers(eps)
	snap := newSnapshot(svc.name, v.Version, ptrs, eps, zones, v.GeneratedAt, c.cfg.clock(), v.Checksum, sum)
	added := ptrs
	if cur != nil {
		added = newIDs(cur.latest.eps, ptrs)
	}
	return c.publish(svc, cur, snap, added)
}

// ApplyDelta applies d to the held view of service d.Service. Errors are
// as for ApplyView, plus ErrGap when d does not start at the held version
// (or nothing is held): fetch a full view.
func (c *Cache) ApplyDelta(d Delta) error {
	svc := c.services[d.Service]
	if svc == nil {
		return fmt.Errorf("apply delta of %q: %w", d.Service, ErrUnknownService)
	}
	evs, err := c.applyDelta(svc, d)
	c.emit(evs...)
	return err
}

func (c *Cache) applyDelta(svc *service, d Delta) ([]Event, error) {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	cur := svc.state.Load()
	if cur == nil {
		c.st.gaps.Add(1)
		err := fmt.Errorf("apply delta %s v%d->v%d (nothing held): %w", svc.name, d.FromVersion, d.Version, ErrGap)
		return []Event{{Service: svc.name, Version: d.Version, Err: err}}, err
	}
	held := cur.latest
	if d.Version <= held.version {
		c.st.stale.Add(1)
		return nil, fmt.Errorf("apply delta %s v%d (held v%d): %w", svc.name, d.Version, held.version, ErrStale)
	}
	if d.FromVersion != held.version {
		c.st.gaps.Add(1)
		err := fmt.Errorf("apply delta %s v%d->v%d (held v%d): %w", svc.name, d.FromVersion, d.Version, held.version, ErrGap)
		return []Event{{Service: svc.name, Version: d.Version, Err: err}}, err
	}
	upserts := slices.Clone(d.Upserts) // the snapshot points into it
	if !slices.IsSortedFunc(upserts, compareEndpoints) {
		slices.SortFunc(upserts, compareEndpoints)
	}
	if err := checkUnique(upserts); err != nil {
		c.st.invalid.Add(1)
		err = fmt.Errorf("apply delta %s v%d: %w: %w", svc.name, d.Version, err, ErrInvalid)
		return []Event{{Service: svc.name, Version: d.Version, Err: err}}, err
	}
	// Check the checksum before building anything: ten hashes for a
	// ten-endpoint delta, whatever the size of the view.
	sum := deltaSum(held.sum, held.eps, upserts, d.Removals)
	if !sum.matches(d.Checksum) {
		c.st.checksum.Add(1)
		err := fmt.Errorf("apply delta %s v%d: got %s, delta says %s: %w", svc.name, d.Version, sum, d.Checksum, ErrChecksum)
		return []Event{{Service: svc.name, Version: d.Version, Err: err}}, err
	}
	zones := maps.Clone(held.zones)
	if zones == nil {
		zones = make(map[string]Zone, len(d.Zones))
	}
	maps.Copy(zones, d.Zones)
	for _, z := range d.RemovedZones {
		delete(zones, z)
	}
	if c.verifies(svc) {
		// The signature is the resulting view's: over the checksum the
		// client computed and the zones it would hold.
		if err := verifySignature(c.cfg.viewKeys, d.Signature, d.Service, d.Version, sum, zones); err != nil {
			c.st.signature.Add(1)
			err = fmt.Errorf("apply delta %s v%d: %w", svc.name, d.Version, err)
			return []Event{{Service: svc.name, Version: d.Version, Err: err}}, err
		}
	}
	eps := merge(held.eps, upserts, d.Removals)
	snap := newSnapshot(svc.name, d.Version, eps, nil, zones, d.GeneratedAt, c.cfg.clock(), d.Checksum, sum)
	return c.publish(svc, cur, snap, pointers(upserts))
}

// publish records snap as the newest state and switches routing to it
// unless the shrink guard holds; added holds the endpoints that may be new
// to the service. Called with svc.mu held.
func (c *Cache) publish(svc *service, cur *state, snap *Snapshot, added []*Endpoint) ([]Event, error) {
	if cur == nil {
		c.setState(svc, snap, snap, added, nil)
		return c.switched(svc, snap, "apply"), nil
	}
	reason, explained := c.guard(cur.routing, snap)
	if reason == nil {
		if explained {
			c.st.registryShrinks.Add(1)
		}
		c.setState(svc, snap, snap, added, nil) // ends any hold
		return c.switched(svc, snap, "apply"), nil
	}
	now := c.cfg.clock()
	since := now
	if cur.hold != nil {
		// Every update since the hold began was refused: the server has
		// stood by a smaller set since then.
		since = cur.hold.Since
	}
	h := &Hold{
		Reason: reason, Since: since, FollowAt: since.Add(c.cfg.confirmAfter),
		HeldVersion: cur.routing.version, HeldRoutable: cur.routing.routable,
		NewestVersion: snap.version, NewestRoutable: snap.routable,
	}
	if !now.Before(h.FollowAt) {
		c.setState(svc, snap, snap, added, nil)
		return c.followed(svc, h, snap), nil
	}
	if reason == ErrWouldEmpty {
		c.st.wouldEmpty.Add(1)
	} else {
		c.st.shrink.Add(1)
	}
	c.setState(svc, cur.routing, snap, added, h)
	err := fmt.Errorf("apply %s v%d: %d routable, holding v%d with %d since %s, following at %s unless the server sends a larger set: %w",
		svc.name, snap.version, snap.routable, h.HeldVersion, h.HeldRoutable,
		h.Since.Format(time.RFC3339), h.FollowAt.Format(time.RFC3339), reason)
	return []Event{{Service: svc.name, Version: snap.version, Err: err, Routable: snap.routable, Held: h.HeldRoutable}}, err
}

// guard decides whether routing may switch from old to next. It returns
// ErrWouldEmpty or ErrShrinkCapped to hold old, or nil; explained reports
// that the registry's counts accounted for a shrink that would otherwise
// have been held.
//
// The shrink is measured against what routing holds, less the instances
// the registry removed (registryRemoved): a scale-down or decommission is
// intended, a mass withdrawal of registered instances may be a fault.
func (c *Cache) guard(old, next *Snapshot) (reason error, explained bool) {
	if next.routable >= old.routable {
		return nil, false
	}
	removed, known := registryRemoved(old, next)
	if next.routable == 0 {
		// Empty is taken only when every routable endpoint left the
		// registry, or nothing is registered at all (every zone gone or
		// at zero).
		if n, ok := next.Registered(); ok && n == 0 || known && removed >= old.routable {
			return nil, true
		}
		return ErrWouldEmpty, false
	}
	if next.tripped {
		// A tripped zone guard means muster publishes full zones: the
		// server already refused to shrink them.
		return nil, false
	}
	floor := float64(old.routable) * (1 - c.cfg.maxShrink)
	if float64(next.routable) >= floor {
		return nil, false
	}
	if known && float64(next.routable+removed) >= floor {
		return nil, true
	}
	return ErrShrinkCapped, false
}

// registryRemoved returns how many registered instances old's zones lost
// by next: the sum over old's zones of the drop in Registered, a zone
// absent from next counting as all of its instances gone. known is false
// when a zone involved does not carry Registered.
func registryRemoved(old, next *Snapshot) (removed int, known bool) {
	for name, oz := range old.zones {
		if oz.Registered == nil {
			return 0, false
		}
		nz, ok := next.zones[name]
		if !ok {
			removed += max(0, *oz.Registered)
			continue
		}
		if nz.Registered == nil {
			return 0, false
		}
		removed += max(0, *oz.Registered-*nz.Registered)
	}
	return removed, true
}

// switched counts a switch of routing to snap (by op: apply, follow or
// release) and writes snap as the last-known-good file, so a restarted
// process starts from what this one routed on. Called with svc.mu held.
func (c *Cache) switched(svc *service, snap *Snapshot, op string) []Event {
	c.st.applied.Add(1)
	if c.cfg.dir == "" {
		return nil
	}
	if err := writeView(c.cfg.dir, snap.View()); err != nil {
		c.st.persist.Add(1)
		// Routing already switched; the disk copy is only a cold-start
		// aid, so report rather than fail the update.
		err = fmt.Errorf("%s %s v%d: %w: %w", op, svc.name, snap.version, ErrPersist, err)
		return []Event{{Service: svc.name, Version: snap.version, Err: err, Routable: snap.routable, Held: snap.routable}}
	}
	return nil
}

// followed reports that routing followed snap, the newest update of hold
// h, and persists it. Called with svc.mu held, after setState.
func (c *Cache) followed(svc *service, h *Hold, snap *Snapshot) []Event {
	c.st.followed.Add(1)
	err := fmt.Errorf("follow %s v%d with %d routable: the server stood by a smaller set than v%d's %d (%s) since %s: %w",
		svc.name, h.NewestVersion, h.NewestRoutable, h.HeldVersion, h.HeldRoutable, holdReason(h.Reason),
		h.Since.Format(time.RFC3339), ErrHoldFollowed)
	evs := []Event{{Service: svc.name, Version: h.NewestVersion, Err: err, Routable: h.NewestRoutable, Held: h.HeldRoutable}}
	return append(evs, c.switched(svc, snap, "follow")...)
}

func holdReason(err error) string {
	if err == ErrWouldEmpty {
		return "would empty"
	}
	return "shrink capped"
}

// followDue switches routing to the newest update if svc's hold has
// lasted the confirm time by now. Called with svc.mu held.
func (c *Cache) followDue(svc *service, now time.Time) ([]Event, bool) {
	st := svc.state.Load()
	if st == nil || st.hold == nil || now.Before(st.hold.FollowAt) {
		return nil, false
	}
	c.setState(svc, st.latest, st.latest, nil, nil)
	return c.followed(svc, st.hold, st.latest), true
}

// Release switches routing for service to the newest recorded update,
// ending a hold before its confirm time (an operator's decision that the
// shrink is intended). It writes the last-known-good file like any switch.
func (c *Cache) Release(service string) error {
	svc := c.services[service]
	if svc == nil {
		return fmt.Errorf("release %q: %w", service, ErrUnknownService)
	}
	svc.mu.Lock()
	cur := svc.state.Load()
	if cur == nil {
		svc.mu.Unlock()
		return fmt.Errorf("release %q: %w", service, ErrNoView)
	}
	var evs []Event
	if cur.hold != nil {
		c.setState(svc, cur.latest, cur.latest, nil, nil)
		c.st.released.Add(1)
		evs = c.switched(svc, cur.latest, "release")
	}
	svc.mu.Unlock()
	c.emit(evs...)
	return nil
}

// newIDs returns the endpoints of next whose ids old lacks; both sorted.
func newIDs(old, next []*Endpoint) []*Endpoint {
	added := []*Endpoint{} // not nil: nil means "rebuild" to setState
	i := 0
	for _, e := range next {
		for i < len(old) && old[i].InstanceID < e.InstanceID {
			i++
		}
		if i == len(old) || old[i].InstanceID != e.InstanceID {
			added = append(added, e)
		}
	}
	return added
}

func checkUnique(eps []Endpoint) error {
	for i := 1; i < len(eps); i++ {
		if eps[i].InstanceID == eps[i-1].InstanceID {
			return fmt.Errorf("duplicate instance %s", eps[i].InstanceID)
		}
	}
	return nil
}

// merge returns a new sorted slice: old minus removals, then upserts
// (sorted and unique) replacing or adding by instance id. It copies
// pointers, never endpoints.
func merge(old []*Endpoint, upserts []Endpoint, removals []string) []*Endpoint {
	cmp := func(e *Endpoint, id string) int { return cmpString(e.InstanceID, id) }
	var gone []int // indexes into old, sorted
	for _, id := range removals {
		if k, ok := slices.BinarySearchFunc(old, id, cmp); ok {
			gone = append(gone, k)
		}
	}
	slices.Sort(gone)
	out := make([]*Endpoint, 0, len(old)+len(upserts))
	// keep appends old[lo:hi] minus the removed indexes.
	keep := func(lo, hi int) {
		for len(gone) > 0 && gone[0] < hi {
			if g := gone[0]; g >= lo {
				out = append(out, old[lo:g]...)
				lo = g + 1
			}
			gone = gone[1:]
		}
		out = append(out, old[lo:hi]...)
	}
	i := 0
	for k := range upserts {
		p, found := slices.BinarySearchFunc(old[i:], upserts[k].InstanceID, cmp)
		p += i
		keep(i, p)
		out = append(out, &upserts[k])
		i = p
		if found {
			i++
		}
	}
	keep(i, len(old))
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
