package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/worker"
)

// Reaper defaults (see package doc, "Lease expiry").
const (
	DefaultRegionExpiryThreshold  = 0.15
	DefaultServiceExpiryThreshold = 0.5
	DefaultMinMassExpiry          = 3
)

// ReaperConfig configures a Reaper.
type ReaperConfig struct {
	Registry *Registry
	// Interval between sweeps; 1 s by default.
	Interval time.Duration
	// Batch bounds the lapsed leases one sweep reads: 100,000.
	Batch int
	// ExpiryDelay is how long a lease must have lapsed before an
	// uncorroborated expiry goes ahead: LeaseTTL/3 by default (at least
	// one renewal period of a client renewing three times a lease), so
	// leases that stop renewing together are counted together by the
	// disbelief threshold before the first of them is ended.
	ExpiryDelay time.Duration
	// RegionThreshold and ServiceThreshold are the disbelief thresholds:
	// if more than this fraction of the region's (or one service's) leases
	// lapsed or expired within one TTL, uncorroborated expiry in that
	// scope is held. 0.15 and 0.5 by default.
	RegionThreshold, ServiceThreshold float64
	// MinMassExpiry: a scope is held only when at least this many of its
	// leases lapsed or expired within the TTL; one or two instances
	// stopping are not a mass event, whatever fraction of a small estate
	// they are (the fraction guard and the last_instance alarm remain the
	// backstop there). 3 by default.
	MinMassExpiry int
	// Corroborated says which of the lapsed instances health evidence
	// gathered while muster could hear it confirms are gone (the
	// evaluator), and why; it is asked once per sweep. Such an expiry is
	// never held. Nil: nothing is corroborated.
	Corroborated func(ids []uuid.UUID) map[uuid.UUID]string
	// UpSince, when set, says since when the database has been reachable
	// without interruption (db.Monitor). A lease's clock only runs while
	// a renewal could have landed.
	UpSince func() time.Time
	// Ready, when set, says whether the replica takes traffic (it is
	// ready once its evaluation state is rebuilt): while it is not, load
	// balancers send it no renewals, so a lease's clock does not run
	// either, and the grace after a start counts from readiness, not
	// from when HTTP began to listen (issue 26).
	Ready  func() bool
	Logger *slog.Logger
	// Registerer receives the reaper's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
}

