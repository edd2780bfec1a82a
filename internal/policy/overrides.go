package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/seal"
)

// Action is what an override does to an instance.
type Action string

// Actions. Deregister is not asked for through Create: it is what an
// operator's deregistration of an instance becomes (Service.Deregister).
const (
	MarkIneligible Action = "mark_ineligible"
	MarkEligible   Action = "mark_eligible"
	Deregister     Action = "deregister"
)

// State is where an override is in its life.
type State string

// States. Lifted, expired and applied are final. A deregistration is
// never active: it is applied (the instance ended) at once, or on its
// co-signature.
const (
	StatePending State = "pending_cosign"
	StateActive  State = "active"
	StateLifted  State = "lifted"
	StateExpired State = "expired"
	StateApplied State = "applied"
)

// Defaults of Config.
const (
	DefaultOverrideMax     = 5
	DefaultOverrideWindow  = 10 * time.Minute
	DefaultWriteMax        = 60
	DefaultWriteWindow     = time.Minute
	DefaultMaxExpiry       = 24 * time.Hour
	DefaultExpiry          = time.Hour
	DefaultCosignWindow    = 5 * time.Minute
	MinJustificationLength = 10
	MaxJustificationLength = 2000
)

// Verdicts reads the evaluator's current verdicts of a service (the
// evaluator's Snapshot): its own verdicts, before any override.
type Verdicts interface {
	Snapshot(service string) (assembler.ServiceInput, bool)
}

// ServiceReader reads a service in the caller's transaction
// (registry.Registry).
type ServiceReader interface {
	ReadService(ctx context.Context, q *db.Queries, name string) (svc registry.Service, found bool, err error)
}

// Config configures a Service.
type Config struct {
	Pool     *pgxpool.Pool
	Verdicts Verdicts
	// OverrideLimit is the per-actor, per-service limit on override
	// attempts that pass authorisation: 5 per 10 minutes.
	OverrideLimit Limit
	// WriteLimit is the per-actor limit on each family of policy writes
	// (contracts, grants, prober assignments): 60 per minute.
	WriteLimit Limit
	// MaxExpiry bounds expires_in (24 h); DefaultExpiry is used when it is
	// omitted (1 h).
	MaxExpiry     time.Duration
	DefaultExpiry time.Duration
	// CosignWindow is how long a budget-refused attempt waits for a
	// co-signer: 5 min.
	CosignWindow time.Duration
	// InForce, when set, is signalled (after commit) when overrides
	// changed, so the local evaluator, which reads them from it, picks
	// them up at once; other replicas find them by polling.
	InForce *InForce
	// Sealer, when set, seals every override put in force (seal.go);
	// SealKeys are further keys seals are trusted from (a rotated-out
	// key). With neither, muster trusts the overrides table as it is.
	Sealer   Sealer
	SealKeys SealKeys
	// Trust, when set, is what seals are verified against instead of
	// SealKeys and the Sealer's key (seal.Trust: a keyless replica's is
	// sealed once the region's rows are).
	Trust *seal.Trust
	// Services, when set, reads the services overrides and
	// deregistrations name with the owner muster sealed
	// (registry.Registry.ReadService), so an owner changed by hand gives
	// its team no authority; without it the row's owner is believed.
	Services ServiceReader
	// Now defaults to time.Now; tests pass a fake clock.
	Now    func() time.Time
	Logger *slog.Logger
	// Registerer, when set, receives muster_policy_attempts_total.
	Registerer prometheus.Registerer
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	if c.Pool == nil || c.Verdicts == nil {
		return errors.New("policy: Pool and Verdicts are required")
	}
	if c.OverrideLimit == (Limit{}) {
		c.OverrideLimit = Limit{Max: DefaultOverrideMax, Window: DefaultOverrideWindow}
	}
	if c.WriteLimit == (Limit{}) {
		c.WriteLimit = Limit{Max: DefaultWriteMax, Window: DefaultWriteWindow}
	}
	if err := c.OverrideLimit.Validate(); err != nil {
		return fmt.Errorf("policy: override %w", err)
	}
	if err := c.WriteLimit.Validate(); err != nil {
		return fmt.Errorf("policy: write %w", err)
	}
	if c.MaxExpiry == 0 {
		c.MaxExpiry = DefaultMaxExpiry
	}
	if c.DefaultExpiry == 0 {
		c.DefaultExpiry = min(DefaultExpiry, c.MaxExpiry)
	}
	if c.CosignWindow == 0 {
		c.CosignWindow = DefaultCosignWindow
	}
	switch {
	case c.MaxExpiry < time.Minute:
		return fmt.Errorf("policy: MaxExpiry %s is below 1m", c.MaxExpiry)
	case c.DefaultExpiry <= 0 || c.DefaultExpiry > c.MaxExpiry:
		return fmt.Errorf("policy: DefaultExpiry %s must be above 0 and at most MaxExpiry %s", c.DefaultExpiry, c.MaxExpiry)
	case c.CosignWindow < time.Second:
		return fmt.Errorf("policy: CosignWindow %s is below 1s", c.CosignWindow)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Service admits, lifts and lists overrides, and rate-limits policy writes.
type Service struct {
	cfg      Config
	trust    *seal.Trust // the seals trusted: Trust, or SealKeys and the Sealer's
	attempts *prometheus.CounterVec
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	trust := cfg.Trust
	if trust == nil {
		trust = seal.NewTrust(cfg.SealKeys.With(cfg.Sealer))
	}
	s := &Service{cfg: cfg, trust: trust, attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "muster_policy_attempts_total",
		Help: "Override attempts (override.create, override.cosign, override.lift, and instance.deregister, which counts instances deregistering themselves too) by action, outcome (accepted, refused, error) and the check that decided a refusal.",
	}, []string{"action", "outcome", "check"})}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.attempts); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// OverrideLimit is the limit on override attempts per actor and service.
