// Package shift is muster's shift-backs (ADR-13): draining traffic away
// from a zone, or from this muster's whole region, and returning it in
// capped steps.
//
// A shift moves topology preference, not health: the zone's endpoints stay
// registered and keep their verdicts; every published view carries a
// per-zone traffic weight (assembler.ZoneStatus.TrafficWeight) that clients
// and xDS locality weights multiply into endpoint weights. Weights returns
// the current weights for the publisher; a zone under several shifts (its
// own and the region's) gets the lowest.
//
// Life of a shift, all through the policy API and all audited, accepted or
// refused, with the deciding check and its figures:
//
//   - Drain (POST /v1/shifts) sets the target's weight to 0 at once:
//     draining is the emergency move and waits for nothing. It is refused
//     when the target already has an active shift, and a zone drain is
//     budget-checked (below).
//   - StepBack (POST /v1/shifts/{id}/step) moves the weight to the next
//     configured step (default 0.10, 0.25, 0.50, 1.00), never sooner than
//     the dwell (default 2 min) after the previous move, the drain
//     included; inside the dwell it is refused with the time the next step
//     is allowed. The first step back is always asked for by a person or a
//     tool: it declares the recovery real.
//   - After a manual failover the last step (to 1.00) needs Confirm (POST
//     /v1/shifts/{id}/confirm), which also waits for the dwell. Reaching
//     the step before it puts the shift in pending_confirmation; from then
//     StepBack is refused and the timer never completes it. A shift pending
//     longer than PendingAlarmAfter (default 10 min) raises the
//     shiftback_pending alarm until it is confirmed.
//   - After an automatic failover (manual=false) the steps after the first,
//     the last included, are taken by the worker (RunOnce) as each dwell
//     elapses; StepBack may still take them sooner than the timer, never
//     inside the dwell.
//
// Budget: draining zone Z may not take any service below its minimum in the
// region. For each service with live instances in Z, the region is counted
// as the fraction guard counts a zone (assembler.Capacity, the one rule
// the guard and the override budget use too): the instances in rotation
// (eligible, degraded, unknown, not quarantined, or forced in) outside Z
// and outside zones already drained to 0, against the service's capacity
// (every instance but those awaiting their first success). The drain is
// refused when the guard would trip on those numbers.
//
// Region scope drains every zone of this region (the target must be this
// muster's region). The budget cannot be met in-region by construction:
// the traffic goes to other regions, whose capacity this muster does not
// know (ADR-14). Region drains are therefore admin-only and skip the
// in-region budget check; the audit record says it was skipped.
//
// Authorisation: operators and admins (people or tools with the operator
// role or above). Zones are shared by every team, so a shift is not
// team-scoped. Reading shifts is open to every operator or tool identity.
//
// Replicas: the shifts live in PostgreSQL. Every write takes a fresh
// revision from a sequence; each replica polls the newest revision on a
// tick (default 1 s) and reloads the active shifts when it moved, then
// bumps its Revision, which the publisher pulls, so every affected
// service gets a new version. The replica that made a change reloads at once. The automatic
// steps lock their rows (FOR UPDATE SKIP LOCKED), so two replicas never
// take one step twice.
package shift

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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
	"github.com/musterhq/muster/internal/worker"
)

// AlarmShiftbackPending is raised while a manual shift-back has waited for
// its final confirmation longer than Config.PendingAlarmAfter.
const AlarmShiftbackPending = "shiftback_pending"

// Shift scopes.
const (
	ScopeZone   = "zone"
	ScopeRegion = "region"
)

// Shift states.
const (
	Draining            = "draining"
	Returning           = "returning"
	PendingConfirmation = "pending_confirmation"
	Completed           = "completed"
	Cancelled           = "cancelled"
)

// Defaults for Config.
const (
	DefaultDwell        = 2 * time.Minute
	DefaultPendingAlarm = 10 * time.Minute
	DefaultPoll         = time.Second
	// MinReason and MaxReason bound a shift's reason, in
	// characters after trimming.
	MinReason = 10
	MaxReason = 1000
)

// DefaultSteps is the ladder of traffic weights a shift walks back.
var DefaultSteps = []float64{0.10, 0.25, 0.50, 1.00}

// The kinds of refusal particular to shifts, as *refusal.Error values; the
// others are the broad kinds (ErrForbidden, ErrInvalid, ErrConflict,
// ErrNotFound). A shift refusal's Check is authorisation, validation,
// conflict, state, budget, dwell or confirmation, and its Figures are
// written to the audit log too.
var (
	// ErrDwell: the minimum dwell since the last move has not
	// elapsed; the refusal's RetryAfter says how long until it has.
	ErrDwell = refusal.Conflict.Sub("dwell not elapsed", "dwell-not-elapsed")
	// ErrBudget: the drain would take a service below its minimum;
	// the refusal's Figures list them (figureServices).
	ErrBudget = refusal.Conflict.Sub("budget exceeded", "budget-exceeded")
	// ErrNeedsConfirm: the final step of a manual shift needs Confirm.
	ErrNeedsConfirm = refusal.Conflict.Sub("confirmation required", "confirmation-required")
)

// figureServices is the figure of a drain's budget refusal that lists the
// services it would take below their minimum ([]BudgetFigure).
const figureServices = "services"

// BudgetShortfall returns the services a drain's budget refusal lists.
func BudgetShortfall(err *refusal.Error) []BudgetFigure {
	f, _ := err.Figures[figureServices].([]BudgetFigure)
	return f
}

// Verdicts reads the evaluator's current verdicts of a service, as the
// assembler takes them (the evaluator is one).
type Verdicts interface {
	Snapshot(service string) (assembler.ServiceInput, bool)
}