// Validate checks the configuration and fills defaults.
func (c *ReaperConfig) Validate() error {
	if c.Registry == nil {
		return errors.New("reaper: Registry is required")
	}
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.Batch == 0 {
		c.Batch = 100_000
	}
	if c.ExpiryDelay == 0 {
		c.ExpiryDelay = c.Registry.cfg.LeaseTTL / 3
	}
	if c.RegionThreshold == 0 {
		c.RegionThreshold = DefaultRegionExpiryThreshold
	}
	if c.ServiceThreshold == 0 {
		c.ServiceThreshold = DefaultServiceExpiryThreshold
	}
	for _, f := range []float64{c.RegionThreshold, c.ServiceThreshold} {
		if !(f > 0 && f <= 1) {
			return fmt.Errorf("reaper: expiry threshold %g is outside (0,1]", f)
		}
	}
	if c.ExpiryDelay < 0 || c.ExpiryDelay >= c.Registry.cfg.LeaseTTL*2 {
		return fmt.Errorf("reaper: ExpiryDelay %s must be between 0 and twice the lease TTL", c.ExpiryDelay)
	}
	if c.MinMassExpiry == 0 {
		c.MinMassExpiry = DefaultMinMassExpiry
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Suppression is an open lease_expiry_suppressed alarm: a disbelief
// threshold holding the expiry of leases in one scope.
type Suppression struct {
	// Service is the scope; empty for the whole region.
	Service string    `json:"service,omitempty"`
	Since   time.Time `json:"since"`
	// Lapsed counts the scope's leases that lapsed (not renewed) or were
	// expired within the last TTL; Leases is the scope's leases (live plus
	// those expired within the TTL).
	Lapsed    int     `json:"lapsed"`
	Leases    int     `json:"leases"`
	Threshold float64 `json:"threshold"`
	// Held counts the uncorroborated expiries the threshold is holding.
	Held   int    `json:"held"`
	Detail string `json:"detail"`
}

// Reaper is the worker that expires leases.
type Reaper struct {
	cfg    ReaperConfig
	log    *slog.Logger
	runner worker.Runner

	mu      sync.Mutex
	hearing time.Time // renewals could land since then
	// wasReady: Config.Ready said ready at the last sweep.
	wasReady bool
	failing  bool // the last sweep could not reach the database
	grace    bool
	sup      map[string]Suppression
	held     int
}

// NewReaper returns a stopped Reaper.
func NewReaper(cfg ReaperConfig) (*Reaper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rp := &Reaper{cfg: cfg, log: cfg.Logger.With("worker", "lease-reaper"), sup: map[string]Suppression{}}
	if cfg.Registerer != nil {
		gauge := func(name, help string, f func() float64) prometheus.Collector {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
		}
		for _, c := range []prometheus.Collector{
			gauge("muster_lease_grace", "1 while lease expiry waits out the grace after a restart or a database outage (renewals could not land).",
				func() float64 { return b2f(rp.InGrace()) }),
			gauge("muster_leases_held", "Uncorroborated lease expiries held by a disbelief threshold.",
				func() float64 { rp.mu.Lock(); defer rp.mu.Unlock(); return float64(rp.held) }),
			gauge("muster_lease_expiry_suppressions", "Scopes (the region or a service) whose lease expiry is suppressed.",
				func() float64 { return float64(len(rp.Suppressions())) }),
		} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("reaper: register metrics: %w", err)
			}
		}
	}
	return rp, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Start runs the sweep loop until ctx ends or Stop is called. Renewals can
// land from now on, so every lease gets one full TTL from now.
func (rp *Reaper) Start(ctx context.Context) error {
	rp.HearingFrom(rp.cfg.Registry.now())
	return rp.runner.Start(ctx, rp.loop)
}

// Stop ends the loop and waits for it. Safe to call twice or before Start.
func (rp *Reaper) Stop() { rp.runner.Stop() }

// HearingFrom says renewals can land from t on (the API started serving):
// no lease expires before t + TTL.
func (rp *Reaper) HearingFrom(t time.Time) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if t.After(rp.hearing) {
		rp.hearing = t
	}
}

// InGrace reports whether the last sweep held every expiry because renewals
// have not been able to land for a full TTL yet.
func (rp *Reaper) InGrace() bool {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return rp.grace
}

// Suppressions returns the open lease_expiry_suppressed alarms, the region
// first, then by service.
func (rp *Reaper) Suppressions() []Suppression {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	out := make([]Suppression, 0, len(rp.sup))
	for _, s := range rp.sup {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Suppression) int { return strings.Compare(a.Service, b.Service) })
	return out
}

func (rp *Reaper) loop(ctx context.Context) {
	worker.Every(ctx, rp.cfg.Interval, func(ctx context.Context) {
		if _, err := rp.RunOnce(ctx); err != nil && ctx.Err() == nil {
			rp.log.Warn("expire leases", "err", err)
		}
	})
}

// sweepTimeout bounds one sweep's database work.
const sweepTimeout = 10 * time.Second

// lapsedLease is one lease that ran out and what the sweep decided.
type lapsedLease struct {
	db.LeaseListLapsedRow
	corroboration string
}

