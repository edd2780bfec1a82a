package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/seal"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
)

// DefaultLeaseTTL is how long a registration lives without renewal (ADR-03).
const DefaultLeaseTTL = 30 * time.Second

// Config configures a Registry.
type Config struct {
	Pool *pgxpool.Pool
	// Region is the region this muster is the authority for (ADR-14).
	Region string
	// LeaseTTL defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Now defaults to time.Now; tests pass a fake clock.
	Now func() time.Time
	// LeaseClock is the clock lease times are taken from and judged by
	// (registration, renewals, the reaper, expiry confirmations). Nil:
	// PostgreSQL's (clock_timestamp()), which every replica shares, so
	// a lease lasts its TTL whichever replica took the renewal and
	// whichever judges it, however far their own clocks are apart. Tests
	// that move time set it to their clock.
	LeaseClock func() time.Time
	Logger     *slog.Logger
	// Registerer receives the registry's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Sealer, when set, seals every instance row the registry writes
	// (seal.go); SealKeys are further keys seals are trusted from. With
	// neither, VerifyIdentity and VerifyEnd pass every row.
	Sealer   seal.Signer
	SealKeys seal.Keys
	// Trust, when set, is what seals are verified against instead of
	// SealKeys and the Sealer's key: the replica's one Trust, shared with
	// policy and shifts, which a keyless replica's key watch seals when
	// the region's rows turn out sealed (seal.Trust).
	Trust *seal.Trust
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	if c.Pool == nil {
		return errors.New("registry: Pool is required")
	}
	if c.Region == "" {
		return errors.New("registry: Region is required")
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.LeaseTTL < time.Second {
		return fmt.Errorf("registry: LeaseTTL %s is below 1s", c.LeaseTTL)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Registry is the desired-state store and its rules.
type Registry struct {
	cfg   Config
	trust *seal.Trust // the seals trusted: Trust, or SealKeys and the Sealer's
	// contractSeals remembers the contract seals that verified, over the
	// last full read of the contracts (seal.go).
	contractSeals seal.Memo
	// serviceSeals and grantSeals remember the service and grant seals
	// that verified (authzseal.go), over the copy's last reload.
	serviceSeals, grantSeals seal.Memo
	metrics                  metrics
	// authz is the in-memory copy of services and grants, when one was
	// built on this registry: writes through this process update it at
	// once, so a caller sees its own grant at the next watch.
	authz atomic.Pointer[AuthzCache]
	// follower is the evaluator built on this registry (Follow).
	follower atomic.Pointer[followerRef]
	// replaceGate decides reconciliation's replacements (GateReplacements).
	replaceGate atomic.Pointer[gateRef]
	// refused keeps the renewals a rate limit refused until they are
	// flushed (renewal.go).
	refused refusedRenewals
	// confirmDoubts are the confirmations not believed (confirmseal.go).
	confirmDoubts confirmationDoubts
	// adoptedInstances and adoptedAuthz: this process has seen the
	// adoptions of the rows from before the seals through (beforeSealing).
	adoptedInstances, adoptedAuthz atomic.Bool
}

// Follower is told of what this registry's writes committed, after the
// commit and before the write returns, where its next poll would learn
// it too late: the evaluator follows its registry (it calls Follow from
// its constructor, as NewAuthzCache hands itself over), so the workload's
// first report, sent as soon as it has its id, finds its instance known,
// and a prober's first reports after its assignment are not
// refused as not assigned while the next refresh is due. Construction runs
// upstream first and nothing is bound afterwards.
type Follower interface {
	// InstancesRegistered is told of each registration: the instances it
	// replaced (state replaced), then the new one. It runs on the
	// registering request, with its context, and should return quickly.
	InstancesRegistered(ctx context.Context, ins []Instance)
	// ProberAssigned is told of each prober assignment.
	ProberAssigned(a ProberAssignments)
}

type followerRef struct{ f Follower }

// Follow makes f this registry's follower (the last one given wins).
func (r *Registry) Follow(f Follower) { r.follower.Store(&followerRef{f}) }

func (r *Registry) following() Follower {
	if ref := r.follower.Load(); ref != nil {
		return ref.f
	}
	return nil
}

type metrics struct {
	refusals      *prometheus.CounterVec
	registrations prometheus.Counter
	expired       prometheus.Counter
	// renewalsWithoutCredential: renewals of instances that have a
	// credential by a client that did not send it (RenewWithCredential).
	renewalsWithoutCredential prometheus.Counter
	// renewalsRefused: lease renewals (one per instance) a rate limit
	// refused (NoteRefusedRenewals); refusedRenewals what became of them.
	renewalsRefused prometheus.Counter
	refusedRenewals *prometheus.CounterVec
}

// New returns a Registry.
func New(cfg Config) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := metrics{
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_registry_refusals_total",
			Help: "Registry writes refused, by action and reason kind.",
		}, []string{"action", "kind"}),
		registrations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_instances_registered_total",
			Help: "Instances registered through the registration API.",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_leases_expired_total",
			Help: "Registered instances ended because their lease was not renewed.",
		}),
		renewalsWithoutCredential: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_lease_renewals_without_credential_total",
			Help: "Lease renewals accepted without the instance credential its registration returned (a client from before instance credentials).",
		}),
		renewalsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_lease_renewals_refused_total",
			Help: "Lease renewals (one per instance, a batch's each) refused by a rate limit; each is kept and applied later unless dropped (muster_lease_refused_renewals_total).",
		}),
		refusedRenewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_lease_refused_renewals_total",
			Help: "Lease renewals refused by a rate limit, by what became of them: renewed (applied later, as made when refused), refused (not allowed as a renewal: someone else's instance, a wrong credential, ended), expired (older than a lease TTL when flushed), dropped (not kept: too many held).",
		}, []string{"result"}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{m.refusals, m.registrations, m.expired, m.renewalsWithoutCredential, m.renewalsRefused, m.refusedRenewals} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("registry: register metrics: %w", err)
			}
		}
	}
	unsealedConfirmations := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "muster_confirmations_unsealed_total",
		Help: "Confirmation rows (of a lease expiry, a reconciliation source, a reload of services and grants) whose seal did not verify, each counted once: written outside muster, they release nothing.",
	}, []string{"table"})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(unsealedConfirmations); err != nil {
			return nil, fmt.Errorf("registry: register metrics: %w", err)
		}
	}
	trust := cfg.Trust
	if trust == nil {
		trust = seal.NewTrust(cfg.SealKeys.With(cfg.Sealer))
	}
	r := &Registry{cfg: cfg, trust: trust, metrics: m}
	r.confirmDoubts.counter = unsealedConfirmations
	return r, nil
}