// Config configures Service.
type Config struct {
	Pool *pgxpool.Pool
	// Region is this muster's region, the only valid region-scope target.
	Region   string
	Verdicts Verdicts
	// Steps are the traffic weights a shift walks back through, strictly
	// increasing in (0,1] and ending at 1 (DefaultSteps).
	Steps []float64
	// Dwell is the minimum time between two moves (DefaultDwell).
	Dwell time.Duration
	// PendingAlarmAfter: a final confirmation pending longer raises
	// shiftback_pending (DefaultPendingAlarm).
	PendingAlarmAfter time.Duration
	// Poll is how often the worker takes due automatic steps and looks for
	// changes made by other replicas (DefaultPoll).
	Poll time.Duration
	// Sealer, when set, seals every shift this Service writes; SealKeys
	// are further keys seals are trusted from (seal.go). With neither,
	// the shifts table is trusted as it is.
	Sealer   seal.Signer
	SealKeys seal.Keys
	// Trust, when set, is what seals are verified against instead of
	// SealKeys and the Sealer's key (seal.Trust: a keyless replica's is
	// sealed once the region's rows are).
	Trust *seal.Trust
	// Fallback, when set, names the peer regions that can take this
	// region's traffic now (followed, reached within the stale
	// threshold, not turned off by the routing control), or says why none
	// can. A region drain with none is refused with that reason (check
	// no_fallback_region): draining a region moves its clients to those
	// regions, and with none it would move nothing. Nil: no check (a
	// region drain is taken as an operator's decision alone).
	Fallback func() (regions []string, why string)
	Now      func() time.Time
	Logger   *slog.Logger
	// Registerer, when set, receives muster_shifts_active and
	// muster_shiftbacks_pending.
	Registerer prometheus.Registerer
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("shift: Pool is required")
	case c.Region == "":
		return errors.New("shift: Region is required")
	case c.Verdicts == nil:
		return errors.New("shift: Verdicts is required")
	}
	if len(c.Steps) == 0 {
		c.Steps = DefaultSteps
	}
	if err := ValidSteps(c.Steps); err != nil {
		return fmt.Errorf("shift: %w", err)
	}
	c.Steps = slices.Clone(c.Steps)
	if c.Dwell == 0 {
		c.Dwell = DefaultDwell
	}
	if c.PendingAlarmAfter == 0 {
		c.PendingAlarmAfter = DefaultPendingAlarm
	}
	if c.Poll == 0 {
		c.Poll = DefaultPoll
	}
	if c.Dwell < 0 || c.PendingAlarmAfter < 0 || c.Poll < 0 {
		return errors.New("shift: Dwell, PendingAlarmAfter and Poll must not be negative")
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// ValidSteps checks a step ladder: strictly increasing weights in
// (0,1], the last exactly 1.
func ValidSteps(steps []float64) error {
	if len(steps) == 0 {
		return errors.New("no shift steps")
	}
	for i, w := range steps {
		if !(w > 0 && w <= 1) || (i > 0 && w <= steps[i-1]) {
			return fmt.Errorf("shift steps %v must increase strictly within (0,1]", steps)
		}
	}
	if steps[len(steps)-1] != 1 {
		return fmt.Errorf("shift steps %v must end at 1", steps)
	}
	return nil
}

// Request is the body of POST /v1/shifts.
type Request struct {
	Scope  string `json:"scope"`
	Target string `json:"target"`
	Reason string `json:"reason"`
	// Manual: a person declared the failover; the final step back then
	// needs confirmation. Required, so that nobody gets an automatic
	// shift-back by leaving it out.
	Manual *bool `json:"manual"`
}

// Shift is a shift as the API shows it.
type Shift struct {
	ID     uuid.UUID `json:"id"`
	Scope  string    `json:"scope"`
	Target string    `json:"target"`
	Reason string    `json:"reason"`
	Manual bool      `json:"manual"`
	State  string    `json:"state"`
	// Step counts the steps taken back (0 while drained).
	Step int `json:"step"`
	// TrafficWeight is what the views publish for the target now.
	TrafficWeight float64 `json:"traffic_weight"`
	// NextWeight and NextStepAt: the next move and the earliest time it
	// is allowed (absent once the shift has ended). For a manual shift
	// pending confirmation the next move is the confirmation.
	NextWeight *float64   `json:"next_weight,omitempty"`
	NextStepAt *time.Time `json:"next_step_at,omitempty"`
	// PendingSince and PendingSeconds: when the shift began waiting for
	// its final confirmation, and for how long it has (while it waits).
	PendingSince   *time.Time `json:"pending_since,omitempty"`
	PendingSeconds *float64   `json:"pending_seconds,omitempty"`
	StartedBy      string     `json:"started_by"`
	StartedAt      time.Time  `json:"started_at"`
	LastStepBy     string     `json:"last_step_by"`
	LastStepAt     time.Time  `json:"last_step_at"`
	ConfirmedBy    *string    `json:"confirmed_by,omitempty"`
	ConfirmedAt    *time.Time `json:"confirmed_at,omitempty"`
	EndedAt        *time.Time `json:"ended_at,omitempty"`
}

// Filter selects shifts for List.
type Filter struct {
	State string // empty: every state
	After uuid.UUID
	Limit int
}

// Service is the shift-back state machine, its store and its worker.
type Service struct {
	cfg    Config
	trust  *seal.Trust // the seals trusted: Trust, or SealKeys and the Sealer's
	log    *slog.Logger
	runner worker.Runner

	reload sync.Mutex // serialises reloads
	mu     sync.Mutex
	rev    int64
	active []db.Shift // the active shifts applied: their seals verify
	// unsealed are the active shifts by the table not applied (seal.go).
	unsealed []Unsealed
	// held are the shifts applied before whose rows then stopped
	// verifying or went (held.go): they stay applied as muster last
	// verified them, and are in active too.
	held map[uuid.UUID]Held
	// replays are the active shifts by the table, sealed, that muster
	// has a record of ending (seal.go): not applied.
	replays []Unsealed
	loaded  bool
	// loads counts the loads that found the active shifts changed
	// (Revision); changed signals each (Changed).
	loads   uint64
	changed chan struct{}
}

// New returns a stopped Service.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	trust := cfg.Trust
	if trust == nil {
		trust = seal.NewTrust(cfg.SealKeys.With(cfg.Sealer))
	}
	s := &Service{cfg: cfg, trust: trust, log: cfg.Logger.With("worker", "shifts"), changed: make(chan struct{}, 1)}
	if cfg.Registerer != nil {
		count := func(pending bool) float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			n := 0
			for _, r := range s.active {
				if !pending || r.State == PendingConfirmation {
					n++
				}
			}
			return float64(n)
		}
		for _, c := range []prometheus.Collector{
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_shifts_active", Help: "Service draining, returning or pending confirmation."},
				func() float64 { return count(false) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_shiftbacks_pending", Help: "Manual shift-backs waiting for their final confirmation."},
				func() float64 { return count(true) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_shifts_unsealed",
				Help: "Active shifts by the shifts table that muster does not apply because their seal does not verify: written outside muster (docs/overrides.md: what muster writes is sealed). Anything above 0 deserves a look."},
				func() float64 { s.mu.Lock(); defer s.mu.Unlock(); return float64(len(s.unsealed)) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_shifts_held",
				Help: "Shifts muster applied whose rows then stopped verifying or were deleted: each stays applied as muster last verified it (a drain is never ended by a verification failure) and returns only in steps. Anything above 0 deserves a look."},
				func() float64 { s.mu.Lock(); defer s.mu.Unlock(); return float64(len(s.held)) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_shifts_replayed",
				Help: "Active shifts by the shifts table, sealed, that muster does not apply because it has a record of ending them (the audit log's end.record): an ended shift written back outside muster (docs/keys.md: replays). Anything above 0 deserves a look."},
				func() float64 { s.mu.Lock(); defer s.mu.Unlock(); return float64(len(s.replays)) }),
		} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// Start loads the active shifts (so the first views already carry them)
// and runs the worker until ctx ends or Stop is called.
func (s *Service) Start(ctx context.Context) error {
	if err := s.Reload(ctx); err != nil {
		return fmt.Errorf("load shifts: %w", err)
	}
	return s.runner.Start(ctx, s.run)
}

// Stop ends the worker and waits. Safe to call twice or before Start.
func (s *Service) Stop() { s.runner.Stop() }

func (s *Service) run(ctx context.Context) {
	worker.Every(ctx, s.cfg.Poll, func(ctx context.Context) {
		// A database that stops answering must not park the worker (the
		// weights it serves are in memory); the next tick tries again.
		rctx, cancel := context.WithTimeout(ctx, max(s.cfg.Poll, 5*time.Second))
		err := s.RunOnce(rctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("shift worker", "err", err)
		}
	})
}

// RunOnce takes the automatic steps whose dwell has elapsed and reloads the
// active shifts if any replica changed them. The worker calls it on every
// tick; tests call it to step deterministically.
func (s *Service) RunOnce(ctx context.Context) error {
	if err := s.advanceDue(ctx); err != nil {
		return err
	}
	return s.Reload(ctx)
}

// advanceDue takes the next step of every automatic shift on its way back
// whose dwell has elapsed.
func (s *Service) advanceDue(ctx context.Context) error {
	now := s.now()
	return db.WithTx(ctx, s.cfg.Pool, func(q *db.Queries) error {
		due, err := q.ShiftListDue(ctx, now.Add(-s.cfg.Dwell))
		if err != nil {
			return fmt.Errorf("list due shifts: %w", err)
		}
		// A held automatic shift returns on its timer too, from muster's
		// own last verified copy, written back first.
		for _, h := range s.dueHeld(now.Add(-s.cfg.Dwell)) {
			if cur, err := q.ShiftGetForUpdate(ctx, h.Row.ID); err == nil && s.verify(cur) == nil {
				continue // muster's own again (another replica wrote it back): the next load releases it
			} else if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("read held shift %s: %w", h.Row.ID, err)
			}
			due = slices.DeleteFunc(due, func(r db.Shift) bool { return r.ID == h.Row.ID })
			row, err := restore(ctx, q, h)
			if err != nil {
				return err
			}
			due = append(due, row)
		}
		for _, row := range due {
			if s.verify(row) != nil {
				continue // not muster's: never stepped (and so sealed) by it
			}
			next, err := s.move(ctx, q, row, "system:shifts", now)
			if err != nil {
				return err
			}
			if next, err = s.sealRow(ctx, q, next); err != nil {
				return err
			}
			if _, err := audit.Append(ctx, q, now, audit.Entry{
				ActorKind: "system", Actor: "system:shifts", Action: "shift.step",
				TargetKind: row.Scope, Target: row.Target, Outcome: audit.Accepted,
				Reason: fmt.Sprintf("automatic shift-back: the %s dwell elapsed; traffic weight %.2f -> %.2f", s.cfg.Dwell, row.Weight, next.Weight),
				Before: s.auditShift(row, "dwell", nil), After: s.auditShift(next, "dwell", nil),
			}); err != nil {
				return err
			}
		}
		return nil
	})
}

