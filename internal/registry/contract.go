package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
)

// Authority is how much a degraded dependency named in a self-report may do
// to the reporting instance (ADR-06).
type Authority string

// Authorities.
const (
	AuthorityInformational Authority = "informational" // recorded, changes nothing
	AuthorityWeight        Authority = "weight"        // lowers the instance's weight (default)
	AuthorityUnready       Authority = "unready"       // makes the instance ineligible; never for shared dependencies
)

// Dependency is one dependency a service's self-reports may name.
type Dependency struct {
	Name string `json:"name"`
	// Shared dependencies (a database every replica uses, say) fail for all
	// instances at once; letting them mark instances unready would drain
	// the whole service, so they may not have unready authority.
	Shared    bool      `json:"shared"`
	Authority Authority `json:"authority"`
}

// Contract is a service's health contract: how its evidence is turned into
// eligibility. Durations are in seconds.
type Contract struct {
	IntervalSeconds float64 `json:"interval_seconds"`
	HalfLifeSeconds float64 `json:"half_life_seconds"`
	// RemovalThreshold is the decayed failure rate at or above which an
	// instance leaves rotation; ReentryThreshold the rate it must fall
	// below (strictly lower) to come back, after MinDwellSeconds.
	RemovalThreshold   float64 `json:"removal_threshold"`
	ReentryThreshold   float64 `json:"reentry_threshold"`
	MinDwellSeconds    float64 `json:"min_dwell_seconds"`
	MinHealthyFraction float64 `json:"min_healthy_fraction"`
	SlowStartSeconds   float64 `json:"slow_start_seconds"`
	// Weights per evidence class (probe, self, passive) used in fusion.
	// Omitted: 1 for each class the service's capabilities include.
	Weights map[Capability]float64 `json:"weights"`
	// PassivePrimaryRPS is the caller traffic above which passive outcomes
	// become the primary evidence and probing drops to confirmation.
	PassivePrimaryRPS float64 `json:"passive_primary_rps"`
	// MinPassiveReporters is how many distinct callers must report an
	// instance failing before passive evidence may remove it on its own
	// (or lead as primary): one caller's bad day is not the service's
	// (ADR-04). 0 in a contract stored before the field existed reads as
	// the default.
	MinPassiveReporters int `json:"min_passive_reporters"`
	// RequireReadiness gates entry into rotation on a readiness signal.
	RequireReadiness bool         `json:"require_readiness"`
	Dependencies     []Dependency `json:"dependencies"`
}

// Platform defaults and floors. A contract may tighten these but not loosen
// them past the floors: a failing instance must always be removed quickly,
// and the guard may never be turned off.
const (
	DefaultIntervalSeconds     = 5
	DefaultHalfLifeSeconds     = 4
	DefaultRemovalThreshold    = 0.5
	DefaultReentryThreshold    = 0.2
	DefaultMinDwellSeconds     = 30
	DefaultMinHealthyFraction  = 0.5
	DefaultSlowStartSeconds    = 60
	DefaultPassivePrimaryRPS   = 5
	DefaultMinPassiveReporters = 2

	// MaxSoftDetectionSeconds bounds how long a genuine soft failure (every
	// sample failing) may take to cross the removal threshold:
	// half_life × log2(1 / (1 − removal_threshold)). The defaults give 4 s.
	MaxSoftDetectionSeconds = 10
	MaxDependencies         = 64
)

// DefaultContract returns the platform defaults. Weights are left empty and
// filled from the service's capabilities when the contract is stored.
func DefaultContract() Contract {
	return Contract{
		IntervalSeconds:     DefaultIntervalSeconds,
		HalfLifeSeconds:     DefaultHalfLifeSeconds,
		RemovalThreshold:    DefaultRemovalThreshold,
		ReentryThreshold:    DefaultReentryThreshold,
		MinDwellSeconds:     DefaultMinDwellSeconds,
		MinHealthyFraction:  DefaultMinHealthyFraction,
		SlowStartSeconds:    DefaultSlowStartSeconds,
		PassivePrimaryRPS:   DefaultPassivePrimaryRPS,
		MinPassiveReporters: DefaultMinPassiveReporters,
		Dependencies:        []Dependency{},
	}
}