func (s *Service) OverrideLimit() Limit { return s.cfg.OverrideLimit }

// WriteLimit is the limit on each family of policy writes per actor.
func (s *Service) WriteLimit() Limit { return s.cfg.WriteLimit }

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// Override is one override as the API shows it. State is as of the read:
// an active override past ExpiresAt (or a pending one past CosignBy) is
// expired. A deregistration has no ExpiresAt: it takes effect once, and a
// pending one lapses at CosignBy.
type Override struct {
	ID                  uuid.UUID  `json:"id"`
	InstanceID          uuid.UUID  `json:"instance_id"`
	Service             string     `json:"service"`
	Zone                string     `json:"zone"`
	Action              Action     `json:"action"`
	State               State      `json:"state"`
	Actor               string     `json:"actor"`
	Justification       string     `json:"justification"`
	Cosigner            string     `json:"cosigner,omitempty"`
	CosignJustification string     `json:"cosign_justification,omitempty"`
	CosignedAt          *time.Time `json:"cosigned_at,omitempty"`
	CosignBy            *time.Time `json:"cosign_by,omitempty"`
	BudgetDetail        string     `json:"budget_detail,omitempty"`
	CreatedAt           time.Time  `json:"created_at"`
	ExpiresAt           time.Time  `json:"expires_at,omitzero"`
	LiftedAt            *time.Time `json:"lifted_at,omitempty"`
	LiftedBy            string     `json:"lifted_by,omitempty"`
	EndedAt             *time.Time `json:"ended_at,omitempty"`

	quota *Decision // the rate limit after the call that returned it
}

// Quota is the caller's rate limit after the call that returned o (Create
// and Cosign), for the RateLimit-* headers.
func (o Override) Quota() (Decision, bool) {
	if o.quota == nil {
		return Decision{}, false
	}
	return *o.quota, true
}

