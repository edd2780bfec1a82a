package registry

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

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/worker"
)

// Reaper defaults (see package doc, "Lease expiry").
const (
	DefaultRegionExpiryThreshold  = 0.15
	DefaultZoneExpiryThreshold    = 0.5
	DefaultServiceExpiryThreshold = 0.5
	DefaultMinMassExpiry          = 3
)

// GateLeaseExpiry names the lease reaper's disbelief gate.
const GateLeaseExpiry = "lease-expiry"

// ExpiryEvidence is what health evidence says of lapsed leases (the
// evaluator's LeaseExpiryEvidence).
type ExpiryEvidence struct {
	// Corroborated are the instances evidence muster hears confirms are
	// gone, with why: their expiry is never held.
	Corroborated map[uuid.UUID]string
	// Partitioned are the instances a prober in outage covers: their
	// silence is the prober's, and their expiry is held in the prober's
	// scope whatever its size, until the prober is heard again or an
	// operator confirms.
	Partitioned map[uuid.UUID]Partition
	// Unheard names the zones none of whose instances is heard while
	// another zone is, with why: a zone hold there says it is a
	// partition.
	Unheard map[string]string
}

// Partition is why an instance's silence is muster's deafness.
type Partition struct {
	Prober string
	Why    string
}

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
	// RegionThreshold, ZoneThreshold and ServiceThreshold are the
	// disbelief thresholds (disbelief.Rule): if more than this fraction of
	// the region's (one zone's, one service's) leases lapsed or expired
	// within one TTL, uncorroborated expiry in that scope is held. 0.15,
	// 0.5 and 0.5 by default. A zone is checked first: a zone cut off
	// from muster is held as the zone, with one alarm naming it.
	RegionThreshold, ZoneThreshold, ServiceThreshold float64
	// MinMassExpiry: a scope is held only when at least this many of its
	// leases lapsed or expired within the TTL; one or two instances
	// stopping are not a mass event, whatever fraction of a small estate
	// they are (the fraction guard and the last_instance alarm remain the
	// backstop there). 3 by default.
	MinMassExpiry int
	// Evidence says which of the lapsed instances health evidence muster
	// hears confirms are gone, and which are cut off from muster (the
	// evaluator's LeaseExpiryEvidence); it is asked once per sweep. Nil:
	// nothing is corroborated or partitioned.
	Evidence func(ids []uuid.UUID) ExpiryEvidence
	// UpSince, when set, says since when the database has been reachable
	// without interruption (db.Monitor). A lease's clock only runs while
	// a renewal could have landed.
	UpSince func() time.Time
	// Fence says whether this replica owns a service's lease expiry
	// (internal/ownership): a lapsed lease is expired, held or counted as
	// held only by its service's owner, so two replicas never decide one
	// lease on different evidence. A service no replica owns (a shard
	// moving) is expired by no one meanwhile. The expiry and its audit
	// row are written under the tenure the sweep decided under, so an
	// owner deposed since (a pause longer than its local deadline)
	// writes nothing; the drop is counted (writer "lease-expiry"). Nil:
	// this replica expires every lease (it is alone).
	Fence *fence.Fence
	// Ready, when set, says whether the replica takes traffic (it is
	// ready once its evaluation state is rebuilt): while it is not, load
	// balancers send it no renewals, so a lease's clock does not run
	// either, and the grace after a start counts from readiness, not
	// from when HTTP began to listen.
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
	if c.ZoneThreshold == 0 {
		c.ZoneThreshold = DefaultZoneExpiryThreshold
	}
	for _, f := range []float64{c.RegionThreshold, c.ZoneThreshold, c.ServiceThreshold} {
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
	holds    []disbelief.Hold
	held     int
}

