package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/worker"
)

// ErrNotLoaded means the in-memory copy of services and grants has not
// been loaded from PostgreSQL yet; callers answer 503 with a short
// Retry-After.
var ErrNotLoaded = errors.New("the copy of services and grants has not been loaded from the database yet")

// AuthzCacheConfig configures an AuthzCache.
type AuthzCacheConfig struct {
	Registry *Registry
	// Interval between reloads from PostgreSQL: 2 s. Writes through this
	// process are applied at once besides.
	Interval time.Duration
	// Timeout bounds one reload: 5 s.
	Timeout time.Duration
	// Now defaults to time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Registerer receives muster_authz_cache_age_seconds; nil registers
	// nowhere.
	Registerer prometheus.Registerer
}

// Validate checks the configuration and fills defaults.
func (c *AuthzCacheConfig) Validate() error {
	if c.Registry == nil {
		return errors.New("authz cache: Registry is required")
	}
	if c.Interval == 0 {
		c.Interval = 2 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Interval < 0 || c.Timeout < 0 {
		return fmt.Errorf("authz cache: Interval %s and Timeout %s must not be negative", c.Interval, c.Timeout)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// AuthzCache is an in-memory copy of every service (name and owner) and
// every grant, reloaded from PostgreSQL by a worker, so that watch and
// resolve authorise without a database round trip and keep working while
// PostgreSQL is away: the last copy serves, and its age is exported. The
// decisions are Registry.MayResolve's, made by the same function.
//
// Writes through this process (PutService, PutGrants) are applied to it as
// soon as they commit; writes through other replicas show after the next
// reload.
type AuthzCache struct {
	cfg    AuthzCacheConfig
	log    *slog.Logger
	runner worker.Runner
	wake   chan struct{}

	mu       sync.RWMutex
	loaded   bool
	loadedAt time.Time
	failing  bool   // the last reload failed (logged once per episode)
	gen      uint64 // bumped by every write applied directly
	services map[string]string
	grants   map[string]map[string]struct{} // service -> callers
	// revoked is closed (and replaced) when a change takes authority
	// away: a grant removed or a service gone.
	revoked chan struct{}
}

// NewAuthzCache returns a stopped, empty AuthzCache and attaches it to the
// registry, which from then on tells it of its own writes.
func NewAuthzCache(cfg AuthzCacheConfig) (*AuthzCache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &AuthzCache{cfg: cfg, log: cfg.Logger.With("worker", "authz-cache"), wake: make(chan struct{}, 1),
		services: map[string]string{}, grants: map[string]map[string]struct{}{}, revoked: make(chan struct{})}
	if cfg.Registerer != nil {
		age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_authz_cache_age_seconds",
			Help: "Age of the in-memory copy of services and grants that watch and resolve authorise from (+Inf until the first load).",
		}, func() float64 {
			age, ok := c.Age()
			if !ok {
				return math.Inf(1)
			}
			return age.Seconds()
		})
		if err := cfg.Registerer.Register(age); err != nil {
			return nil, fmt.Errorf("authz cache: register metrics: %w", err)
		}
	}
	cfg.Registry.authz.Store(c)
	return c, nil
}

// Start loads the copy, then reloads it every Interval (and soon after a
// write through this process) until ctx ends or Stop is called.
func (c *AuthzCache) Start(ctx context.Context) error { return c.runner.Start(ctx, c.loop) }

// Stop ends the loop and waits. Safe to call twice or before Start.
func (c *AuthzCache) Stop() { c.runner.Stop() }

func (c *AuthzCache) loop(ctx context.Context) {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		err := c.runOnce(ctx)
		c.mu.Lock()
		switch {
		case err != nil && ctx.Err() == nil && !c.failing:
			c.failing = true
			c.log.Warn("reload services and grants; the last copy serves", "err", err, "loaded", c.loaded)
		case err == nil && c.failing:
			c.failing = false
			c.log.Info("services and grants reloaded again")
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.wake:
		}
	}
}