func fromRow(r db.Override, now time.Time) Override {
	o := Override{
		ID: r.ID, InstanceID: r.InstanceID, Service: r.Service, Zone: r.Zone, Action: Action(r.Action),
		State: State(r.State), Actor: r.Actor, Justification: r.Justification, CosignedAt: r.CosignedAt,
		CosignBy: r.CosignBy, BudgetDetail: r.BudgetDetail, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt,
		LiftedAt: r.LiftedAt, EndedAt: r.EndedAt,
	}
	if r.Cosigner != nil {
		o.Cosigner = *r.Cosigner
	}
	if r.CosignJustification != nil {
		o.CosignJustification = *r.CosignJustification
	}
	if r.LiftedBy != nil {
		o.LiftedBy = *r.LiftedBy
	}
	if o.Action == Deregister {
		// The column holds the co-sign deadline, to satisfy the table's
		// rules; a deregistration does not expire.
		o.ExpiresAt = time.Time{}
	}
	switch {
	case o.State == StateActive && !now.Before(o.ExpiresAt):
		o.State = StateExpired
	case o.State == StatePending && o.CosignBy != nil && !now.Before(*o.CosignBy):
		o.State = StateExpired
	}
	return o
}

// Request is the body of POST /v1/overrides.
type Request struct {
	InstanceID    string `json:"instance_id"`
	Action        Action `json:"action"`
	Justification string `json:"justification"`
	// ExpiresIn is the override's lifetime in seconds; 0 or omitted takes
	// the default (1 h). Overrides always expire.
	ExpiresIn int64 `json:"expires_in,omitempty"`
}

// CosignRequest is the body of POST /v1/overrides/{id}/cosign.
type CosignRequest struct {
	Justification string `json:"justification"`
}

// mayOverride: the owning team's operators (people or tools) and admins
// (ADR-15), the same authority the registry asks for policy changes.
func mayOverride(p identity.Principal, team string) bool { return registry.CanManage(p, team) }

// canRead: any operator or tool, as for reading the registry's estate.
func canRead(p identity.Principal) bool { return registry.CanReadEstate(p) }

// checkJustification refuses an empty or token justification: at least
// MinJustificationLength characters that are not spaces, and not one
// character repeated ("xxxxxxxxxx").
func checkJustification(field, j string) *refusal.Error {
	var nonSpace []rune
	for _, r := range j {
		if !unicode.IsSpace(r) {
			nonSpace = append(nonSpace, r)
		}
	}
	distinct := map[rune]bool{}
	for _, r := range nonSpace {
		distinct[unicode.ToLower(r)] = true
	}
	var msg string
	switch {
	case len(nonSpace) == 0:
		msg = "a justification is required: say why, for whoever reads the audit log later"
	case utf8.RuneCountInString(j) > MaxJustificationLength:
		msg = fmt.Sprintf("the justification is %d characters; at most %d", utf8.RuneCountInString(j), MaxJustificationLength)
	case len(nonSpace) < MinJustificationLength:
		msg = fmt.Sprintf("the justification %q is too short to explain anything: at least %d characters besides spaces", j, MinJustificationLength)
	case len(distinct) < 3:
		msg = fmt.Sprintf("the justification %q is not an explanation: write what you saw and why this instance", j)
	default:
		return nil
	}
	e := refusal.New(ErrJustification, CheckJustification, "%s", msg)
	e.Fields = []registry.FieldError{{Field: field, Message: msg}}
	return e
}

// attempt is one call's audit context.
type attempt struct {
	actor      identity.Principal
	action     string
	target     string
	asked      any
	passed     []string
	rate       *Decision
	budget     map[string]any
	overrideID uuid.UUID
	ended      *registry.Instance // the instance a deregistration ended
}

// decision is what the audit row's after holds about how it was decided.
type decision struct {
	Check   string         `json:"check"`
	Passed  []string       `json:"passed"`
	Figures map[string]any `json:"figures,omitempty"`
	Request any            `json:"request,omitempty"`
	Result  any            `json:"override,omitempty"`
	// Instance is the instance a deregistration ended, as it is after.
	Instance any `json:"instance,omitempty"`
}