// Region is the region this registry is the authority for.
func (r *Registry) Region() string { return r.cfg.Region }

func (r *Registry) now() time.Time { return r.cfg.Now().UTC().Truncate(time.Microsecond) }

// leaseAt is the moment a lease written now is counted from, for a
// statement that takes it (LeaseRenew, LeaseRenewMany): LeaseClock's
// reading, or nil for PostgreSQL's clock_timestamp() in the statement.
func (r *Registry) leaseAt() *time.Time {
	if r.cfg.LeaseClock == nil {
		return nil
	}
	t := r.cfg.LeaseClock().UTC().Truncate(time.Microsecond)
	return &t
}

// leaseNow reads the lease clock with q: LeaseClock, or PostgreSQL's.
func (r *Registry) leaseNow(ctx context.Context, q *db.Queries) (time.Time, error) {
	if r.cfg.LeaseClock != nil {
		return r.cfg.LeaseClock().UTC().Truncate(time.Microsecond), nil
	}
	t, err := q.LeaseClockNow(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the database's clock: %w", err)
	}
	return t.UTC(), nil
}

// refuse audits a refused attempt in a transaction of its own and returns
// the refusal. If the audit row cannot be written the refusal still stands,
// but the caller learns that the database failed.
func (r *Registry) refuse(ctx context.Context, actor identity.Principal, action, targetKind, target string, asked any, rerr *refusal.Error) error {
	r.metrics.refusals.WithLabelValues(action, rerr.Kind.Error()).Inc()
	detail := rerr.Detail
	if len(rerr.Fields) > 0 {
		detail = fmt.Sprintf("%s (%s: %s)", detail, rerr.Fields[0].Field, rerr.Fields[0].Message)
	}
	_, err := audit.AppendAlone(ctx, r.cfg.Pool, r.now(), audit.Entry{
		ActorKind: actorKind(actor), Actor: actor.String(), Action: action,
		TargetKind: targetKind, Target: target, Outcome: audit.Refused,
		Reason: detail, After: asked,
	})
	if err != nil {
		return fmt.Errorf("audit refused %s: %w", action, err)
	}
	return rerr
}

// accepted is the audit entry of a change that took effect.
func accepted(actor identity.Principal, action, targetKind, target string, before, after any) audit.Entry {
	return audit.Entry{
		ActorKind: actorKind(actor), Actor: actor.String(), Action: action,
		TargetKind: targetKind, Target: target, Outcome: audit.Accepted,
		Before: before, After: after,
	}
}

func actorKind(p identity.Principal) string {
	if p.Kind == "" {
		return "system"
	}
	return string(p.Kind)
}

func notFound(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

// Page bounds a list call. Limit is clamped to [1, MaxPageSize].
type Page struct {
	After string
	Limit int
}

// Page sizes.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

func (p Page) limit() int32 {
	switch {
	case p.Limit <= 0:
		return DefaultPageSize
	case p.Limit > MaxPageSize:
		return MaxPageSize
	}
	return int32(p.Limit)
}

// withTx runs fn in a transaction.
func (r *Registry) withTx(ctx context.Context, fn func(q *db.Queries) error) error {
	return db.WithTx(ctx, r.cfg.Pool, fn)
}

// write runs fn in one transaction. fn returns a refusal to refuse without
// changing anything, or an error to fail. A refusal is audited in a
// transaction of its own and returned; a not-found refusal is returned
// without an audit row, since there was nothing there to act on.
func (r *Registry) write(ctx context.Context, actor identity.Principal, action, targetKind, target string, asked any,
	fn func(q *db.Queries) (*refusal.Error, error)) error {
	if err := r.beforeSealing(ctx); err != nil {
		return err
	}
	var refused *refusal.Error
	err := r.withTx(ctx, func(q *db.Queries) error {
		var err error
		refused, err = fn(q)
		return err
	})
	switch {
	case err != nil:
		return err
	case refused == nil:
		return nil
	case errors.Is(refused, ErrNotFound):
		return refused
	}
	return r.refuse(ctx, actor, action, targetKind, target, asked, refused)
}