// Reload reads the active shifts if the newest revision moved since the
// last load, and then bumps Revision and signals Changed.
func (s *Service) Reload(ctx context.Context) error {
	s.reload.Lock()
	defer s.reload.Unlock()
	q := db.New(s.cfg.Pool)
	rev, err := q.ShiftRevision(ctx)
	if err != nil {
		return fmt.Errorf("read shift revision: %w", err)
	}
	s.mu.Lock()
	same := s.loaded && rev == s.rev
	s.mu.Unlock()
	if same {
		return nil
	}
	rows, err := q.ShiftListActive(ctx)
	if err != nil {
		return fmt.Errorf("list active shifts: %w", err)
	}
	ended, forged, err := s.replayed(ctx, q, rows)
	if err != nil {
		return fmt.Errorf("read the ends of active shifts: %w", err)
	}
	if forged > 0 {
		s.log.Error("records of shift ends in the audit log do not verify and are not believed: they were appended outside muster", "records", forged)
	}
	now := s.now()
	var applied []db.Shift
	var unsealed, replays []Unsealed
	s.mu.Lock()
	seen := map[string]Unsealed{}
	for _, u := range s.unsealed {
		seen[u.ID] = u
	}
	seenReplays := map[string]Unsealed{}
	for _, u := range s.replays {
		seenReplays[u.ID] = u
	}
	for _, r := range rows {
		if err := s.verify(r); err != nil {
			u := Unsealed{ID: r.ID.String(), Scope: r.Scope, Target: r.Target, Weight: r.Weight,
				Actor: r.StartedBy, Reason: err.Error(), Since: now}
			if old, ok := seen[u.ID]; ok {
				u.Since = old.Since
			} else {
				s.log.Error("a shift active by the table is not applied: its seal does not verify, so muster did not write it as it stands",
					"shift", r.ID, "scope", r.Scope, "target", r.Target, "weight", r.Weight, "claimed_actor", r.StartedBy, "reason", err)
			}
			unsealed = append(unsealed, u)
			continue
		}
		if end, ok := ended[r.ID]; ok {
			u := Unsealed{ID: r.ID.String(), Scope: r.Scope, Target: r.Target, Weight: r.Weight, Actor: r.StartedBy, Since: now,
				Reason: fmt.Sprintf("muster ended it (%s at %s, on record in the audit log)", end.State, end.EndedAt.Format(time.RFC3339))}
			if old, ok := seenReplays[u.ID]; ok {
				u.Since = old.Since
			} else {
				s.log.Error("a shift active by the table is not applied: muster ended it, so its row was written back outside muster",
					"shift", r.ID, "scope", r.Scope, "target", r.Target, "weight", r.Weight, "ended", end.State, "ended_at", end.EndedAt)
			}
			replays = append(replays, u)
			continue
		}
		applied = append(applied, r)
	}
	prev, held := s.active, s.held
	s.mu.Unlock()
	held, err = s.hold(ctx, q, prev, held, rows, applied, now)
	if err != nil {
		return err
	}
	for _, h := range held {
		applied = append(applied, h.Row)
		// A held shift whose row stands unverified is listed as held, not
		// as unsealed: it is applied, as muster last verified it.
		unsealed = slices.DeleteFunc(unsealed, func(u Unsealed) bool { return u.ID == h.Row.ID.String() })
	}
	s.mu.Lock()
	s.held = held
	s.rev, s.active, s.unsealed, s.replays, s.loaded = rev, applied, unsealed, replays, true
	s.loads++
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

// Revision counts the loads that found the active shifts (and so the
// traffic weights) changed. The publisher pulls: it compares Revision
// with the one it last assembled with, and re-assembles every service
// when it moved.
func (s *Service) Revision() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loads
}