func actorKind(p identity.Principal) string {
	if p.Kind == "" {
		return "system"
	}
	return string(p.Kind)
}

// refuse writes the refusal's audit row with q (the attempt's transaction,
// which commits, so a counted attempt stays counted).
func (a *attempt) refuse(ctx context.Context, q *db.Queries, now time.Time, e *refusal.Error) error {
	if e.Quota == nil && a.rate != nil {
		e.Quota = a.rate.Quota()
	}
	figures := e.Figures
	if e.Kind == ErrRateLimited && e.Quota != nil {
		figures = quotaFigures(*e.Quota)
		e.Figures = figures
	}
	d := decision{Check: e.Check, Passed: nonNil(a.passed), Figures: figures, Request: a.asked}
	if o, ok := PendingOverride(e); ok {
		d.Result = o
	}
	_, err := audit.Append(ctx, q, now, audit.Entry{
		ActorKind: actorKind(a.actor), Actor: a.actor.String(), Action: a.action,
		TargetKind: "instance", Target: a.target, Outcome: audit.Refused,
		Reason: e.Check + ": " + e.Detail, After: d,
	})
	return err
}

func (a *attempt) accept(ctx context.Context, q *db.Queries, now time.Time, check, note string, before any, o Override) error {
	d := decision{Check: check, Passed: nonNil(a.passed), Figures: a.budget, Request: a.asked, Result: o, Instance: a.ended}
	_, err := audit.Append(ctx, q, now, audit.Entry{
		ActorKind: actorKind(a.actor), Actor: a.actor.String(), Action: a.action,
		TargetKind: "instance", Target: a.target, Outcome: audit.Accepted,
		Reason: note, Before: before, After: d,
	})
	return err
}

// clip bounds s to n runes for the audit log, marking the cut.
func clip(s string, n int) string { return audit.Clip(s, n) }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// run runs fn in one transaction. A refusal fn returns is audited in that
// same transaction, which then commits: an attempt that passed
// authorisation stays counted by the rate limit even when a later check
// refuses it, and a budget refusal keeps its pending_cosign row.
func (s *Service) run(ctx context.Context, a *attempt, fn func(q *db.Queries, now time.Time) (*refusal.Error, error)) error {
	var refused *refusal.Error
	now := s.now()
	err := db.WithTx(ctx, s.cfg.Pool, func(q *db.Queries) error {
		var err error
		refused, err = fn(q, now)
		if err != nil || refused == nil {
			return err
		}
		return a.refuse(ctx, q, now, refused)
	})
	switch {
	case err != nil:
		s.attempts.WithLabelValues(a.action, "error", "").Inc()
		return err
	case refused != nil:
		s.attempts.WithLabelValues(a.action, "refused", refused.Check).Inc()
		return refused
	}
	s.attempts.WithLabelValues(a.action, "accepted", "").Inc()
	return nil
}

// changed brings this process's copy of the overrides in force up to
// date after a committed change, before the caller is answered: a view
// this replica assembles next carries it (read your writes). Should the
// read fail, the copy's worker retries at once.
func (s *Service) changed(ctx context.Context) {
	if s.cfg.InForce == nil {
		return
	}
	if err := s.cfg.InForce.Refresh(ctx); err != nil {
		s.cfg.Logger.Warn("refresh the overrides in force after a change; the worker retries", "err", err)
		s.cfg.InForce.signal()
	}
}