// NewReaper returns a stopped Reaper.
func NewReaper(cfg ReaperConfig) (*Reaper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rp := &Reaper{cfg: cfg, log: cfg.Logger.With("worker", "lease-reaper")}
	if cfg.Registerer != nil {
		gauge := func(name, help string, f func() float64) prometheus.Collector {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
		}
		for _, c := range []prometheus.Collector{
			gauge("muster_lease_grace", "1 while lease expiry waits out the grace after a restart or a database outage (renewals could not land).",
				func() float64 { return b2f(rp.InGrace()) }),
			gauge("muster_leases_held", "Uncorroborated lease expiries held by a disbelief threshold.",
				func() float64 { rp.mu.Lock(); defer rp.mu.Unlock(); return float64(rp.held) }),
			gauge("muster_lease_expiry_suppressions", "Scopes (the region, a zone, a prober or a service) whose lease expiry is held.",
				func() float64 { return float64(len(rp.Holds())) }),
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

// Holds returns the scopes whose lease expiry a disbelief threshold or a
// partition holds (disbelief.Hold, gate lease-expiry).
func (rp *Reaper) Holds() []disbelief.Hold {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return slices.Clone(rp.holds)
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
	// tenure is the service's, as this replica held it when the sweep
	// decided: the expiry is written under it or not at all.
	tenure fence.Token
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

	// Renewals a rate limit refused on this replica count as renewals
	// made when refused: a renewal refused for load never
	// expires a lease. A failure expires nothing this sweep (they are
	// kept and retried) without restarting the grace.
	if _, err := reg.FlushRefusedRenewals(ctx); err != nil {
		return 0, fmt.Errorf("apply refused renewals: %w", err)
	}
	// Leases are judged on the clock they were written by (the
	// database's): a replica whose own clock is behind or ahead expires
	// nothing early or late. Its own clock only counts the grace below,
	// a span it measures itself.
	leaseNow, err := reg.leaseNow(ctx, q)
	var lapsed []db.LeaseListLapsedRow
	if err == nil {
		lapsed, err = q.LeaseListLapsed(ctx, db.LeaseListLapsedParams{Now: leaseNow, Lim: int32(rp.cfg.Batch)})
	}
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
			rp.setHolds(nil, 0)
		}
		return 0, nil
	}

	live, err := q.LeaseCountLive(ctx)
	if err != nil {
		return 0, fmt.Errorf("count live leases: %w", err)
	}
	recent, err := q.LeaseCountExpiredSince(ctx, leaseNow.Add(-ttl))
	if err != nil {
		return 0, fmt.Errorf("count expired leases: %w", err)
	}
	oldest := lapsed[0].LeaseExpiresAt
	confs, err := q.LeaseExpiryConfirmationsSince(ctx, oldest.Add(-time.Microsecond))
	if err != nil {
		return 0, fmt.Errorf("read expiry confirmations: %w", err)
	}
	// The newest confirmation per scope that muster wrote (newest first);
	// one written by hand releases nothing and hides nothing behind it.
	confirmed := map[string]time.Time{}
	for _, c := range confs {
		if _, ok := confirmed[c.Scope]; !ok && reg.believeLeaseConfirmation(c) {
			confirmed[c.Scope] = c.ConfirmedAt
		}
	}

	// The disbelief rule (disbelief.Counter) in the region, each zone and
	// each service: lapsed now or expired within one TTL, against the
	// leases there were.
	c := disbelief.NewCounter(map[disbelief.Kind]disbelief.Rule{
		disbelief.Region:  {Fraction: rp.cfg.RegionThreshold, MinMass: rp.cfg.MinMassExpiry},
		disbelief.Zone:    {Fraction: rp.cfg.ZoneThreshold, MinMass: rp.cfg.MinMassExpiry},
		disbelief.Service: {Fraction: rp.cfg.ServiceThreshold, MinMass: rp.cfg.MinMassExpiry},
	})
	region := disbelief.Scope{Kind: disbelief.Region}
	scopesOf := func(service, zone string) [3]disbelief.Scope {
		return [3]disbelief.Scope{{Kind: disbelief.Zone, Name: zone}, region, {Kind: disbelief.Service, Name: service}}
	}
	for _, l := range live {
		for _, sc := range scopesOf(l.Service, l.Zone) {
			c.Had(sc, int(l.Live))
		}
	}
	for _, r := range recent {
		for _, sc := range scopesOf(r.Service, r.Zone) {
			c.Had(sc, int(r.Expired))
			c.Lacking(sc, int(r.Expired))
		}
	}
	for _, l := range lapsed {
		for _, sc := range scopesOf(l.Service, l.Zone) {
			c.Lacking(sc, 1)
		}
	}

	var ev ExpiryEvidence
	if rp.cfg.Evidence != nil {
		ids := make([]uuid.UUID, len(lapsed))
		for i, l := range lapsed {
			ids[i] = l.ID
		}
		ev = rp.cfg.Evidence(ids)
	}
	var expire []lapsedLease
	heldIn := map[disbelief.Scope][]uuid.UUID{}
	services := map[disbelief.Scope]map[string]bool{}
	partitions := map[disbelief.Scope]string{}
	held := 0
	hold := func(sc disbelief.Scope, l db.LeaseListLapsedRow) {
		heldIn[sc] = append(heldIn[sc], l.ID)
		if services[sc] == nil {
			services[sc] = map[string]bool{}
		}
		services[sc][l.Service] = true
		held++
	}
	for _, l := range lapsed {
		tenure, owns := rp.cfg.Fence.Claim(l.Service)
		if !owns {
			continue // its owner decides
		}
		ll := lapsedLease{LeaseListLapsedRow: l, tenure: tenure}
		if why, ok := ev.Corroborated[l.ID]; ok {
			ll.corroboration = why
			expire = append(expire, ll)
			continue
		}
		exp := *l.LeaseExpiresAt
		if leaseNow.Sub(exp) < rp.cfg.ExpiryDelay {
			continue // settling: leases that stopped together lapse together
		}
		// A confirmation covers leases lapsed by the moment it was made;
		// the region's covers every scope.
		released := func(sc disbelief.Scope) bool {
			for _, k := range []string{confirmationKey(sc), ""} {
				if t, ok := confirmed[k]; ok && (disbelief.Confirmation{At: t}).Covers(nil, exp) {
					return true
				}
			}
			return false
		}
		scopes := scopesOf(l.Service, l.Zone)
		var by *disbelief.Scope
		for i := range scopes {
			if c.Over(scopes[i]) && !released(scopes[i]) {
				by = &scopes[i]
				break
			}
		}
		if by == nil {
			if p, ok := ev.Partitioned[l.ID]; ok {
				sc := disbelief.Scope{Kind: disbelief.Prober, Name: p.Prober}
				if !released(sc) {
					partitions[sc] = p.Why
					by = &sc
				}
			}
		}
		if by != nil {
			hold(*by, l)
			continue
		}
		if slices.ContainsFunc(scopes[:], c.Over) || ev.Partitioned[l.ID].Prober != "" {
			ll.corroboration = "released by an operator's confirmation"
		}
		expire = append(expire, ll)
	}

	holds := make([]disbelief.Hold, 0, len(heldIn))
	for sc, ids := range heldIn {
		had, lacking := c.Count(sc)
		h := disbelief.Hold{Gate: GateLeaseExpiry, Scope: sc, Had: had, Lacking: lacking,
			Services: slices.Sorted(maps.Keys(services[sc]))}
		if r, ok := c.Rule(sc); ok && sc.Kind != disbelief.Prober {
			h.Threshold = r.Fraction
		}
		h.Partition = partitions[sc]
		if sc.Kind == disbelief.Zone {
			h.Partition = ev.Unheard[sc.Name]
		}
		h.Name(ids)
		holds = append(holds, h)
	}
	rp.setHolds(holds, held)

	n, deposed := 0, 0
	for _, l := range expire {
		ok, err := reg.expireLease(ctx, rp.cfg.Fence, l, now, leaseNow)
		if fence.IsNotOwner(err) {
			// Deposed since the sweep decided: the new owner decides
			// this lease on its own evidence.
			deposed++
			continue
		}
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
	if deposed > 0 {
		rp.cfg.Fence.Dropped("lease-expiry", deposed)
		rp.log.Info("lease expiries dropped: this replica no longer owns their services", "count", deposed)
	}
	return n, nil
}

// confirmationKey is how a scope is stored in lease_expiry_confirmations:
// "" for the region, a service's name, "zone:<zone>", "prober:<name>".
func confirmationKey(sc disbelief.Scope) string {
	switch sc.Kind {
	case disbelief.Region:
		return ""
	case disbelief.Service:
		return sc.Name
	}
	return string(sc.Kind) + ":" + sc.Name
}

// setHolds replaces the holds, keeping the Since of those still held and
// logging the ones that begin or end.
func (rp *Reaper) setHolds(next []disbelief.Hold, held int) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	now := rp.cfg.Registry.now()
	prev := map[disbelief.Scope]time.Time{}
	for _, h := range rp.holds {
		prev[h.Scope] = h.Since
	}
	still := map[disbelief.Scope]bool{}
	for i := range next {
		h := &next[i]
		h.Since = disbelief.Since(prev, h.Scope, now)
		h.Describe("leases")
		still[h.Scope] = true
		if _, was := prev[h.Scope]; !was {
			rp.log.Warn("lease expiry held", "scope", h.Scope.String(), "detail", h.Detail)
		}
	}
	for sc := range prev {
		if !still[sc] {
			rp.log.Info("lease expiry resumed", "scope", sc.String())
		}
	}
	slices.SortFunc(next, func(a, b disbelief.Hold) int { return strings.Compare(a.Scope.String(), b.Scope.String()) })
	rp.holds, rp.held = next, held
}

// expireLease ends one lapsed lease and audits it, unless it was renewed or
// ended meanwhile (false), or the tenure it was decided under has ended
// (an error fence.IsNotOwner recognises: nothing written). leaseNow is
// the lease clock's reading the sweep judged by: a lease renewed since
// runs past it and is left alone; now is this replica's, for the audit
// row.
func (r *Registry) expireLease(ctx context.Context, f *fence.Fence, l lapsedLease, now, leaseNow time.Time) (bool, error) {
	ended := false
	err := r.withTx(ctx, func(q *db.Queries) error {
		if err := f.Check(ctx, q, l.tenure); err != nil {
			return fmt.Errorf("expire %s: %w", l.ID, err)
		}
		row, err := q.LeaseExpire(ctx, db.LeaseExpireParams{ID: l.ID, Now: leaseNow, Cutoff: leaseNow})
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
	ID    int64           `json:"id"`
	Gate  string          `json:"gate"`
	Scope disbelief.Scope `json:"scope"`
	// Service is the scope's service, when it is one (kept for clients of
	// POST /v1/leases/expiry-confirmations).
	Service     string    `json:"service,omitempty"`
	ConfirmedAt time.Time `json:"confirmed_at"`
	ConfirmedBy string    `json:"confirmed_by"`
	Reason      string    `json:"reason"`
	// Released counts the leases in the scope that had lapsed when the
	// confirmation was made (for a prober, in the region): the reaper may
	// now expire them.
	Released int `json:"released"`
}

// ConfirmLeaseExpiry records that the leases lapsed by now in a scope
// really ran out, releasing the expiries a disbelief threshold or a
// partition holds there. The region, a zone and a prober need an admin; a
// service its team's operators or an admin. A reason is required. Every
// attempt is audited.
func (r *Registry) ConfirmLeaseExpiry(ctx context.Context, actor identity.Principal, scope disbelief.Scope, reason string) (Confirmation, error) {
	const action = "lease.expiry.confirm"
	target, kind := scope.Name, string(scope.Kind)
	if scope.Kind == disbelief.Region {
		target = "region:" + r.cfg.Region
	}
	asked := map[string]string{"scope": scope.String(), "reason": reason}
	var out Confirmation
	err := r.write(ctx, actor, action, kind, target, asked, func(q *db.Queries) (*refusal.Error, error) {
		if err := scope.Validate(); err != nil {
			return invalid("the scope is not valid", []FieldError{{Field: "scope", Message: err.Error()}}), nil
		}
		switch scope.Kind {
		case disbelief.Service:
			row, err := q.ServiceGet(ctx, scope.Name)
			if notFound(err) {
				return newRefusal(ErrNotFound, "no service named %s", scope.Name), nil
			}
			if err != nil {
				return nil, fmt.Errorf("read service %s: %w", scope.Name, err)
			}
			if owner := r.ownerOf(row); !CanManage(actor, owner) {
				return newRefusal(ErrForbidden, "confirming lease expiry of %s needs the %s team's operator role or admin; %s has neither", scope.Name, owner, actor), nil
			}
		case disbelief.Region, disbelief.Zone, disbelief.Prober:
			if !actor.IsAdmin() {
				return newRefusal(ErrForbidden, "confirming lease expiry in %s spans teams and needs an admin; %s is not one", scope, actor), nil
			}
		default:
			return invalid("the scope is not one lease expiry holds", []FieldError{{Field: "scope", Message: "region, zone, prober or service"}}), nil
		}
		reason = strings.TrimSpace(reason)
		if reason == "" {
			return invalid("a confirmation needs a reason", []FieldError{{Field: "reason", Message: "say why these leases are known to be gone"}}), nil
		}
		if len(reason) > 1000 {
			return invalid("the reason is too long", []FieldError{{Field: "reason", Message: "at most 1000 characters"}}), nil
		}
		now := r.now()
		// A confirmation covers the leases lapsed by the moment it was
		// made, on the clock leases are judged by.
		confirmedAt, err := r.leaseNow(ctx, q)
		if err != nil {
			return nil, err
		}
		var service, zone string
		switch scope.Kind {
		case disbelief.Service:
			service = scope.Name
		case disbelief.Zone:
			zone = scope.Name
		}
		n, err := q.LeaseCountLapsed(ctx, db.LeaseCountLapsedParams{Now: confirmedAt, Service: service, Zone: zone})
		if err != nil {
			return nil, fmt.Errorf("count lapsed leases: %w", err)
		}
		confirmedAt = confirmedAt.UTC().Truncate(time.Microsecond) // as stored, so the seal verifies when read
		sig, kid, err := r.sealConfirmation(ctx, leaseConfirmationDomain, leaseConfirmationSealOf(confirmationKey(scope), confirmedAt, actor.String(), reason))
		if err != nil {
			return nil, err
		}
		row, err := q.LeaseExpiryConfirmationInsert(ctx, db.LeaseExpiryConfirmationInsertParams{
			Scope: confirmationKey(scope), ConfirmedAt: confirmedAt, ConfirmedBy: actor.String(), Reason: reason, Seal: sig, SealKey: kid,
		})
		if err != nil {
			return nil, fmt.Errorf("record confirmation: %w", err)
		}
		out = Confirmation{ID: row.ID, Gate: GateLeaseExpiry, Scope: scope, Service: service, ConfirmedAt: row.ConfirmedAt,
			ConfirmedBy: row.ConfirmedBy, Reason: row.Reason, Released: int(n)}
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