// Changed receives a value after a load found the active shifts changed
// (one value may stand for several); it wakes the publisher.
func (s *Service) Changed() <-chan struct{} { return s.changed }

// Weights returns the traffic weights of the shifts loaded now: a zone's
// weight is the lowest of its own shift's and the region's. The function
// reads an immutable snapshot.
func (s *Service) Weights() assembler.TrafficWeights {
	s.mu.Lock()
	active := s.active
	s.mu.Unlock()
	if len(active) == 0 {
		return nil
	}
	zones := map[string]float64{}
	region := 1.0
	for _, r := range active {
		switch r.Scope {
		case ScopeZone:
			if w, ok := zones[r.Target]; !ok || r.Weight < w {
				zones[r.Target] = r.Weight
			}
		case ScopeRegion:
			if r.Target == s.cfg.Region {
				region = min(region, r.Weight)
			}
		}
	}
	return func(zone string) float64 {
		w, ok := zones[zone]
		if !ok {
			w = 1
		}
		return min(w, region)
	}
}

// Alarms returns a shiftback_pending alarm for each manual shift whose
// final confirmation has been pending longer than PendingAlarmAfter. Zone
// is the target zone (empty for a region shift); Service is empty, since a
// shift concerns every service of the target.
func (s *Service) Alarms() []assembler.Alarm {
	s.mu.Lock()
	active := s.active
	s.mu.Unlock()
	now := s.now()
	var out []assembler.Alarm
	for _, r := range active {
		if r.State != PendingConfirmation || r.PendingSince == nil {
			continue
		}
		due := r.PendingSince.Add(s.cfg.PendingAlarmAfter)
		if now.Before(due) {
			continue
		}
		al := assembler.Alarm{
			Kind: AlarmShiftbackPending, Since: due,
			Detail: fmt.Sprintf("the manual shift-back of %s %s (shift %s) has waited %s for its final confirmation at traffic weight %.2f; confirm it with POST /v1/shifts/%s/confirm",
				r.Scope, r.Target, r.ID, now.Sub(*r.PendingSince).Round(time.Second), r.Weight, r.ID),
		}
		if r.Scope == ScopeZone {
			al.Zone = r.Target
		}
		out = append(out, al)
	}
	out = append(out, s.unsealedAlarms()...)
	out = append(out, s.heldAlarms()...)
	slices.SortFunc(out, func(a, b assembler.Alarm) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Zone, b.Zone))
	})
	return out
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// canShift reports whether p may drain and return traffic: operators and
// admins, people or tools. Zones are shared, so it is not team-scoped.
// actorKind is the audit log's actor kind of p ("system" for muster
// itself).
func actorKind(p identity.Principal) string {
	if p.Kind == "" {
		return "system"
	}
	return string(p.Kind)
}

func canShift(p identity.Principal) bool {
	return (p.Kind == identity.KindOperator || p.Kind == identity.KindTool) && p.Role.AtLeast(identity.RoleOperator)
}

// shiftAudit is what the audit log records of a shift operation.
type shiftAudit struct {
	ShiftID string  `json:"shift_id,omitempty"`
	Scope   string  `json:"scope,omitempty"`
	Target  string  `json:"target,omitempty"`
	Reason  string  `json:"reason,omitempty"`
	Manual  *bool   `json:"manual,omitempty"`
	State   string  `json:"state,omitempty"`
	Weight  float64 `json:"traffic_weight"`
	Check   string  `json:"check"`
	Figures any     `json:"figures,omitempty"`
}

func (s *Service) auditShift(r db.Shift, check string, figures any) shiftAudit {
	m := r.Manual
	return shiftAudit{ShiftID: r.ID.String(), Scope: r.Scope, Target: r.Target, Reason: r.Reason, Manual: &m,
		State: r.State, Weight: r.Weight, Check: check, Figures: figures}
}

// write runs fn in one transaction and audits the outcome: an accepted
// change in the same transaction (fn returns its entry), a refusal in a
// transaction of its own. A not-found refusal is returned unaudited:
// there was nothing to act on.
//
// guard, when set, runs first in the transaction; when it fails nothing
// is written, not even the refusal (see Guarded).
func (s *Service) write(ctx context.Context, guard Guard, actor identity.Principal, action, targetKind, target string, asked shiftAudit,
	fn func(q *db.Queries, now time.Time) (db.Shift, audit.Entry, *refusal.Error, error)) (Shift, error) {
	now := s.now()
	var (
		row     db.Shift
		refused *refusal.Error
	)
	err := db.WithTx(ctx, s.cfg.Pool, func(q *db.Queries) error {
		var (
			e   audit.Entry
			err error
		)
		if guard != nil {
			if err := guard(ctx, q); err != nil {
				return fmt.Errorf("%s %s %s: %w", action, targetKind, target, err)
			}
		}
		row, e, refused, err = fn(q, now)
		if err != nil || refused != nil {
			return err
		}
		if row, err = s.sealRow(ctx, q, row); err != nil {
			return err
		}
		e.ActorKind, e.Actor, e.Action, e.Outcome = actorKind(actor), actor.String(), action, audit.Accepted
		_, err = audit.Append(ctx, q, now, e)
		return err
	})
	switch {
	case err != nil && db.IsUniqueViolation(err, "shifts_active_target_idx"):
		refused = &refusal.Error{Kind: registry.ErrConflict, Check: "conflict",
			Detail: fmt.Sprintf("%s %s already has an active shift; step it back or confirm it before starting another", targetKind, target)}
	case err != nil:
		return Shift{}, err
	case refused == nil:
		if err := s.Reload(ctx); err != nil {
			// The change is committed; the worker's next tick publishes it.
			s.log.Warn("reload shifts after a change", "err", err)
		}
		return s.view(row, now), nil
	case errors.Is(refused, registry.ErrNotFound):
		return Shift{}, refused
	}
	asked.Check, asked.Figures = refused.Check, auditFigures(refused.Figures)
	detail := refused.Detail
	if len(refused.Fields) > 0 {
		detail = fmt.Sprintf("%s (%s: %s)", detail, refused.Fields[0].Field, refused.Fields[0].Message)
	}
	if _, err := audit.AppendAlone(ctx, s.cfg.Pool, now, audit.Entry{
		ActorKind: actorKind(actor), Actor: actor.String(), Action: action,
		TargetKind: targetKind, Target: target, Outcome: audit.Refused, Reason: detail, After: asked,
	}); err != nil {
		return Shift{}, fmt.Errorf("audit refused %s: %w", action, err)
	}
	return Shift{}, refused
}