// Create admits an override. The checks run in ADR-15's order and the
// first refusal wins: authorisation (the owning team's operator role, or
// admin), the per-actor per-service rate limit (every attempt that passes
// authorisation counts), a justification and an expiry within the maximum,
// and, for mark_ineligible, the disruption budget. A budget refusal is
// stored as pending_cosign (the refusal's Subject: PendingOverride) for a second
// identity to co-sign within CosignWindow. Every attempt is audited.
func (s *Service) Create(ctx context.Context, actor identity.Principal, req Request) (Override, error) {
	// The audit row keeps what was asked, bounded: a refused request may
	// carry up to a whole body of junk.
	asked := req
	asked.InstanceID, asked.Justification = clip(req.InstanceID, 64), clip(req.Justification, MaxJustificationLength)
	asked.Action = Action(clip(string(req.Action), 64))
	a := &attempt{actor: actor, action: "override.create", target: asked.InstanceID, asked: asked}
	var out Override
	err := s.run(ctx, a, func(q *db.Queries, now time.Time) (*refusal.Error, error) {
		id, err := uuid.Parse(req.InstanceID)
		if err != nil || id == uuid.Nil {
			e := refusal.New(ErrInvalid, CheckRequest, "instance_id must be an instance's id (a UUID), got %q", req.InstanceID)
			e.Fields = []registry.FieldError{{Field: "instance_id", Message: "not a UUID"}}
			return e, nil
		}
		if req.Action == Deregister {
			e := refusal.New(ErrInvalid, CheckRequest, "an instance is deregistered by deregistering it (DELETE /v1/instances/%s) with a justification, which goes through the same checks; action must be mark_ineligible or mark_eligible", id)
			e.Fields = []registry.FieldError{{Field: "action", Message: "must be mark_ineligible or mark_eligible"}}
			return e, nil
		}
		if req.Action != MarkIneligible && req.Action != MarkEligible {
			e := refusal.New(ErrInvalid, CheckRequest, "action must be mark_ineligible or mark_eligible, got %q", req.Action)
			e.Fields = []registry.FieldError{{Field: "action", Message: "must be mark_ineligible or mark_eligible"}}
			return e, nil
		}
		a.target = id.String()
		a.passed = append(a.passed, CheckRequest)
		ins, found, err := registry.ReadInstance(ctx, q, id)
		if err != nil {
			return nil, err
		}
		if !found {
			return refusal.New(ErrNotFound, CheckInstance, "no instance %s", id), nil
		}
		svc, err := s.readService(ctx, q, ins.Service)
		if err != nil {
			return nil, err
		}
		if !mayOverride(actor, svc.Owner) {
			return refusal.New(ErrForbidden, CheckAuthorization,
				"overriding instances of %s needs the %s team's operator role or admin; %s has neither", ins.Service, svc.Owner, actor), nil
		}
		a.passed = append(a.passed, CheckAuthorization)
		if e, err := s.limit(ctx, q, now, a, "override:"+ins.Service); e != nil || err != nil {
			return e, err
		}
		if e := checkJustification("justification", req.Justification); e != nil {
			return e, nil
		}
		a.passed = append(a.passed, CheckJustification)
		life, e := s.expiry(req.ExpiresIn)
		if e != nil {
			return e, nil
		}
		a.passed = append(a.passed, CheckExpiry)
		if ins.State != registry.StateActive {
			return refusal.New(ErrConflict, CheckState, "instance %s has ended (%s); there is nothing to override", id, ins.State), nil
		}
		if err := q.OverrideServiceLock(ctx, ins.Service); err != nil {
			return nil, fmt.Errorf("lock overrides of %s: %w", ins.Service, err)
		}
		inForce, err := s.inForce(ctx, q, ins.Service, now)
		if err != nil {
			return nil, fmt.Errorf("list overrides of %s: %w", ins.Service, err)
		}
		for _, o := range inForce {
			if o.InstanceID == id {
				return refusal.New(ErrConflict, CheckState, "instance %s already has override %s (%s by %s, until %s); lift it first",
					id, o.ID, o.Action, o.Actor, o.ExpiresAt.Format(time.RFC3339)), nil
			}
		}
		a.passed = append(a.passed, CheckState)
		oid, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("new override id: %w", err)
		}
		a.overrideID = oid
		row := db.OverrideInsertParams{
			ID: oid, InstanceID: id, Service: ins.Service, Zone: ins.Zone, Action: string(req.Action),
			State: string(StateActive), Actor: actor.String(), Justification: req.Justification,
			CreatedAt: now, ExpiresAt: now.Add(life),
		}
		check := CheckState
		if req.Action == MarkIneligible {
			if e, err := s.withinBudget(ctx, q, now, a, row, inForce, "override", "apply it"); e != nil || err != nil {
				return e, err
			}
			check = CheckBudget
		}
		stored, err := q.OverrideInsert(ctx, row)
		if err != nil {
			return nil, fmt.Errorf("store override: %w", err)
		}
		if stored, err = sealRow(ctx, q, s.cfg.Sealer, stored); err != nil {
			return nil, err
		}
		out = fromRow(stored, now)
		if err := a.accept(ctx, q, now, check, "", nil, out); err != nil {
			return nil, err
		}
		out.quota = a.rate
		return nil, nil
	})
	if err != nil {
		return Override{}, err
	}
	s.changed(ctx)
	return out, nil
}