// RunOnce is one sweep: it expires the leases that may be expired now and
// refreshes the suppression alarms, and returns how many it expired. The
// loop calls it every Interval; tests call it to step.
func (rp *Reaper) RunOnce(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, sweepTimeout)
	defer cancel()
	reg := rp.cfg.Registry
	ttl := reg.cfg.LeaseTTL
	now := reg.now()
	q := db.New(reg.cfg.Pool)

	lapsed, err := q.LeaseListLapsed(ctx, db.LeaseListLapsedParams{Now: now, Lim: int32(rp.cfg.Batch)})
	if err != nil {
		rp.mu.Lock()
		rp.failing = true
		rp.mu.Unlock()
		return 0, fmt.Errorf("list lapsed leases: %w", err)
	}
	rp.mu.Lock()
	if rp.failing {
		// The database is back: renewals refused meanwhile get a full TTL
		// from now to land.
		rp.failing = false
		if now.After(rp.hearing) {
			rp.hearing = now
		}
	}
	if rp.cfg.Ready != nil {
		// Not ready, or ready since this sweep: renewals could not land
		// before now.
		ready := rp.cfg.Ready()
		if (!ready || !rp.wasReady) && now.After(rp.hearing) {
			rp.hearing = now
		}
		rp.wasReady = ready
	}
	hearing := rp.hearing
	rp.mu.Unlock()
	if rp.cfg.UpSince != nil {
		if up := rp.cfg.UpSince(); up.After(hearing) {
			hearing = up
		}
	}
	inGrace := now.Before(hearing.Add(ttl))
	rp.mu.Lock()
	rp.grace = inGrace
	rp.mu.Unlock()
	if inGrace || len(lapsed) == 0 {
		if len(lapsed) == 0 {
			rp.setSuppressions(nil, 0)
		}
		return 0, nil
	}

	live, err := q.LeaseCountLive(ctx)
	if err != nil {
		return 0, fmt.Errorf("count live leases: %w", err)
	}
	recent, err := q.LeaseCountExpiredSince(ctx, now.Add(-ttl))
	if err != nil {
		return 0, fmt.Errorf("count expired leases: %w", err)
	}
	oldest := lapsed[0].LeaseExpiresAt
	confs, err := q.LeaseExpiryConfirmationsSince(ctx, oldest.Add(-time.Microsecond))
	if err != nil {
		return 0, fmt.Errorf("read expiry confirmations: %w", err)
	}
	confirmed := map[string]time.Time{}
	for _, c := range confs {
		confirmed[c.Service] = c.ConfirmedAt
	}

	// The disbelief threshold per scope: lapsed now or expired within one
	// TTL, against the leases there were.
	type count struct{ lapsed, leases int }
	scopes := map[string]*count{"": {}}
	at := func(s string) *count {
		c := scopes[s]
		if c == nil {
			c = &count{}
			scopes[s] = c
		}
		return c
	}
	for _, l := range live {
		at(l.Service).leases += int(l.Live)
		scopes[""].leases += int(l.Live)
	}
	for _, r := range recent {
		for _, c := range []*count{at(r.Service), scopes[""]} {
			c.lapsed += int(r.Expired)
			c.leases += int(r.Expired)
		}
	}
	for _, l := range lapsed {
		at(l.Service).lapsed++
		scopes[""].lapsed++
	}
	over := func(service string) bool {
		c := scopes[service]
		thr := rp.cfg.ServiceThreshold
		if service == "" {
			thr = rp.cfg.RegionThreshold
		}
		return c.lapsed >= rp.cfg.MinMassExpiry && float64(c.lapsed)/float64(c.leases) > thr
	}

	var corroborated map[uuid.UUID]string
	if rp.cfg.Corroborated != nil {
		ids := make([]uuid.UUID, len(lapsed))
		for i, l := range lapsed {
			ids[i] = l.ID
		}
		corroborated = rp.cfg.Corroborated(ids)
	}
	var expire []lapsedLease
	heldBy := map[string]int{}
	held := 0
	for _, l := range lapsed {
		ll := lapsedLease{LeaseListLapsedRow: l}
		if why, ok := corroborated[l.ID]; ok {
			ll.corroboration = why
			expire = append(expire, ll)
			continue
		}
		exp := *l.LeaseExpiresAt
		if now.Sub(exp) < rp.cfg.ExpiryDelay {
			continue // settling: leases that stopped together lapse together
		}
		// A confirmation covers leases lapsed by the moment it was made;
		// the region's covers every service too.
		released := func(scope string) bool {
			for _, s := range []string{scope, ""} {
				if c, ok := confirmed[s]; ok && !c.Before(exp) {
					return true
				}
			}
			return false
		}
		switch {
		case over("") && !released(""):
			heldBy[""]++
			held++
		case over(l.Service) && !released(l.Service):
			heldBy[l.Service]++
			held++
		default:
			if over("") || over(l.Service) {
				ll.corroboration = "released by an operator's confirmation"
			}
			expire = append(expire, ll)
		}
	}

	sups := map[string]Suppression{}
	for scope, n := range heldBy {
		c := scopes[scope]
		thr, where := rp.cfg.RegionThreshold, "the region"
		if scope != "" {
			thr, where = rp.cfg.ServiceThreshold, "service "+scope
		}
		sups[scope] = Suppression{
			Service: scope, Lapsed: c.lapsed, Leases: c.leases, Threshold: thr, Held: n,
			Detail: fmt.Sprintf("%d of %d leases in %s lapsed or expired within %s (%.0f%%, above the %.0f%% disbelief threshold): expiry of %d uncorroborated leases is held until renewals recover or an operator confirms (POST /v1/leases/expiry-confirmations)",
				c.lapsed, c.leases, where, ttl, 100*float64(c.lapsed)/float64(c.leases), 100*thr, n),
		}
	}
	rp.setSuppressions(sups, held)

	n := 0
	for _, l := range expire {
		ok, err := reg.expireLease(ctx, l, now)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	if n > 0 {
		rp.log.Info("leases expired", "count", n)
	}
	return n, nil
}