// SoftDetectionSeconds is the time a run of failing samples takes to cross
// the removal threshold from a clean start.
func (c Contract) SoftDetectionSeconds() float64 {
	return c.HalfLifeSeconds * math.Log2(1/(1-c.RemovalThreshold))
}

// normalize fills defaults that depend on the service.
func (c *Contract) normalize(s Service) {
	if c.Weights == nil {
		c.Weights = map[Capability]float64{}
		for _, cl := range []Capability{CapProbe, CapSelf, CapPassive} {
			if s.Has(cl) {
				c.Weights[cl] = 1
			}
		}
	}
	if c.Dependencies == nil {
		c.Dependencies = []Dependency{}
	}
	for i := range c.Dependencies {
		if c.Dependencies[i].Authority == "" {
			c.Dependencies[i].Authority = AuthorityWeight
		}
	}
}

// ValidateContract checks c against the platform floors and against what
// service s can supply (ADR-06, 07, 16). It returns one FieldError per
// problem, named by JSON path.
func ValidateContract(c Contract, s Service) []FieldError {
	var fe []FieldError
	add := func(field, format string, args ...any) {
		fe = append(fe, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	between := func(field string, v, lo, hi float64, unit string) bool {
		if v < lo || v > hi || math.IsNaN(v) {
			add(field, "must be between %g and %g%s, got %g", lo, hi, unit, v)
			return false
		}
		return true
	}
	between("interval_seconds", c.IntervalSeconds, 1, 30, " s")
	hl := between("half_life_seconds", c.HalfLifeSeconds, 0.5, 30, " s")
	rm := true
	if !(c.RemovalThreshold > 0 && c.RemovalThreshold < 1) {
		add("removal_threshold", "must be a failure rate above 0 and below 1, got %g", c.RemovalThreshold)
		rm = false
	}
	if !(c.ReentryThreshold >= 0 && c.ReentryThreshold < c.RemovalThreshold) {
		add("reentry_threshold", "must be at least 0 and strictly below removal_threshold (%g) so an instance does not flap across one line, got %g", c.RemovalThreshold, c.ReentryThreshold)
	}
	if hl && rm {
		if d := c.SoftDetectionSeconds(); d > MaxSoftDetectionSeconds {
			add("half_life_seconds", "with removal_threshold %g and half_life_seconds %g a failing instance is removed after %.1f s; the platform allows at most %d s", c.RemovalThreshold, c.HalfLifeSeconds, d, MaxSoftDetectionSeconds)
		}
	}
	between("min_dwell_seconds", c.MinDwellSeconds, 5, 600, " s")
	if !(c.MinHealthyFraction > 0 && c.MinHealthyFraction <= 1) {
		add("min_healthy_fraction", "must be above 0 and at most 1 (0 would turn the guard off), got %g", c.MinHealthyFraction)
	}
	between("slow_start_seconds", c.SlowStartSeconds, 0, 600, " s")
	between("passive_primary_rps", c.PassivePrimaryRPS, 0, 1e6, " requests/s")
	if c.MinPassiveReporters < 1 || c.MinPassiveReporters > 8 {
		add("min_passive_reporters", "must be 1 to 8 distinct callers (muster keeps the 8 most recent reporters of an instance), got %d", c.MinPassiveReporters)
	}

	positive := 0
	for _, cl := range slices.Sorted(maps.Keys(c.Weights)) {
		w := c.Weights[cl]
		if w > 0 && s.Has(cl) {
			positive++
		}
		field := "weights." + string(cl)
		switch {
		case cl != CapProbe && cl != CapSelf && cl != CapPassive:
			add(field, "unknown evidence class %q: want probe, self or passive", cl)
		case w < 0 || w > 10 || math.IsNaN(w):
			add(field, "must be between 0 and 10, got %g", w)
		case w > 0 && !s.Has(cl):
			add(field, "service %s does not declare the %s capability, so it can supply no %s evidence", s.Name, cl, cl)
		}
	}
	if positive == 0 && (s.Has(CapProbe) || s.Has(CapSelf) || s.Has(CapPassive)) {
		add("weights", "give at least one evidence class service %s supplies a positive weight; with none, every instance would stay unknown forever", s.Name)
	}
	if c.RequireReadiness && !s.Has(CapReadiness) {
		add("require_readiness", "service %s does not declare the readiness capability; a service without a readiness signal enters rotation with health unknown (ADR-16)", s.Name)
	}

	if len(c.Dependencies) > MaxDependencies {
		add("dependencies", "at most %d dependencies, got %d", MaxDependencies, len(c.Dependencies))
	}
	if len(c.Dependencies) > 0 && !s.Has(CapSelf) {
		add("dependencies", "dependencies are named in self-reports and service %s does not declare the self capability", s.Name)
	}
	seen := map[string]bool{}
	for i, d := range c.Dependencies {
		p := fmt.Sprintf("dependencies[%d]", i)
		if !ValidName(d.Name) {
			add(p+".name", "must be a DNS label, got %q", d.Name)
		} else if seen[d.Name] {
			add(p+".name", "dependency %q listed twice", d.Name)
		}
		seen[d.Name] = true
		switch d.Authority {
		case AuthorityInformational, AuthorityWeight:
		case AuthorityUnready:
			if d.Shared {
				add(p+".authority", "a shared dependency may not have unready authority: its failure would make every instance unready at once and drain the service (ADR-06); use weight or informational")
			}
		default:
			add(p+".authority", "must be informational, weight or unready, got %q", d.Authority)
		}
	}
	return fe
}

// StoredContract is a contract with its version and authorship.
type StoredContract struct {
	Service   string    `json:"service"`
	Version   int64     `json:"version"` // 0: never set, platform defaults apply
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	UpdatedBy string    `json:"updated_by,omitempty"`
	Contract  Contract  `json:"contract"`
}

// GetContract returns the service's contract, or the platform defaults with
// version 0 when none was ever set.
func (r *Registry) GetContract(ctx context.Context, actor identity.Principal, service string) (StoredContract, error) {
	svc, err := r.GetService(ctx, actor, service)
	if err != nil {
		return StoredContract{}, err
	}
	c, err := r.contract(ctx, db.New(r.cfg.Pool), service)
	if isNotFound(err) {
		d := DefaultContract()
		d.normalize(svc)
		return StoredContract{Service: service, Contract: d}, nil
	}
	return c, err
}

// PutContract replaces the service's contract after validating it. Fields
// the caller left at their DefaultContract values keep the defaults.
// ifVersion, when non-negative, must equal the stored version (0: none yet),
// or the write is refused with ErrPrecondition, so two editors cannot overwrite
// each other unseen.
func (r *Registry) PutContract(ctx context.Context, actor identity.Principal, service string, c Contract, ifVersion int64) (StoredContract, error) {
	const action = "contract.put"
	var out StoredContract
	err := r.write(ctx, actor, action, "service", service, c, func(q *db.Queries) (*refusal.Error, error) {
		row, err := q.ServiceGetForUpdate(ctx, service)
		if notFound(err) {
			return newRefusal(ErrNotFound, "no service named %s", service), nil
		}
		if err != nil {
			return nil, fmt.Errorf("read service %s: %w", service, err)
		}
		svc := r.service(row)
		if rf := contractEditable(actor, svc, &c, "editing"); rf != nil {
			return rf, nil
		}
		before, err := r.contract(ctx, q, service)
		if err != nil && !isNotFound(err) {
			return nil, err
		}
		if ifVersion >= 0 && before.Version != ifVersion {
			return newRefusal(ErrPrecondition, "the contract of %s is at version %d, not %d: someone changed it since you read it", service, before.Version, ifVersion), nil
		}
		doc, err := json.Marshal(c)
		if err != nil {
			return nil, fmt.Errorf("encode contract: %w", err)
		}
		now := r.now()
		stored, err := q.ContractUpsert(ctx, db.ContractUpsertParams{Service: service, Document: doc, Now: now, UpdatedBy: actor.String()})
		if err != nil {
			return nil, fmt.Errorf("write contract of %s: %w", service, err)
		}
		if stored, err = sealContract(ctx, q, r.cfg.Sealer, stored); err != nil {
			return nil, err
		}
		out, err = contractFromRow(stored)
		if err != nil {
			return nil, err
		}
		var prev any
		if before.Version > 0 {
			prev = before
		}
		_, err = audit.Append(ctx, q, now, accepted(actor, action, "service", service, prev, out))
		return nil, err
	})
	if err != nil {
		return StoredContract{}, err
	}
	return out, nil
}

// contractEditable is the one check a contract write and a contract
// preview share: the actor may manage the service's contract (its team's
// operator role, or admin), and c, normalised for svc, is valid. doing
// names the attempt in the refusal ("editing", "previewing").
func contractEditable(actor identity.Principal, svc Service, c *Contract, doing string) *refusal.Error {
	if !CanManage(actor, svc.Owner) {
		return newRefusal(ErrForbidden, "%s the contract of %s needs the %s team's operator role or admin; %s has neither", doing, svc.Name, svc.Owner, actor)
	}
	c.normalize(svc)
	if fe := ValidateContract(*c, svc); len(fe) > 0 {
		return invalid(fmt.Sprintf("the health contract for %s is not valid", svc.Name), fe)
	}
	return nil
}

// ContractPreview is what a contract preview compares: the service, the
// contract stored for it (the platform defaults, version 0, when none
// was set) and the proposed one, normalised as PutContract would store
// it.
type ContractPreview struct {
	Service  Service
	Current  StoredContract
	Proposed Contract
}

// PreviewContract authorises and validates a contract preview
// exactly as PutContract authorises and validates a write: the same
// check (contractEditable), the same refusals, each audited. An allowed
// preview is audited too, as contract.preview with the stored contract
// before and the proposed one after, in its own transaction; nothing else
// is written. The preview itself is the evaluator's
// (Evaluator.PreviewContract), which only reads.
func (r *Registry) PreviewContract(ctx context.Context, actor identity.Principal, service string, c Contract) (ContractPreview, error) {
	const action = "contract.preview"
	var out ContractPreview
	err := r.write(ctx, actor, action, "service", service, c, func(q *db.Queries) (*refusal.Error, error) {
		row, err := q.ServiceGet(ctx, service)
		if notFound(err) {
			return newRefusal(ErrNotFound, "no service named %s", service), nil
		}
		if err != nil {
			return nil, fmt.Errorf("read service %s: %w", service, err)
		}
		svc := r.service(row)
		if rf := contractEditable(actor, svc, &c, "previewing"); rf != nil {
			return rf, nil
		}
		current, err := r.contract(ctx, q, service)
		if isNotFound(err) {
			d := DefaultContract()
			d.normalize(svc)
			current, err = StoredContract{Service: service, Contract: d}, nil
		}
		if err != nil {
			return nil, err
		}
		out = ContractPreview{Service: svc, Current: current, Proposed: c}
		_, err = audit.Append(ctx, q, r.now(), accepted(actor, action, "service", service, current, c))
		return nil, err
	})
	if err != nil {
		return ContractPreview{}, err
	}
	return out, nil
}

func (r *Registry) contract(ctx context.Context, q *db.Queries, service string) (StoredContract, error) {
	row, err := q.ContractGet(ctx, service)
	if notFound(err) {
		return StoredContract{}, newRefusal(ErrNotFound, "service %s has no contract", service)
	}
	if err != nil {
		return StoredContract{}, fmt.Errorf("read contract of %s: %w", service, err)
	}
	return contractFromRow(row)
}

func contractFromRow(row db.HealthContract) (StoredContract, error) {
	var c Contract
	if err := json.Unmarshal(row.Document, &c); err != nil {
		return StoredContract{}, fmt.Errorf("decode stored contract of %s: %w", row.Service, err)
	}
	if c.MinPassiveReporters == 0 {
		// Stored before the field existed: the default, so that the
		// contract read back validates when put again.
		c.MinPassiveReporters = DefaultMinPassiveReporters
	}
	return StoredContract{Service: row.Service, Version: row.Version, UpdatedAt: row.UpdatedAt, UpdatedBy: row.UpdatedBy, Contract: c}, nil
}

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }
