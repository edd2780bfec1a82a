package resolver

import (
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
	clock     func() time.Time
	random    func() uint64
	dir       string
	maxShrink float64
	hook      func(Event)
	eject     EjectionPolicy
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
// may remove (default DefaultMaxShrink); 1 disables the shrink guard.
func WithMaxShrink(f float64) Option { return func(c *config) { c.maxShrink = f } }

// WithEventHook receives every refusal, stale or broken update, corrupt
// cache file and persist failure. It is called synchronously after the
// update's lock is released, so it may call back into the Cache, but it
// must be quick.
func WithEventHook(h func(Event)) Option { return func(c *config) { c.hook = h } }

// WithEjection sets the local passive ejection policy (see
// EjectionPolicy; zero fields take the defaults).
func WithEjection(p EjectionPolicy) Option { return func(c *config) { c.eject = p } }

// Event reports an update or file the Cache did not take as is. Err wraps
// one of the sentinel errors.
type Event struct {
	Service string
	// Version is the update's version (0 for a file that did not decode).
	Version uint64
	Err     error
	// Routable is the routable count the update described; Held is the
	// routable count routing kept.
	Routable, Held int
}

// Stats counts what the Cache did since New.
type Stats struct {
	Applied            uint64 // updates routing switched to
	Loaded             uint64 // views loaded from disk
	Stale              uint64
	Gaps               uint64
	ChecksumMismatches uint64
	Invalid            uint64
	WouldEmpty         uint64
	ShrinkCapped       uint64
	CorruptFiles       uint64
	PersistErrors      uint64
	// Ejections counts endpoints ejected locally; EjectionsCapped the
	// ejections the cap refused; Unejections the ejections that ended.
	Ejections, EjectionsCapped, Unejections uint64
	// OutcomesUnknown counts Record calls naming an endpoint the Cache
	// does not hold.
	OutcomesUnknown uint64
}

type stats struct {
	applied, loaded, stale, gaps, checksum, invalid, wouldEmpty, shrink, corrupt, persist atomic.Uint64
	ejections, ejectCapped, unejections, unknownOutcomes                                  atomic.Uint64
}

// Cache holds the routing snapshot of each configured service. Resolve and
// Pick are lock-free and allocation-free; updates to one service are
// serialised by that service's lock, which readers never take.
type Cache struct {
	cfg      config
	services map[string]*service // fixed at New; read concurrently
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
}

// state pairs the snapshot routing uses with the newest one recorded; they
// differ while a client guard holds a larger set. Deltas chain on latest.
// table is routing's pick table minus locally ejected endpoints.
type state struct {
	routing, latest *Snapshot
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
	if !(cfg.maxShrink >= 0 && cfg.maxShrink <= 1) {
		return nil, fmt.Errorf("resolver: max shrink %v outside [0,1]", cfg.maxShrink)
	}
	if err := cfg.eject.fill(); err != nil {
		return nil, err
	}
	if cfg.clock == nil || cfg.random == nil {
		return nil, errors.New("resolver: nil clock or random source")
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
	c.setState(svc, snap, snap, snap.eps)
	svc.mu.Unlock()
	c.st.loaded.Add(1)
}

func (c *Cache) emit(e Event) {
	if c.cfg.hook != nil {
		c.cfg.hook(e)
	}
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	return Stats{
		Applied: c.st.applied.Load(), Loaded: c.st.loaded.Load(), Stale: c.st.stale.Load(),
		Gaps: c.st.gaps.Load(), ChecksumMismatches: c.st.checksum.Load(), Invalid: c.st.invalid.Load(),
		WouldEmpty: c.st.wouldEmpty.Load(), ShrinkCapped: c.st.shrink.Load(),
		CorruptFiles: c.st.corrupt.Load(), PersistErrors: c.st.persist.Load(),
		Ejections: c.st.ejections.Load(), EjectionsCapped: c.st.ejectCapped.Load(),
		Unejections: c.st.unejections.Load(), OutcomesUnknown: c.st.unknownOutcomes.Load(),
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
	return Result{Snapshot: st.routing, Now: c.cfg.clock(), Held: st.latest.version, Ejected: st.ejected}, nil
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
// held; do not refetch.
func (c *Cache) ApplyView(v View) error {
	svc := c.services[v.Service]
	if svc == nil {
		return fmt.Errorf("apply view of %q: %w", v.Service, ErrUnknownService)
	}
	ev, err := c.applyView(svc, v)
	if ev != nil {
		c.emit(*ev)
	}
	return err
}

func (c *Cache) applyView(svc *service, v View) (*Event, error) {
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
		return &Event{Service: svc.name, Version: v.Version, Err: err}, err
	}
	sum := sumOf(eps)
	if !sum.matches(v.Checksum) {
		c.st.checksum.Add(1)
		err := fmt.Errorf("apply view %s v%d: got %s, view says %s: %w", svc.name, v.Version, sum, v.Checksum, ErrChecksum)
		return &Event{Service: svc.name, Version: v.Version, Err: err}, err
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
	ev, err := c.applyDelta(svc, d)
	if ev != nil {
		c.emit(*ev)
	}
	return err
}

func (c *Cache) applyDelta(svc *service, d Delta) (*Event, error) {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	cur := svc.state.Load()
	if cur == nil {
		c.st.gaps.Add(1)
		err := fmt.Errorf("apply delta %s v%d->v%d (nothing held): %w", svc.name, d.FromVersion, d.Version, ErrGap)
		return &Event{Service: svc.name, Version: d.Version, Err: err}, err
	}
	held := cur.latest
	if d.Version <= held.version {
		c.st.stale.Add(1)
		return nil, fmt.Errorf("apply delta %s v%d (held v%d): %w", svc.name, d.Version, held.version, ErrStale)
	}
	if d.FromVersion != held.version {
		c.st.gaps.Add(1)
		err := fmt.Errorf("apply delta %s v%d->v%d (held v%d): %w", svc.name, d.FromVersion, d.Version, held.version, ErrGap)
		return &Event{Service: svc.name, Version: d.Version, Err: err}, err
	}
	upserts := slices.Clone(d.Upserts) // the snapshot points into it
	if !slices.IsSortedFunc(upserts, compareEndpoints) {
		slices.SortFunc(upserts, compareEndpoints)
	}
	if err := checkUnique(upserts); err != nil {
		c.st.invalid.Add(1)
		err = fmt.Errorf("apply delta %s v%d: %w: %w", svc.name, d.Version, err, ErrInvalid)
		return &Event{Service: svc.name, Version: d.Version, Err: err}, err
	}
	// Check the checksum before building anything: ten hashes for a
	// ten-endpoint delta, whatever the size of the view.
	sum := deltaSum(held.sum, held.eps, upserts, d.Removals)
	if !sum.matches(d.Checksum) {
		c.st.checksum.Add(1)
		err := fmt.Errorf("apply delta %s v%d: got %s, delta says %s: %w", svc.name, d.Version, sum, d.Checksum, ErrChecksum)
		return &Event{Service: svc.name, Version: d.Version, Err: err}, err
	}
	eps := merge(held.eps, upserts, d.Removals)
	zones := maps.Clone(held.zones)
	if zones == nil {
		zones = make(map[string]Zone, len(d.Zones))
	}
	maps.Copy(zones, d.Zones)
	for _, z := range d.RemovedZones {
		delete(zones, z)
	}
	snap := newSnapshot(svc.name, d.Version, eps, nil, zones, d.GeneratedAt, c.cfg.clock(), d.Checksum, sum)
	return c.publish(svc, cur, snap, pointers(upserts))
}

// publish records snap as the newest state and switches routing to it
// unless a client guard refuses; added holds the endpoints that may be new
// to the service. Called with svc.mu held.
func (c *Cache) publish(svc *service, cur *state, snap *Snapshot, added []*Endpoint) (*Event, error) {
	routing := snap
	var gerr error
	if cur != nil && !snap.drained {
		old := cur.routing
		switch {
		case snap.Routable() == 0 && old.Routable() > 0:
			gerr = ErrWouldEmpty
			c.st.wouldEmpty.Add(1)
		case !snap.tripped && float64(snap.Routable()) < float64(old.Routable())*(1-c.cfg.maxShrink):
			gerr = ErrShrinkCapped
			c.st.shrink.Add(1)
		}
		if gerr != nil {
			routing = old
		}
	}
	c.setState(svc, routing, snap, added)
	if gerr != nil {
		err := fmt.Errorf("apply %s v%d: %d routable, holding v%d with %d: %w",
			svc.name, snap.version, snap.Routable(), routing.version, routing.Routable(), gerr)
		return &Event{Service: svc.name, Version: snap.version, Err: err, Routable: snap.Routable(), Held: routing.Routable()}, err
	}
	c.st.applied.Add(1)
	if c.cfg.dir != "" {
		if err := writeView(c.cfg.dir, snap.View()); err != nil {
			c.st.persist.Add(1)
			err = fmt.Errorf("apply %s v%d: %w: %w", svc.name, snap.version, ErrPersist, err)
			// Routing already switched; the disk copy is only a cold-start
			// aid, so report rather than fail the update.
			return &Event{Service: svc.name, Version: snap.version, Err: err, Routable: snap.Routable(), Held: snap.Routable()}, nil
		}
	}
	return nil, nil
}

// Release switches routing for service to the newest recorded update,
// overriding a client guard that is holding a larger set (an operator's
// decision that the shrink is intended).
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
	var ev *Event
	if cur.routing != cur.latest {
		c.setState(svc, cur.latest, cur.latest, nil)
		c.st.applied.Add(1)
		if c.cfg.dir != "" {
			if err := writeView(c.cfg.dir, cur.latest.View()); err != nil {
				c.st.persist.Add(1)
				ev = &Event{Service: service, Version: cur.latest.version, Err: fmt.Errorf("release %s: %w: %w", service, ErrPersist, err)}
			}
		}
	}
	svc.mu.Unlock()
	if ev != nil {
		c.emit(*ev)
	}
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