// setSuppressions replaces the open alarms, keeping the Since of those
// still open and logging the ones that open or close.
func (rp *Reaper) setSuppressions(next map[string]Suppression, held int) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	now := rp.cfg.Registry.now()
	for scope, s := range next {
		if old, open := rp.sup[scope]; open {
			s.Since = old.Since
		} else {
			s.Since = now
			rp.log.Warn("lease expiry suppressed", "scope", scopeName(scope), "detail", s.Detail)
		}
		next[scope] = s
	}
	for scope := range rp.sup {
		if _, still := next[scope]; !still {
			rp.log.Info("lease expiry resumed", "scope", scopeName(scope))
		}
	}
	if next == nil {
		next = map[string]Suppression{}
	}
	rp.sup, rp.held = next, held
}

func scopeName(service string) string {
	if service == "" {
		return "region"
	}
	return service
}

// expireLease ends one lapsed lease and audits it, unless it was renewed or
// ended meanwhile (false).
func (r *Registry) expireLease(ctx context.Context, l lapsedLease, now time.Time) (bool, error) {
	ended := false
	err := r.withTx(ctx, func(q *db.Queries) error {
		row, err := q.LeaseExpire(ctx, db.LeaseExpireParams{ID: l.ID, Now: now, Cutoff: now})
		if notFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("expire %s: %w", l.ID, err)
		}
		if row, err = sealEnded(ctx, q, r.cfg.Sealer, row); err != nil {
			return err
		}
		before := instanceFromRow(row)
		before.State, before.EndedAt, before.UpdatedAt = StateActive, nil, before.CreatedAt
		reason := fmt.Sprintf("lease expired at %s without renewal", l.LeaseExpiresAt.Format(time.RFC3339Nano))
		if l.corroboration != "" {
			reason += "; " + l.corroboration
		}
		_, err = audit.Append(ctx, q, now, audit.Entry{
			ActorKind: "system", Actor: "system:lease-reaper", Action: "lease.expire",
			TargetKind: "instance", Target: l.ID.String(), Outcome: audit.Accepted,
			Reason: reason, Before: before, After: instanceFromRow(row),
		})
		ended = err == nil
		return err
	})
	if err != nil {
		return false, err
	}
	if ended {
		r.metrics.expired.Inc()
	}
	return ended, nil
}