// Guard is a check run first in a move's transaction (Guarded).
type Guard func(ctx context.Context, q *db.Queries) error

// Guarded makes the Service's moves under a guard: a system actor acting
// as the owner of a key (the routing control) passes its tenure's fence
// (fence.Fence.Check), so a deposed owner's drain or step writes nothing,
// neither the move nor its audit row (accepted or refused), and returns
// the guard's error.
type Guarded struct {
	s     *Service
	guard Guard
}

// Guarded returns the moves of s made under guard.
func (s *Service) Guarded(guard Guard) Guarded { return Guarded{s: s, guard: guard} }

// Drain is Service.Drain under the guard.
func (g Guarded) Drain(ctx context.Context, actor identity.Principal, req Request) (Shift, error) {
	return g.s.drain(ctx, g.guard, actor, req)
}

// StepBack is Service.StepBack under the guard.
func (g Guarded) StepBack(ctx context.Context, actor identity.Principal, id uuid.UUID) (Shift, error) {
	return g.s.stepBack(ctx, g.guard, actor, id)
}

// Redrain is Service.Redrain under the guard.
func (g Guarded) Redrain(ctx context.Context, actor identity.Principal, id uuid.UUID, reason string) (Shift, error) {
	return g.s.redrain(ctx, g.guard, actor, id, reason)
}

// Drain starts a shift: the target's traffic weight goes to 0 in the next
// views.
func (s *Service) Drain(ctx context.Context, actor identity.Principal, req Request) (Shift, error) {
	return s.drain(ctx, nil, actor, req)
}

func (s *Service) drain(ctx context.Context, guard Guard, actor identity.Principal, req Request) (Shift, error) {
	req.Reason = strings.TrimSpace(req.Reason)
	kind := req.Scope
	if kind != ScopeRegion {
		kind = ScopeZone // refusals of a bad scope are filed under zone
	}
	asked := shiftAudit{Scope: req.Scope, Target: req.Target, Reason: req.Reason, Manual: req.Manual}
	return s.write(ctx, guard, actor, "shift.start", kind, req.Target, asked, func(q *db.Queries, now time.Time) (db.Shift, audit.Entry, *refusal.Error, error) {
		if !canShift(actor) {
			return db.Shift{}, audit.Entry{}, &refusal.Error{Kind: registry.ErrForbidden, Check: "authorisation",
				Detail: fmt.Sprintf("%s may not shift traffic: draining a zone takes the operator or admin role", actor)}, nil
		}
		if fe := s.validate(req); len(fe) > 0 {
			return db.Shift{}, audit.Entry{}, &refusal.Error{Kind: registry.ErrInvalid, Check: "validation", Detail: "the shift is not valid", Fields: fe}, nil
		}
		if req.Scope == ScopeRegion && !actor.IsAdmin() {
			return db.Shift{}, audit.Entry{}, &refusal.Error{Kind: registry.ErrForbidden, Check: "authorisation",
				Detail: fmt.Sprintf("draining the whole region %s sends its traffic to other regions and skips the in-region budget check, so it takes the admin role; %s is not an admin", req.Target, actor)}, nil
		}
		all, err := q.ShiftListActive(ctx)
		if err != nil {
			return db.Shift{}, audit.Entry{}, nil, fmt.Errorf("list active shifts: %w", err)
		}
		// A shift written outside muster drains nothing, so the budget
		// does not count it (it does still hold the target's place in
		// shifts_active_target_idx: the insert answers conflict).
		active := s.sealedOnly(all)
		for _, r := range active {
			if r.Scope == req.Scope && r.Target == req.Target {
				return db.Shift{}, audit.Entry{}, &refusal.Error{Kind: registry.ErrConflict, Check: "conflict",
					Detail:  fmt.Sprintf("%s %s already has an active shift %s (%s, traffic weight %.2f); step it back or confirm it before starting another", r.Scope, r.Target, r.ID, r.State, r.Weight),
					Figures: map[string]any{"active_shift": r.ID.String()}}, nil
			}
		}
		note := "budget: skipped for a region drain (admin only; the traffic leaves the region)"
		var figures any
		if req.Scope == ScopeRegion && s.cfg.Fallback != nil {
			regions, why := s.cfg.Fallback()
			if len(regions) == 0 {
				return db.Shift{}, audit.Entry{}, &refusal.Error{Kind: registry.ErrConflict, Check: "no_fallback_region",
					Detail: fmt.Sprintf("no region can take region %s's traffic, so draining it would move nothing: %s", req.Target, why)}, nil
			}
			note += "; its clients move to regions " + strings.Join(regions, ", ")
			figures = map[string]any{"fallback_regions": regions}
		}
		if req.Scope == ScopeZone {
			res, serr, err := s.budget(ctx, q, req.Target, active)
			if err != nil || serr != nil {
				return db.Shift{}, audit.Entry{}, serr, err
			}
			figures = res
			note = fmt.Sprintf("budget: ok for %d services with instances in %s", len(res), req.Target)
		}
		id, err := uuid.NewV7()
		if err != nil {
			return db.Shift{}, audit.Entry{}, nil, fmt.Errorf("new shift id: %w", err)
		}
		row, err := q.ShiftInsert(ctx, db.ShiftInsertParams{
			ID: id, Scope: req.Scope, Target: req.Target, Reason: req.Reason, Manual: *req.Manual,
			Actor: actor.String(), Now: now,
		})
		if err != nil {
			return db.Shift{}, audit.Entry{}, nil, fmt.Errorf("insert shift: %w", err)
		}
		return row, audit.Entry{TargetKind: row.Scope, Target: row.Target, Reason: note,
			After: s.auditShift(row, "budget", figures)}, nil, nil
	})
}

