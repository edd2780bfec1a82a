package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
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
	// HoldShare is the disbelief share: a reload that finds more than this
	// share of the copy's rows (services and grants) gone is held (see
	// AuthzCache); 0.1 by default.
	HoldShare float64
	// Registerer receives muster_authz_cache_age_seconds and the
	// muster_authz_* gauges of rows not believed; nil registers nowhere.
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
	if c.HoldShare == 0 {
		c.HoldShare = 0.1
	}
	if c.HoldShare < 0 || c.HoldShare >= 1 {
		return fmt.Errorf("authz cache: HoldShare %v must be in (0, 1)", c.HoldShare)
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

// Alarms about the copy of services and grants.
const (
	// AlarmGrantUnsealed is open while a grant row does not verify (written
	// outside muster): it shows its service to nobody new, and the copy
	// keeps what it held for that caller.
	AlarmGrantUnsealed = "grant_unsealed"
	// AlarmServiceUnsealed is open while a service row does not verify (an
	// owner or capabilities changed outside muster): the copy keeps the
	// owner muster last sealed, or none.
	AlarmServiceUnsealed = "service_unsealed"
	// AlarmAuthzRowMissing is open while a service or a grant the copy
	// holds has no row any more: only a sealed tombstone revokes, so the
	// copy keeps it.
	AlarmAuthzRowMissing = "authz_row_missing"
	// AlarmAuthzReloadHeld is open while a reload that lost more than the
	// disbelief share of the copy's rows is held.
	AlarmAuthzReloadHeld = "authz_reload_held"
)

// AuthzCache is an in-memory copy of every service (name and owner) and
// every grant, reloaded from PostgreSQL by a worker, so that watch, resolve
// and xDS authorise without a database round trip and keep working while
// PostgreSQL is away: the last copy serves, and its age is exported. The
// decisions are Registry.MayResolve's, made by the same function.
//
// The copy believes only rows muster sealed (authzseal.go), and never
// believes an absence:
//
//   - a grant row that does not verify (inserted or changed by hand) is
//     ignored: the copy keeps what it held for that caller (nothing, for a
//     new one), and a grant_unsealed alarm is open;
//   - a service row that does not verify keeps the owner the copy last
//     verified (at a cold start: no owner, so only admins may change it);
//     the service still exists for its readers (service_unsealed);
//   - a sealed row of an older version than the copy applied for the
//     same caller (an old grant put back over its tombstone) is treated
//     as unsealed;
//   - only a sealed tombstone (revoked_at, written by PutGrants) revokes.
//     A service or grant whose row is gone (deleted by hand, a restore
//     from an old backup) is kept, with an authz_row_missing alarm;
//   - a reload that finds more than HoldShare of the rows the previous
//     load saw gone is held (authz_reload_held): the copy keeps its
//     previous state and applies only sealed tombstones, until the rows
//     come back or an admin confirms (Registry.ConfirmAuthzReload, POST
//     /v1/authz/reload-confirmations). After a confirmation the reload
//     is applied, and the missing rows are still kept: confirming says
//     "this database is the one", not "revoke what it lost".
//
// So existing watch and xDS streams lose a service only through a
// sealed revocation (Revoked is closed by nothing else). A replica
// started afresh does not know the rows that went missing before it
// started: it serves what verifies.
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
	services map[string]authzService
	grants   map[string]map[string]authzGrant // service -> caller -> state
	// present holds the keys (authzKey) of the rows the last applied
	// reload read: the base a reload's losses are counted against.
	present  map[string]struct{}
	unsealed map[string]authzDoubt // by authzKey
	missing  map[string]authzDoubt // by authzKey
	held     *authzHold
	// revoked is closed (and replaced) when a change takes authority
	// away: a sealed revocation.
	revoked chan struct{}
	// rows are the rows last read (from PostgreSQL, or a peer's while it
	// was unreachable: LoadSnapshot), handed to peers (Snapshot);
	// dbLoaded says the database has been read once.
	rows     authzRows
	hasRows  bool
	dbLoaded bool
}