// withinBudget runs the disruption budget check of taking row's instance
// out of rotation (an override marking it ineligible, or a deregistration
// by someone else). Within budget it records the check as passed and
// returns nil. Over budget the attempt is kept, pending, for a second
// identity to co-sign within CosignWindow (break-glass, ADR-15), and the
// refusal says so: what names the attempt, and doing what the co-sign
// would do.
func (s *Service) withinBudget(ctx context.Context, q *db.Queries, now time.Time, a *attempt, row db.OverrideInsertParams,
	inForce []db.Override, what, doing string) (*refusal.Error, error) {
	b, err := s.budget(ctx, q, row.Service, row.Zone, row.InstanceID, inForce)
	if err != nil {
		return nil, err
	}
	a.budget = b.figures()
	e := b.refusal()
	if e == nil {
		a.passed = append(a.passed, CheckBudget)
		return nil, nil
	}
	if errors.Is(e, ErrBudget) {
		row.State, row.EndedAt = string(StatePending), nil
		row.CosignBy, row.BudgetDetail = new(now.Add(s.cfg.CosignWindow)), e.Detail
		stored, err := q.OverrideInsert(ctx, row)
		if err != nil {
			return nil, fmt.Errorf("store %s awaiting co-sign: %w", what, err)
		}
		o := fromRow(stored, now)
		e.Subject = &o
		e.Detail += fmt.Sprintf("; a second identity with the same authority may co-sign override %s before %s to %s anyway",
			o.ID, o.CosignBy.Format(time.RFC3339), doing)
	}
	return e, nil
}

// inForce lists the overrides of service in force at now that muster
// put there (their seal verifies) and has not ended since (a replay):
// what the budget counts, as the views do. A row written outside muster neither spends nor frees headroom,
// and does not stand in an operator's way.
func (s *Service) inForce(ctx context.Context, q *db.Queries, service string, now time.Time) ([]db.Override, error) {
	rows, err := q.OverrideListInForceByService(ctx, db.OverrideListInForceByServiceParams{Service: service, Now: now})
	if err != nil {
		return nil, err
	}
	rows = slices.DeleteFunc(rows, func(r db.Override) bool { return verifyRow(s.trust.For(r.Seal, r.SealKey), r) != nil })
	ended, _, err := replayed(ctx, q, s.trust.Keys(), rows)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(rows, func(r db.Override) bool { _, gone := ended[r.ID]; return gone }), nil
}

// limit takes one attempt from the actor's quota for scope.
func (s *Service) limit(ctx context.Context, q *db.Queries, now time.Time, a *attempt, scope string) (*refusal.Error, error) {
	d, err := take(ctx, q, now, a.actor.String(), scope, s.cfg.OverrideLimit)
	if err != nil {
		return nil, err
	}
	a.rate = &d
	if !d.Allowed {
		e := refusal.New(ErrRateLimited, CheckRateLimit,
			"%s has made %d override attempts on %s in the last %s, the most allowed; retry in %d s",
			a.actor, d.Limit.Max, strings.TrimPrefix(scope, "override:"), d.Limit.Window, d.ResetSeconds())
		e.Quota = d.Quota()
		return e, nil
	}
	a.passed = append(a.passed, CheckRateLimit)
	return nil, nil
}