func (s *Service) validate(req Request) []registry.FieldError {
	var fe []registry.FieldError
	switch req.Scope {
	case ScopeZone:
		if !registry.ValidName(req.Target) {
			fe = append(fe, registry.FieldError{Field: "target", Message: fmt.Sprintf("must be a zone name (a DNS label such as az1), got %q", req.Target)})
		}
	case ScopeRegion:
		if req.Target != s.cfg.Region {
			fe = append(fe, registry.FieldError{Field: "target", Message: fmt.Sprintf("this muster is the authority for region %s only, got %q", s.cfg.Region, req.Target)})
		}
	default:
		fe = append(fe, registry.FieldError{Field: "scope", Message: fmt.Sprintf(`must be "zone" or "region", got %q`, req.Scope)})
	}
	if n := len([]rune(req.Reason)); n < MinReason || n > MaxReason {
		fe = append(fe, registry.FieldError{Field: "reason", Message: fmt.Sprintf("must say why in %d to %d characters, got %d", MinReason, MaxReason, n)})
	}
	if req.Manual == nil {
		fe = append(fe, registry.FieldError{Field: "manual", Message: "is required: true when a person declared the failover (the final step back then needs confirmation), false when it was automatic"})
	}
	return fe
}

// auditFigures is a refusal's figures as the audit log has always
// recorded them: a budget refusal's list of services as that list.
func auditFigures(f map[string]any) any {
	if s, ok := f[figureServices]; ok && len(f) == 1 {
		return s
	}
	if len(f) == 0 {
		return nil
	}
	return f
}

// BudgetFigure is one service's numbers in a drain's budget check.
type BudgetFigure struct {
	Service            string  `json:"service"`
	InRotationOutside  int     `json:"in_rotation_outside"`
	Total              int     `json:"total"`
	Required           int     `json:"required"`
	MinHealthyFraction float64 `json:"min_healthy_fraction"`
}

// budget checks a drain of zone against every service with live instances
// there. Zones already drained to 0 by another zone shift count as gone.
func (s *Service) budget(ctx context.Context, q *db.Queries, zone string, active []db.Shift) ([]BudgetFigure, *refusal.Error, error) {
	services, err := registry.ServicesInZone(ctx, q, zone)
	if err != nil {
		return nil, nil, err
	}
	drained := map[string]bool{zone: true}
	for _, r := range active {
		if r.Scope == ScopeZone && r.Weight == 0 {
			drained[r.Target] = true
		}
	}
	figures := []BudgetFigure{}
	var short []BudgetFigure
	for _, svc := range services {
		snap, ok := s.cfg.Verdicts.Snapshot(svc)
		if !ok {
			// No verdicts to count: refuse rather than guess.
			return nil, nil, fmt.Errorf("budget check for %s: %w", svc, evaluator.ErrNotReady)
		}
		c := DrainCapacity(snap, drained)
		frac := assembler.NormFraction(snap.MinHealthyFraction)
		f := BudgetFigure{Service: svc, Total: c.Counted, InRotationOutside: c.Routable, Required: c.Required(frac), MinHealthyFraction: frac}
		figures = append(figures, f)
		if c.Tripped(frac) {
			short = append(short, f)
		}
	}
	if len(short) == 0 {
		return figures, nil, nil
	}
	var parts []string
	for _, f := range short {
		parts = append(parts, fmt.Sprintf("%s would keep %d of %d instances in rotation outside the drained zones; its minimum healthy fraction %g needs %d",
			f.Service, f.InRotationOutside, f.Total, f.MinHealthyFraction, f.Required))
	}
	return nil, &refusal.Error{Kind: ErrBudget, Check: "budget", Figures: map[string]any{figureServices: short},
		Detail: fmt.Sprintf("draining zone %s would take %d service(s) below their minimum in the region: %s", zone, len(short), strings.Join(parts, "; "))}, nil
}

// DrainCapacity is a service's region-wide capacity once the drained
// zones serve nothing, counted by the guard's own rule
// (assembler.Capacity on the evaluator's snapshot, the assembler's input): an instance in
// a drained zone is counted as the guard counts one forced out (it stays
// capacity if it ever served, but is not routable). The drain is refused
// when the guard, looking at the region as one zone, would trip on it.
func DrainCapacity(snap assembler.ServiceInput, drained map[string]bool) assembler.Capacity {
	var c assembler.Capacity
	out := &assembler.Override{Action: assembler.OverrideIneligible}
	for _, v := range snap.Instances {
		x := v
		if drained[v.Zone] {
			x.Override = out
		}
		c.Add(&x)
	}
	return c
}

// nextWeight is the step after w: the first configured weight above it.
func (s *Service) nextWeight(w float64) float64 {
	for _, step := range s.cfg.Steps {
		if step > w+1e-9 {
			return step
		}
	}
	return 1
}

// move takes row one step back at now. The caller has checked the state
// and the dwell.
func (s *Service) move(ctx context.Context, q *db.Queries, row db.Shift, by string, now time.Time) (db.Shift, error) {
	p := db.ShiftUpdateParams{
		ID: row.ID, State: Returning, Step: row.Step + 1, Weight: s.nextWeight(row.Weight),
		LastStepAt: now, LastStepBy: by, PendingSince: row.PendingSince, ConfirmedBy: row.ConfirmedBy,
		ConfirmedAt: row.ConfirmedAt, EndedAt: row.EndedAt, Now: now,
	}
	switch {
	case p.Weight >= 1:
		p.State, p.EndedAt = Completed, &now
	case row.Manual && s.nextWeight(p.Weight) >= 1:
		p.State, p.PendingSince = PendingConfirmation, &now
	}
	next, err := q.ShiftUpdate(ctx, p)
	if err != nil {
		return db.Shift{}, fmt.Errorf("step shift %s: %w", row.ID, err)
	}
	return next, nil
}