// runOnce reloads the copy from PostgreSQL. A failed reload leaves the
// last copy in place.
func (c *AuthzCache) runOnce(ctx context.Context) error {
	c.mu.RLock()
	gen := c.gen
	c.mu.RUnlock()
	lctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	rows, err := db.New(c.cfg.Registry.cfg.Pool).ServiceGrantsAll(lctx)
	cancel()
	if err != nil {
		return fmt.Errorf("load services and grants: %w", err)
	}
	services := make(map[string]string, len(rows))
	grants := map[string]map[string]struct{}{}
	for _, row := range rows {
		services[row.Name] = row.Owner
		if row.Caller != nil {
			if grants[row.Name] == nil {
				grants[row.Name] = map[string]struct{}{}
			}
			grants[row.Name][*row.Caller] = struct{}{}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		// A write through this process was applied while the rows were
		// read, and they may predate it: read again rather than undo it.
		c.poke()
		return nil
	}
	if c.loaded && withdrawn(c.services, c.grants, services, grants) {
		c.revoke()
	}
	c.services, c.grants = services, grants
	c.loaded, c.loadedAt = true, c.cfg.Now()
	return nil
}

// withdrawn reports whether the new copy lacks a service or a grant the
// old one held.
func withdrawn(oldServices map[string]string, oldGrants map[string]map[string]struct{},
	services map[string]string, grants map[string]map[string]struct{}) bool {
	for name := range oldServices {
		if _, ok := services[name]; !ok {
			return true
		}
	}
	for service, callers := range oldGrants {
		if lostCaller(callers, grants[service]) {
			return true
		}
	}
	return false
}

func lostCaller(old, cur map[string]struct{}) bool {
	for caller := range old {
		if _, ok := cur[caller]; !ok {
			return true
		}
	}
	return false
}

// revoke tells the holders of Revoked that authority was taken away.
// c.mu must be held.
func (c *AuthzCache) revoke() {
	close(c.revoked)
	c.revoked = make(chan struct{})
}

// Revoked returns a channel closed the next time the copy changes in a
// way that takes authority away (a grant removed, a service gone), by a
// reload or a write through this process. Watch streams wait on it to
// ask MayResolve again; additions never close it.
func (c *AuthzCache) Revoked() <-chan struct{} {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.revoked
}

func (c *AuthzCache) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// putService applies a committed service write.
func (c *AuthzCache) putService(name, owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.services[name] = owner
	c.gen++
}

// putGrants applies a committed grants write (the full list).
func (c *AuthzCache) putGrants(service string, callers []string) {
	set := make(map[string]struct{}, len(callers))
	for _, caller := range callers {
		set[caller] = struct{}{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if lostCaller(c.grants[service], set) {
		c.revoke()
	}
	c.grants[service] = set
	c.gen++
}

// MayResolve is Registry.MayResolve answered from the copy: nil, a
// forbidden refusal, or ErrNotLoaded while there is no copy yet and the
// decision needs one.
func (c *AuthzCache) MayResolve(actor identity.Principal, service string) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return mayResolve(actor, service, func(caller string) (bool, error) {
		if !c.loaded {
			return false, ErrNotLoaded
		}
		_, ok := c.grants[service][caller]
		return ok, nil
	})
}

// ServiceExists is Registry.ServiceExists answered from the copy; it
// checks no authority either.
func (c *AuthzCache) ServiceExists(name string) (bool, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.loaded {
		return false, ErrNotLoaded
	}
	_, ok := c.services[name]
	return ok, nil
}

// Age is how long ago the copy was last loaded in full from PostgreSQL;
// ok is false before the first load.
func (c *AuthzCache) Age() (age time.Duration, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.loaded {
		return 0, false
	}
	return c.cfg.Now().Sub(c.loadedAt), true
}

// RunOnce reloads the copy now, as the worker's ticker would. Tests call
// it to load the copy without starting the worker.
func (c *AuthzCache) RunOnce(ctx context.Context) error { return c.runOnce(ctx) }