func (s *Service) expiry(seconds int64) (time.Duration, *refusal.Error) {
	if seconds == 0 {
		return s.cfg.DefaultExpiry, nil
	}
	max := s.cfg.MaxExpiry
	if seconds < 0 || seconds > int64(max/time.Second) {
		e := refusal.New(ErrExpiry, CheckExpiry, "expires_in must be between 1 and %d seconds (%s); overrides always expire, got %d",
			int64(max/time.Second), max, seconds)
		e.Fields = []registry.FieldError{{Field: "expires_in", Message: fmt.Sprintf("must be 1 to %d seconds", int64(max/time.Second))}}
		return 0, e
	}
	return time.Duration(seconds) * time.Second, nil
}

// budgetCheck is the disruption budget's arithmetic for one removal.
type budgetCheck struct {
	service, zone         string
	counted               bool // the target is in rotation now (the guard counts it as routable)
	zoneBefore, zoneAfter int
	zoneTotal, required   int
	fraction              float64
	regionBefore          int
	regionAfter           int
	regionTotal           int
	tripsAfter            bool // the zone's guard trips once the target is out
}

func (b budgetCheck) figures() map[string]any {
	return map[string]any{
		"zone": b.zone, "zone_total": b.zoneTotal, "zone_eligible_before": b.zoneBefore, "zone_eligible_after": b.zoneAfter,
		"zone_required": b.required, "min_healthy_fraction": b.fraction,
		"region_total": b.regionTotal, "region_eligible_before": b.regionBefore, "region_eligible_after": b.regionAfter,
		"target_counted_eligible": b.counted,
	}
}

func (b budgetCheck) refusal() *refusal.Error {
	if !b.counted {
		return nil // removing what is not in rotation spends no budget
	}
	if b.regionAfter == 0 {
		e := refusal.New(ErrLastInstance, CheckLastInstance,
			"would leave 0 of %d eligible in the region: this is the last eligible instance of %s, and muster never removes that, not even with a co-signer; restore capacity first",
			b.regionTotal, b.service)
		e.Figures = b.figures()
		return e
	}
	if b.tripsAfter {
		e := refusal.New(ErrBudget, CheckBudget, "would leave %d of %d eligible in zone %s; the contract requires %d (min_healthy_fraction %g)",
			b.zoneAfter, b.zoneTotal, b.zone, b.required, b.fraction)
		e.Figures = b.figures()
		return e
	}
	return nil
}

// budget computes what removing target would do, from the evaluator's
// current verdicts with the overrides in force applied. The evaluator
// learns of ended instances on its next refresh (up to a second later on
// another replica), so the registry's own state of the instances it holds
// is read with q, under the caller's per-service lock, and applied as the
// evaluator will apply it: a deregistered or replaced instance is gone, one
// whose lease expired is counted as out of rotation. Two deregistrations a
// moment apart cannot spend the same headroom.
func (s *Service) budget(ctx context.Context, q *db.Queries, service, zone string, target uuid.UUID, inForce []db.Override) (budgetCheck, error) {
	snap, ok := s.cfg.Verdicts.Snapshot(service)
	if !ok {
		return budgetCheck{}, fmt.Errorf("budget of %s: %w", service, evaluator.ErrNotReady)
	}
	ids := make([]uuid.UUID, len(snap.Instances))
	for i, v := range snap.Instances {
		ids[i] = v.ID
	}
	states, err := registry.InstanceStates(ctx, q, ids)
	if err != nil {
		return budgetCheck{}, fmt.Errorf("budget of %s: %w", service, err)
	}
	return budgetOf(snap, states, zone, target, inForce), nil
}