type authzService struct {
	owner    string
	verified bool // owner is from a seal that verified
}

type authzGrant struct {
	active  bool
	version int64 // the row's version, as sealed
}

// authzDoubt is a row the copy does not believe as it stands.
type authzDoubt struct {
	service, caller string // caller "" for a service row
	reason          string
	since           time.Time
}

type authzHold struct {
	since    time.Time
	lost, of int
}

func serviceKey(name string) string          { return "s\x00" + name }
func grantKey(service, caller string) string { return "g\x00" + service + "\x00" + caller }

// NewAuthzCache returns a stopped, empty AuthzCache and attaches it to the
// registry, which from then on tells it of its own writes.
func NewAuthzCache(cfg AuthzCacheConfig) (*AuthzCache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &AuthzCache{cfg: cfg, log: cfg.Logger.With("worker", "authz-cache"), wake: make(chan struct{}, 1),
		services: map[string]authzService{}, grants: map[string]map[string]authzGrant{}, present: map[string]struct{}{},
		unsealed: map[string]authzDoubt{}, missing: map[string]authzDoubt{}, revoked: make(chan struct{})}
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
		count := func(m func() map[string]authzDoubt) func() float64 {
			return func() float64 {
				c.mu.RLock()
				defer c.mu.RUnlock()
				return float64(len(m()))
			}
		}
		unsealed := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_authz_unsealed",
			Help: "Service and grant rows whose seal does not verify (written outside muster); the copy does not believe them.",
		}, count(func() map[string]authzDoubt { return c.unsealed }))
		missing := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_authz_missing",
			Help: "Services and grants the copy keeps although their rows are gone (only a sealed tombstone revokes).",
		}, count(func() map[string]authzDoubt { return c.missing }))
		held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_authz_reload_held",
			Help: "1 while a reload of services and grants that lost more than the disbelief share is held.",
		}, func() float64 {
			c.mu.RLock()
			defer c.mu.RUnlock()
			if c.held != nil {
				return 1
			}
			return 0
		})
		for _, g := range []prometheus.Collector{age, unsealed, missing, held} {
			if err := cfg.Registerer.Register(g); err != nil {
				return nil, fmt.Errorf("authz cache: register metrics: %w", err)
			}
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

// authzRows is one reload's read, with each row's verification.
type authzRows struct {
	services     []db.Service
	serviceErrs  []error
	grants       []db.ServiceGrant
	grantErrs    []error
	confirmedAt  time.Time // the newest reload confirmation (zero: none)
	confirmation string
}

// read reads and verifies every service and grant row.
func (c *AuthzCache) read(ctx context.Context) (authzRows, error) {
	r := c.cfg.Registry
	var out authzRows
	err := db.WithTx(ctx, r.cfg.Pool, func(q *db.Queries) error {
		var err error
		if out.services, err = q.ServicesAll(ctx); err != nil {
			return fmt.Errorf("read services: %w", err)
		}
		if out.grants, err = q.GrantsAllRows(ctx); err != nil {
			return fmt.Errorf("read grants: %w", err)
		}
		confs, err := q.AuthzReloadConfirmationsRecent(ctx)
		if err != nil {
			return fmt.Errorf("read reload confirmations: %w", err)
		}
		// The newest muster wrote; one written by hand releases nothing.
		for _, conf := range confs {
			if r.believeAuthzConfirmation(conf) {
				out.confirmedAt, out.confirmation = conf.ConfirmedAt, conf.ConfirmedBy
				break
			}
		}
		return nil
	})
	if err != nil {
		return authzRows{}, err
	}
	r.serviceSeals.Next()
	out.serviceErrs = make([]error, len(out.services))
	for i, row := range out.services {
		out.serviceErrs[i] = r.verifyService(row)
	}
	r.grantSeals.Next()
	out.grantErrs = make([]error, len(out.grants))
	for i, row := range out.grants {
		out.grantErrs[i] = r.verifyGrant(row)
	}
	return out, nil
}

// runOnce reloads the copy from PostgreSQL. A failed reload leaves the
// last copy in place. The first adopts the services and grants from
// before their seals, so that an upgrade does not lose them.
func (c *AuthzCache) runOnce(ctx context.Context) error {
	c.mu.RLock()
	gen, loaded := c.gen, c.dbLoaded
	c.mu.RUnlock()
	lctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	if !loaded {
		if _, err := c.cfg.Registry.adoptAuthz(lctx); err != nil {
			return fmt.Errorf("adopt services and grants from before the seals: %w", err)
		}
	}
	rows, err := c.read(lctx)
	if err != nil {
		return fmt.Errorf("load services and grants: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		// A write through this process was applied while the rows were
		// read, and they may predate it: read again rather than undo it.
		c.poke()
		return nil
	}
	c.apply(rows)
	c.rows, c.hasRows, c.dbLoaded = rows, true, true
	return nil
}

// apply merges a reload into the copy (see AuthzCache). c.mu must be held.
func (c *AuthzCache) apply(rows authzRows) {
	now := c.cfg.Now()
	services := make(map[string]authzService, len(rows.services))
	grants := make(map[string]map[string]authzGrant, len(c.grants))
	present := make(map[string]struct{}, len(rows.services)+len(rows.grants))
	unsealed := map[string]authzDoubt{}
	missing := map[string]authzDoubt{}
	doubt := func(m map[string]authzDoubt, old map[string]authzDoubt, key string, d authzDoubt, msg string) {
		if prev, ok := old[key]; ok && prev.reason == d.reason {
			d.since = prev.since
		} else {
			c.log.Error(msg, "service", d.service, "caller", d.caller, "reason", d.reason)
		}
		m[key] = d
	}
	for i, row := range rows.services {
		key := serviceKey(row.Name)
		present[key] = struct{}{}
		old, known := c.services[row.Name]
		if err := rows.serviceErrs[i]; err != nil {
			services[row.Name] = authzService{owner: old.owner, verified: known && old.verified}
			doubt(unsealed, c.unsealed, key, authzDoubt{service: row.Name, reason: err.Error(), since: now},
				"a service row is not believed as it stands: its seal does not verify, so muster did not write it so")
			continue
		}
		services[row.Name] = authzService{owner: row.Owner, verified: true}
	}
	lost := 0
	for name, old := range c.services {
		if _, ok := services[name]; ok {
			continue
		}
		services[name] = old
		key := serviceKey(name)
		if _, was := c.present[key]; was {
			lost++
		}
		doubt(missing, c.missing, key, authzDoubt{service: name, reason: "its row is gone; only a sealed tombstone revokes", since: now},
			"a service's row is gone; the copy keeps it")
	}
	set := func(service, caller string, g authzGrant) {
		if grants[service] == nil {
			grants[service] = map[string]authzGrant{}
		}
		grants[service][caller] = g
	}
	for i, row := range rows.grants {
		key := grantKey(row.Service, row.Caller)
		present[key] = struct{}{}
		old, known := c.grants[row.Service][row.Caller]
		err := rows.grantErrs[i]
		cand := authzGrant{active: row.RevokedAt == nil, version: row.Version}
		if err == nil && known && old.version > cand.version {
			err = fmt.Errorf("its version %d is older than the version %d the copy applied (an old row put back)", cand.version, old.version)
		}
		if err != nil {
			if known {
				set(row.Service, row.Caller, old)
			}
			doubt(unsealed, c.unsealed, key, authzDoubt{service: row.Service, caller: row.Caller, reason: err.Error(), since: now},
				"a grant row is not believed as it stands: its seal does not verify, so muster did not write it so")
			continue
		}
		set(row.Service, row.Caller, cand)
	}
	for service, callers := range c.grants {
		for caller, old := range callers {
			if _, ok := grants[service][caller]; ok {
				continue
			}
			set(service, caller, old)
			if !old.active {
				continue
			}
			key := grantKey(service, caller)
			if _, was := c.present[key]; was {
				lost++
			}
			doubt(missing, c.missing, key, authzDoubt{service: service, caller: caller, reason: "its row is gone; only a sealed tombstone revokes", since: now},
				"a grant's row is gone; the copy keeps it")
		}
	}
	c.unsealed, c.missing = unsealed, missing

	// Disbelief: a reload that lost more than the share of what the last
	// applied one read is held, unless an admin confirmed since.
	if c.loaded && lost > 0 && float64(lost) > c.cfg.HoldShare*float64(len(c.present)) {
		if c.held == nil {
			c.held = &authzHold{since: now}
			c.log.Error("a reload of services and grants lost more than the disbelief share of its rows; the copy keeps its previous state until they come back or an admin confirms",
				"lost", lost, "of", len(c.present), "share", c.cfg.HoldShare)
		}
		c.held.lost, c.held.of = lost, len(c.present)
		if rows.confirmedAt.IsZero() || rows.confirmedAt.Before(c.held.since) {
			// Held: only sealed revocations apply.
			for service, callers := range grants {
				for caller, g := range callers {
					if old, ok := c.grants[service][caller]; ok && old.active && !g.active {
						c.grants[service][caller] = g
						c.revoke()
					}
				}
			}
			return
		}
		c.log.Warn("a held reload of services and grants was confirmed by an admin; applied (the missing rows are still kept)",
			"confirmed_by", rows.confirmation, "lost", lost)
		c.held = nil
	} else if c.held != nil {
		c.log.Info("services and grants recovered; the held reload is released", "lost", lost)
		c.held = nil
	}
	if c.loaded && withdrawn(c.grants, grants) {
		c.revoke()
	}
	c.services, c.grants, c.present = services, grants, present
	c.loaded, c.loadedAt = true, now
}

// withdrawn reports whether the new copy revokes a grant the old one held.
func withdrawn(old, cur map[string]map[string]authzGrant) bool {
	for service, callers := range old {
		for caller, g := range callers {
			if g.active && !cur[service][caller].active {
				return true
			}
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
// way that takes authority away (a sealed revocation), by a reload or a
// write through this process. Watch streams and xDS wait on it to ask
// MayResolve again; additions, rows written outside muster and rows gone
// never close it.
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

// putService applies a committed service write; verified says whether
// its seal verifies (it does whenever this process seals).
func (c *AuthzCache) putService(name, owner string, verified bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.services[name]
	if verified {
		c.services[name] = authzService{owner: owner, verified: true}
		delete(c.unsealed, serviceKey(name))
	} else {
		c.services[name] = authzService{owner: old.owner, verified: old.verified}
	}
	delete(c.missing, serviceKey(name))
	c.present[serviceKey(name)] = struct{}{}
	c.gen++
}

// putGrants applies the grant rows a committed grants write sealed.
func (c *AuthzCache) putGrants(rows []db.ServiceGrant) {
	c.mu.Lock()
	defer c.mu.Unlock()
	lost := false
	for _, row := range rows {
		if c.grants[row.Service] == nil {
			c.grants[row.Service] = map[string]authzGrant{}
		}
		active := row.RevokedAt == nil
		if !active && c.grants[row.Service][row.Caller].active {
			lost = true
		}
		c.grants[row.Service][row.Caller] = authzGrant{active: active, version: row.Version}
		key := grantKey(row.Service, row.Caller)
		c.present[key] = struct{}{}
		delete(c.unsealed, key)
		delete(c.missing, key)
	}
	if lost {
		c.revoke()
	}
	c.gen++
}

// version is the version of the grant of service to caller the copy
// holds (0: none), the floor of the next write's.
func (c *AuthzCache) version(service, caller string) int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.grants[service][caller].version
}

// callers lists the callers the copy holds granted to service.
func (c *AuthzCache) callers(service string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []string
	for caller, g := range c.grants[service] {
		if g.active {
			out = append(out, caller)
		}
	}
	slices.Sort(out)
	return out
}

// verifiedOwner is the owner of name as the copy last verified it.
func (c *AuthzCache) verifiedOwner(name string) (string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	s, ok := c.services[name]
	if !ok || !s.verified {
		return "", false
	}
	return s.owner, true
}

// Owner returns the owning team of the service name as the copy last
// verified it, without a database round trip (internal/notify routes a
// service's alarms to it); false for a service the copy does not hold or
// could not verify.
func (c *AuthzCache) Owner(name string) (string, bool) { return c.verifiedOwner(name) }

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
		return c.grants[service][caller].active, nil
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

// ServiceCount is how many services the copy knows (ErrNotLoaded before
// the first load).
func (c *AuthzCache) ServiceCount() (int, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.loaded {
		return 0, ErrNotLoaded
	}
	return len(c.services), nil
}

// Age is how long ago the copy was last loaded in full from PostgreSQL;
// ok is false before the first load. A held reload does not count.
func (c *AuthzCache) Age() (age time.Duration, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.loaded {
		return 0, false
	}
	return c.cfg.Now().Sub(c.loadedAt), true
}

// Alarms lists the copy's open alarms: grant_unsealed and
// service_unsealed per row not believed, authz_row_missing per row kept
// although gone, and authz_reload_held while a reload is held.
func (c *AuthzCache) Alarms() []assembler.Alarm {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []assembler.Alarm
	describe := func(d authzDoubt) string {
		if d.caller == "" {
			return "service " + d.service
		}
		return fmt.Sprintf("the grant of %s to %s", d.service, d.caller)
	}
	for _, d := range c.unsealed {
		if d.caller == "" {
			out = append(out, assembler.Alarm{Kind: AlarmServiceUnsealed, Service: d.service, Since: d.since,
				Detail: fmt.Sprintf("%s is not muster's as it stands (%s), so its owner stays %s; the services table was written outside muster",
					describe(d), d.reason, ownerWords(c.services[d.service]))})
			continue
		}
		held := "so it shows " + d.service + " to nobody"
		if c.grants[d.service][d.caller].active {
			held = "so the grant muster sealed stands"
		}
		out = append(out, assembler.Alarm{Kind: AlarmGrantUnsealed, Service: d.service, Since: d.since,
			Detail: fmt.Sprintf("%s is not muster's as it stands (%s), %s; the service_grants table was written outside muster", describe(d), d.reason, held)})
	}
	for _, d := range c.missing {
		out = append(out, assembler.Alarm{Kind: AlarmAuthzRowMissing, Service: d.service, Since: d.since,
			Detail: fmt.Sprintf("%s has no row any more; only a sealed revocation (PUT /v1/services/%s/grants) takes it away, so it stands", describe(d), d.service)})
	}
	if h := c.held; h != nil {
		out = append(out, assembler.Alarm{Kind: AlarmAuthzReloadHeld, Since: h.since,
			Detail: fmt.Sprintf("a reload of services and grants found %d of the %d rows it held gone (more than %.0f%%); the copy keeps its previous state until they come back or an admin confirms (POST /v1/authz/reload-confirmations)",
				h.lost, h.of, c.cfg.HoldShare*100)})
	}
	slices.SortFunc(out, func(a, b assembler.Alarm) int {
		return strings.Compare(a.Kind+"\x00"+a.Service+"\x00"+a.Detail, b.Kind+"\x00"+b.Service+"\x00"+b.Detail)
	})
	return out
}

func ownerWords(s authzService) string {
	if s.verified {
		return "team " + s.owner
	}
	return "none (only admins may change it) until muster writes it again"
}

// RunOnce reloads the copy now, as the worker's ticker would. Tests call
// it to load the copy without starting the worker.
func (c *AuthzCache) RunOnce(ctx context.Context) error { return c.runOnce(ctx) }