// lockForMove reads the shift for update and runs the checks common to a
// step and a confirmation: it exists, the actor may shift, it is active,
// and the dwell has elapsed.
func (s *Service) lockForMove(ctx context.Context, q *db.Queries, actor identity.Principal, id uuid.UUID, now time.Time) (db.Shift, *refusal.Error, error) {
	row, err := q.ShiftGetForUpdate(ctx, id)
	h, held := s.heldRow(id)
	gone := held && errors.Is(err, pgx.ErrNoRows) // deleted outside muster while applied
	if gone {
		row, err = h.Row, nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return db.Shift{}, &refusal.Error{Kind: registry.ErrNotFound, Check: "exists", Detail: fmt.Sprintf("no shift %s", id)}, nil
	}
	if err != nil {
		return db.Shift{}, nil, fmt.Errorf("read shift %s: %w", id, err)
	}
	if !canShift(actor) {
		return row, &refusal.Error{Kind: registry.ErrForbidden, Check: "authorisation",
			Detail: fmt.Sprintf("%s may not shift traffic: returning traffic to %s %s takes the operator or admin role", actor, row.Scope, row.Target)}, nil
	}
	if held && (gone || s.verify(row) != nil) {
		// muster applies its own last verified copy of this shift: write
		// that back, and move it from there.
		if row, err = restore(ctx, q, h); err != nil {
			return db.Shift{}, nil, err
		}
	}
	if row.State == Completed || row.State == Cancelled {
		return row, &refusal.Error{Kind: registry.ErrConflict, Check: "state",
			Detail: fmt.Sprintf("shift %s of %s %s is %s; there is nothing left to return", id, row.Scope, row.Target, row.State)}, nil
	}
	if err := s.verify(row); err != nil {
		// Stepping it would seal a row muster never wrote.
		return row, &refusal.Error{Kind: registry.ErrConflict, Check: "seal",
			Detail: fmt.Sprintf("shift %s of %s %s is not applied: %s; the shifts table was written outside muster (alarm %s), so muster will not move it", id, row.Scope, row.Target, err, AlarmShiftUnsealed)}, nil
	}
	if allowed := row.LastStepAt.Add(s.cfg.Dwell); now.Before(allowed) {
		wait := allowed.Sub(now)
		return row, &refusal.Error{Kind: ErrDwell, Check: "dwell", RetryAfter: wait,
			Figures: map[string]any{"last_step_at": row.LastStepAt, "dwell_seconds": s.cfg.Dwell.Seconds(), "next_step_at": allowed, "traffic_weight": row.Weight},
			Detail: fmt.Sprintf("%s %s moved to traffic weight %.2f at %s; the minimum dwell between steps is %s, so the next step is allowed at %s (in %s)",
				row.Scope, row.Target, row.Weight, row.LastStepAt.Format(time.RFC3339), s.cfg.Dwell, allowed.Format(time.RFC3339), wait.Round(time.Second))}, nil
	}
	return row, nil, nil
}

// target names the audit target of a shift operation on id before the row
// is read: the shift's own scope and target when it exists.
func (s *Service) target(ctx context.Context, id uuid.UUID) (string, string) {
	row, err := db.New(s.cfg.Pool).ShiftGet(ctx, id)
	if err != nil {
		return "shift", id.String()
	}
	return row.Scope, row.Target
}

// StepBack moves the shift to its next traffic weight. The final step of a
// manual shift is refused: it needs Confirm.
func (s *Service) StepBack(ctx context.Context, actor identity.Principal, id uuid.UUID) (Shift, error) {
	return s.stepBack(ctx, nil, actor, id)
}

func (s *Service) stepBack(ctx context.Context, guard Guard, actor identity.Principal, id uuid.UUID) (Shift, error) {
	kind, target := s.target(ctx, id)
	return s.write(ctx, guard, actor, "shift.step", kind, target, shiftAudit{ShiftID: id.String()}, func(q *db.Queries, now time.Time) (db.Shift, audit.Entry, *refusal.Error, error) {
		row, serr, err := s.lockForMove(ctx, q, actor, id, now)
		if err != nil || serr != nil {
			return db.Shift{}, audit.Entry{}, serr, err
		}
		if next := s.nextWeight(row.Weight); row.Manual && next >= 1 {
			return db.Shift{}, audit.Entry{}, &refusal.Error{Kind: ErrNeedsConfirm, Check: "confirmation",
				Figures: map[string]any{"traffic_weight": row.Weight, "next_weight": next},
				Detail: fmt.Sprintf("%s %s was failed over manually, so the final step back to traffic weight %.2f needs an operator's confirmation: POST /v1/shifts/%s/confirm",
					row.Scope, row.Target, next, row.ID)}, nil
		}
		next, err := s.move(ctx, q, row, actor.String(), now)
		if err != nil {
			return db.Shift{}, audit.Entry{}, nil, err
		}
		return next, audit.Entry{TargetKind: row.Scope, Target: row.Target,
			Reason: fmt.Sprintf("traffic weight %.2f -> %.2f after a dwell of %s", row.Weight, next.Weight, now.Sub(row.LastStepAt).Round(time.Second)),
			Before: s.auditShift(row, "dwell", nil), After: s.auditShift(next, "dwell", nil)}, nil, nil
	})
}

// Redrain sets a region shift whose traffic is returning back to traffic
// weight 0 (draining, step 0): the region failed again during the return
// (the routing control turned it off again). Draining is the emergency
// move and waits for nothing: no dwell. It takes the admin role and a
// region to fall back to, as the drain did. The steps back start over,
// each after its dwell. A zone shift is refused: draining it again skips
// the budget, so it takes a new drain.
func (s *Service) Redrain(ctx context.Context, actor identity.Principal, id uuid.UUID, reason string) (Shift, error) {
	return s.redrain(ctx, nil, actor, id, reason)
}

func (s *Service) redrain(ctx context.Context, guard Guard, actor identity.Principal, id uuid.UUID, reason string) (Shift, error) {
	kind, target := s.target(ctx, id)
	reason = strings.TrimSpace(reason)
	return s.write(ctx, guard, actor, "shift.redrain", kind, target, shiftAudit{ShiftID: id.String(), Reason: reason}, func(q *db.Queries, now time.Time) (db.Shift, audit.Entry, *refusal.Error, error) {
		row, serr, err := s.lockForMove(ctx, q, actor, id, now)
		if err != nil {
			return db.Shift{}, audit.Entry{}, nil, err
		}
		if serr != nil && !errors.Is(serr, ErrDwell) {
			return db.Shift{}, audit.Entry{}, serr, nil
		}
		// A zone drained again would skip the budget its drain was checked
		// against; a region drain has none (its traffic leaves the region).
		if row.Scope != ScopeRegion {
			return db.Shift{}, audit.Entry{}, &refusal.Error{Kind: registry.ErrConflict, Check: "state",
				Detail: fmt.Sprintf("shift %s drains zone %s: a zone is drained again with a new drain, budget-checked (step this one back or confirm it first)", id, row.Target)}, nil
		}
		if !actor.IsAdmin() {
			return db.Shift{}, audit.Entry{}, &refusal.Error{Kind: registry.ErrForbidden, Check: "authorisation",
				Detail: fmt.Sprintf("draining the whole region %s takes the admin role; %s is not an admin", row.Target, actor)}, nil
		}
		if row.State == Draining {
			return db.Shift{}, audit.Entry{}, &refusal.Error{Kind: registry.ErrConflict, Check: "state",
				Detail: fmt.Sprintf("shift %s of %s %s is draining already (traffic weight %.2f)", id, row.Scope, row.Target, row.Weight)}, nil
		}
		if row.Scope == ScopeRegion && s.cfg.Fallback != nil {
			if regions, why := s.cfg.Fallback(); len(regions) == 0 {
				return db.Shift{}, audit.Entry{}, &refusal.Error{Kind: registry.ErrConflict, Check: "no_fallback_region",
					Detail: fmt.Sprintf("no region can take region %s's traffic, so draining it again would move nothing: %s", row.Target, why)}, nil
			}
		}
		by := actor.String()
		next, err := q.ShiftUpdate(ctx, db.ShiftUpdateParams{ID: row.ID, State: Draining, Step: 0, Weight: 0,
			LastStepAt: now, LastStepBy: by, Now: now})
		if err != nil {
			return db.Shift{}, audit.Entry{}, nil, fmt.Errorf("redrain shift %s: %w", id, err)
		}
		return next, audit.Entry{TargetKind: row.Scope, Target: row.Target,
			Reason: fmt.Sprintf("drained again from traffic weight %.2f: %s", row.Weight, reason),
			Before: s.auditShift(row, "redrain", nil), After: s.auditShift(next, "redrain", nil)}, nil, nil
	})
}