// budgetOf is budget's arithmetic on a snapshot, the registry's states of
// its instances (an instance missing from states is taken as the
// evaluator holds it) and the overrides in force.
func budgetOf(snap assembler.ServiceInput, states map[uuid.UUID]string, zone string, target uuid.UUID, inForce []db.Override) budgetCheck {
	current := make([]assembler.InstanceInput, 0, len(snap.Instances))
	for _, v := range snap.Instances {
		switch states[v.ID] {
		case registry.StateDeregistered, registry.StateReplaced:
			continue
		case registry.StateExpired:
			v.LeaseExpired = true
		}
		current = append(current, v)
	}
	snap.Instances = current
	forced := make(map[uuid.UUID]Action, len(inForce))
	for _, o := range inForce {
		forced[o.InstanceID] = Action(o.Action)
	}
	return overrideBudget(snap, zone, target, forced)
}

// overrideBudget is the disruption budget of marking target ineligible,
// counted by the guard's own rule (assembler.Capacity) on the guard's own
// input (the evaluator's snapshot) with the overrides in force
// applied: in rotation is what the guard counts as routable (unknown
// included: silence is not failure, and the guard keeps it serving), and
// capacity excludes instances awaiting their first success. The removal
// is refused when the guard would trip on the zone without the target,
// i.e. exactly when the removal would not hold: the budget and the guard
// cannot disagree (TestPropBudgetsAgreeWithTheGuard). An instance the
// evaluator has not loaded yet (registered a moment ago) is not capacity.
func overrideBudget(snap assembler.ServiceInput, zone string, target uuid.UUID, forced map[uuid.UUID]Action) budgetCheck {
	b := budgetCheck{service: snap.Name, zone: zone, fraction: assembler.NormFraction(snap.MinHealthyFraction)}
	for _, v := range snap.Instances {
		if v.ID == target {
			zone, b.zone = v.Zone, v.Zone
		}
	}
	var zoneBefore, zoneAfter, regionBefore, regionAfter assembler.Capacity
	for _, v := range snap.Instances {
		x := v
		if a, ok := forced[v.ID]; ok {
			x.Override = &assembler.Override{Action: string(a)}
		}
		after := x
		if v.ID == target {
			b.counted = assembler.Routable(&x)
			after.Override = &assembler.Override{Action: assembler.OverrideIneligible}
		}
		regionBefore.Add(&x)
		regionAfter.Add(&after)
		if v.Zone == zone {
			zoneBefore.Add(&x)
			zoneAfter.Add(&after)
		}
	}
	b.zoneBefore, b.zoneAfter, b.zoneTotal = zoneBefore.Routable, zoneAfter.Routable, zoneAfter.Counted
	b.required = zoneAfter.Required(b.fraction)
	b.tripsAfter = zoneAfter.Tripped(b.fraction)
	b.regionBefore, b.regionAfter, b.regionTotal = regionBefore.Routable, regionAfter.Routable, regionAfter.Counted
	return b
}

// VerdictsFunc adapts a function to Verdicts.
type VerdictsFunc func(service string) (assembler.ServiceInput, bool)

// Snapshot implements Verdicts.
func (f VerdictsFunc) Snapshot(service string) (assembler.ServiceInput, bool) { return f(service) }

// MayOverride reports whether p may create, co-sign and lift overrides of
// a service owned by team: the team's operators (people or tools) and
// admins. The UI asks it to decide which buttons to show; the checks
// themselves run in Create, Cosign and Lift.
func MayOverride(p identity.Principal, team string) bool { return mayOverride(p, team) }

// ProblemMembers are what a refusal that stored o pending a co-signature
// tells its caller beside the problem: the override and where and until
// when to co-sign it.
func (o *Override) ProblemMembers() map[string]any {
	return map[string]any{"override_id": o.ID, "cosign_by": o.CosignBy, "cosign_url": "/v1/overrides/" + o.ID.String() + "/cosign"}
}