// Confirmation is an operator's confirmation that held lease expiries are
// real (see Reaper).
type Confirmation struct {
	ID int64 `json:"id"`
	// Service is the scope; empty for the whole region.
	Service     string    `json:"service,omitempty"`
	ConfirmedAt time.Time `json:"confirmed_at"`
	ConfirmedBy string    `json:"confirmed_by"`
	Reason      string    `json:"reason"`
	// Released counts the leases in the scope that had lapsed when the
	// confirmation was made: the reaper may now expire them.
	Released int `json:"released"`
}

// ConfirmLeaseExpiry records that the leases lapsed by now in a scope
// (service, or "" for the region) really ran out, releasing the expiries a
// disbelief threshold holds there. The region needs an admin; a service its
// team's operators or an admin. A reason is required. Every attempt is
// audited.
func (r *Registry) ConfirmLeaseExpiry(ctx context.Context, actor identity.Principal, service, reason string) (Confirmation, error) {
	const action = "lease.expiry.confirm"
	target, kind := "region:"+r.cfg.Region, "region"
	if service != "" {
		target, kind = service, "service"
	}
	asked := map[string]string{"service": service, "reason": reason}
	var out Confirmation
	err := r.write(ctx, actor, action, kind, target, asked, func(q *db.Queries) (*refusal.Error, error) {
		if service == "" {
			if !actor.IsAdmin() {
				return newRefusal(ErrForbidden, "confirming lease expiry for the whole region needs an admin; %s is not one", actor), nil
			}
		} else {
			row, err := q.ServiceGet(ctx, service)
			if notFound(err) {
				return newRefusal(ErrNotFound, "no service named %s", service), nil
			}
			if err != nil {
				return nil, fmt.Errorf("read service %s: %w", service, err)
			}
			if owner := r.ownerOf(row); !CanManage(actor, owner) {
				return newRefusal(ErrForbidden, "confirming lease expiry of %s needs the %s team's operator role or admin; %s has neither", service, owner, actor), nil
			}
		}
		reason = strings.TrimSpace(reason)
		if reason == "" {
			return invalid("a confirmation needs a reason", []FieldError{{Field: "reason", Message: "say why these leases are known to be gone"}}), nil
		}
		if len(reason) > 1000 {
			return invalid("the reason is too long", []FieldError{{Field: "reason", Message: "at most 1000 characters"}}), nil
		}
		now := r.now()
		n, err := q.LeaseCountLapsed(ctx, db.LeaseCountLapsedParams{Now: now, Service: service})
		if err != nil {
			return nil, fmt.Errorf("count lapsed leases: %w", err)
		}
		row, err := q.LeaseExpiryConfirmationInsert(ctx, db.LeaseExpiryConfirmationInsertParams{
			Service: service, ConfirmedAt: now, ConfirmedBy: actor.String(), Reason: reason,
		})
		if err != nil {
			return nil, fmt.Errorf("record confirmation: %w", err)
		}
		out = Confirmation{ID: row.ID, Service: row.Service, ConfirmedAt: row.ConfirmedAt, ConfirmedBy: row.ConfirmedBy,
			Reason: row.Reason, Released: int(n)}
		_, err = audit.Append(ctx, q, now, audit.Entry{
			ActorKind: actorKind(actor), Actor: actor.String(), Action: action,
			TargetKind: kind, Target: target, Outcome: audit.Accepted, Reason: reason, After: out,
		})
		return nil, err
	})
	if err != nil {
		return Confirmation{}, err
	}
	return out, nil
}