// Confirm takes the final step of a manual shift (to traffic weight 1) and
// completes it.
func (s *Service) Confirm(ctx context.Context, actor identity.Principal, id uuid.UUID) (Shift, error) {
	kind, target := s.target(ctx, id)
	return s.write(ctx, nil, actor, "shift.confirm", kind, target, shiftAudit{ShiftID: id.String()}, func(q *db.Queries, now time.Time) (db.Shift, audit.Entry, *refusal.Error, error) {
		row, serr, err := s.lockForMove(ctx, q, actor, id, now)
		if err != nil || serr != nil {
			return db.Shift{}, audit.Entry{}, serr, err
		}
		if !row.Manual || s.nextWeight(row.Weight) < 1 {
			why := "it was an automatic failover, whose steps complete on their own timer"
			if row.Manual {
				why = fmt.Sprintf("it is at traffic weight %.2f; step it back to %.2f first", row.Weight, s.cfg.Steps[max(0, len(s.cfg.Steps)-2)])
			}
			return db.Shift{}, audit.Entry{}, &refusal.Error{Kind: registry.ErrConflict, Check: "state",
				Detail: fmt.Sprintf("shift %s of %s %s is not waiting for confirmation: %s", id, row.Scope, row.Target, why)}, nil
		}
		by := actor.String()
		next, err := s.move(ctx, q, row, by, now)
		if err != nil {
			return db.Shift{}, audit.Entry{}, nil, err
		}
		p := db.ShiftUpdateParams{ID: next.ID, State: next.State, Step: next.Step, Weight: next.Weight,
			LastStepAt: next.LastStepAt, LastStepBy: next.LastStepBy, PendingSince: next.PendingSince,
			ConfirmedBy: &by, ConfirmedAt: &now, EndedAt: next.EndedAt, Now: now}
		if next, err = q.ShiftUpdate(ctx, p); err != nil {
			return db.Shift{}, audit.Entry{}, nil, fmt.Errorf("confirm shift %s: %w", id, err)
		}
		reason := fmt.Sprintf("final step confirmed: traffic weight %.2f -> %.2f", row.Weight, next.Weight)
		if row.PendingSince != nil {
			reason += fmt.Sprintf(" after %s pending", now.Sub(*row.PendingSince).Round(time.Second))
		}
		return next, audit.Entry{TargetKind: row.Scope, Target: row.Target, Reason: reason,
			Before: s.auditShift(row, "confirmation", nil), After: s.auditShift(next, "confirmation", nil)}, nil, nil
	})
}

// Get returns one shift.
func (s *Service) Get(ctx context.Context, actor identity.Principal, id uuid.UUID) (Shift, error) {
	if !registry.CanReadEstate(actor) {
		return Shift{}, &refusal.Error{Kind: registry.ErrForbidden, Check: "authorisation", Detail: "shifts are read by operator and tool identities"}
	}
	row, err := db.New(s.cfg.Pool).ShiftGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Shift{}, &refusal.Error{Kind: registry.ErrNotFound, Check: "exists", Detail: fmt.Sprintf("no shift %s", id)}
	}
	if err != nil {
		return Shift{}, fmt.Errorf("read shift %s: %w", id, err)
	}
	return s.view(row, s.now()), nil
}

// List returns shifts in creation order, optionally of one state.
func (s *Service) List(ctx context.Context, actor identity.Principal, f Filter) ([]Shift, error) {
	if !registry.CanReadEstate(actor) {
		return nil, &refusal.Error{Kind: registry.ErrForbidden, Check: "authorisation", Detail: "shifts are read by operator and tool identities"}
	}
	var state *string
	switch f.State {
	case "":
	case Draining, Returning, PendingConfirmation, Completed, Cancelled:
		state = &f.State
	default:
		return nil, &refusal.Error{Kind: registry.ErrInvalid, Check: "validation", Detail: "unknown shift state",
			Fields: []registry.FieldError{{Field: "state", Message: fmt.Sprintf("must be one of draining, returning, pending_confirmation, completed, cancelled; got %q", f.State)}}}
	}
	n := f.Limit
	switch {
	case n <= 0:
		n = registry.DefaultPageSize
	case n > registry.MaxPageSize:
		n = registry.MaxPageSize
	}
	rows, err := db.New(s.cfg.Pool).ShiftList(ctx, db.ShiftListParams{After: f.After, State: state, Lim: int32(n)})
	if err != nil {
		return nil, fmt.Errorf("list shifts: %w", err)
	}
	now := s.now()
	out := make([]Shift, len(rows))
	for i, r := range rows {
		out[i] = s.view(r, now)
	}
	return out, nil
}

// view converts a row for the API, with the next move and the pending age
// as of now.
func (s *Service) view(r db.Shift, now time.Time) Shift {
	out := Shift{
		ID: r.ID, Scope: r.Scope, Target: r.Target, Reason: r.Reason, Manual: r.Manual, State: r.State,
		Step: int(r.Step), TrafficWeight: r.Weight, StartedBy: r.StartedBy, StartedAt: r.StartedAt,
		LastStepBy: r.LastStepBy, LastStepAt: r.LastStepAt, PendingSince: r.PendingSince,
		ConfirmedBy: r.ConfirmedBy, ConfirmedAt: r.ConfirmedAt, EndedAt: r.EndedAt,
	}
	switch r.State {
	case Draining, Returning, PendingConfirmation:
		next, at := s.nextWeight(r.Weight), r.LastStepAt.Add(s.cfg.Dwell)
		out.NextWeight, out.NextStepAt = &next, &at
	}
	if r.State == PendingConfirmation && r.PendingSince != nil {
		age := now.Sub(*r.PendingSince).Seconds()
		out.PendingSeconds = &age
	}
	return out
}
