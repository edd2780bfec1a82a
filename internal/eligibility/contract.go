package eligibility

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Platform defaults and floors, mirroring the registry's stored contract so
// that a contract the registry accepts is one Validate accepts.
const (
	DefaultInterval          = 5 * time.Second
	DefaultHalfLife          = 4 * time.Second
	DefaultRemovalThreshold  = 0.5
	DefaultReentryThreshold  = 0.2
	DefaultMinDwell          = 30 * time.Second
	DefaultSlowStart         = 60 * time.Second
	DefaultPassivePrimaryRPS = 5
	// DefaultMinPassiveReporters is how many distinct callers passive
	// evidence needs before it may remove an instance or be primary.
	DefaultMinPassiveReporters = 2

	// MaxSoftDetection bounds how long a genuine soft failure (every sample
	// failing) may take to cross the removal threshold from a clean start:
	// HalfLife × log2(1/(1−RemovalThreshold)). The defaults give 4 s.
	MaxSoftDetection = 10 * time.Second
	// MaxDependencies is the most dependencies a contract may name.
	MaxDependencies = 64
)

// Contract is a service's health contract as the engine uses it: the
// registry's stored contract with durations as time.Duration, weights
// indexed by Class and the service's capabilities attached. Build one with
// DefaultContract or ContractFrom.
type Contract struct {
	// Interval is the expected sample cadence; silence is judged against
	// it (see Options.SilenceMultiple).
	Interval time.Duration
	// HalfLife is the half-life of the decaying failure rate.
	HalfLife time.Duration
	// MinDwell is how long an instance stays out after removal before it
	// may re-enter. The engine never uses less than the soft detection
	// time, so re-entry is never faster than removal.
	MinDwell time.Duration
	// SlowStart is the ramp over which an instance entering rotation
	// reaches full weight; 0 gives full weight at once.
	SlowStart time.Duration
	// RemovalThreshold is the decayed failure rate at or above which an
	// instance leaves rotation; ReentryThreshold the strictly lower rate
	// it must fall below to come back.
	RemovalThreshold, ReentryThreshold float64
	// Weights per evidence class, indexed by Class. A class with weight 0
	// or missing from Capabilities is absent: excluded, never negative.
	Weights [numClasses]float64
	// PassivePrimaryRPS is the caller traffic (passive outcomes per second
	// for the instance) at or above which passive evidence is primary.
	PassivePrimaryRPS float64
	// MinPassiveReporters is the caller population passive evidence needs
	// (ADR-04 weighs passive by population, not volume): passive is primary
	// only with at least this many distinct reporters inside the silence
	// window, may remove an instance only when at least this many report
	// failure at or above the removal threshold (or another class
	// corroborates), and contradicts another class's failure only with at
	// least this many reporters speaking. Between 1 and 8 (the reporters
	// remembered per instance).
	MinPassiveReporters int
	// RequireReadiness admits a new instance only on a self-reported
	// readiness success, not on any class's success.
	RequireReadiness bool
	Capabilities     Capabilities
	// Dependencies by the name self-reports use. An undeclared name gets
	// the default, Weight authority.
	Dependencies map[string]Dependency
}

// DefaultContract returns the platform defaults for a service with
// capabilities c: weight 1 for each evidence class c includes.
func DefaultContract(c Capabilities) Contract {
	k := Contract{
		Interval:          DefaultInterval,
		HalfLife:          DefaultHalfLife,
		MinDwell:          DefaultMinDwell,
		SlowStart:         DefaultSlowStart,
		RemovalThreshold:  DefaultRemovalThreshold,
		ReentryThreshold:  DefaultReentryThreshold,
		PassivePrimaryRPS: DefaultPassivePrimaryRPS,
		Capabilities:      c,

		MinPassiveReporters: DefaultMinPassiveReporters,
	}
	for cl := range Class(numClasses) {
		if c.Has(cl) {
			k.Weights[cl] = 1
		}
	}
	return k
}

// SoftDetection is the time a run of failing samples takes to cross the
// removal threshold from a clean start: HalfLife × log2(1/(1−removal)).
func (c Contract) SoftDetection() time.Duration {
	return time.Duration(float64(c.HalfLife) * math.Log2(1/(1-c.RemovalThreshold)))
}

// present reports whether class cl takes part in fusion.
func (c Contract) present(cl Class) bool { return c.Capabilities.Has(cl) && c.Weights[cl] > 0 }

// Validate checks c against the platform floors and against what its
// capabilities can supply, like the registry does. The error joins one
// error per problem.
func (c Contract) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	between := func(field string, v, lo, hi time.Duration) bool {
		if v < lo || v > hi {
			add("%s must be between %v and %v, got %v", field, lo, hi, v)
			return false
		}
		return true
	}
	between("interval", c.Interval, time.Second, 30*time.Second)
	hl := between("half-life", c.HalfLife, 500*time.Millisecond, 30*time.Second)
	rm := c.RemovalThreshold > 0 && c.RemovalThreshold < 1
	if !rm {
		add("removal threshold must be a failure rate above 0 and below 1, got %g", c.RemovalThreshold)
	}
	if !(c.ReentryThreshold >= 0 && c.ReentryThreshold < c.RemovalThreshold) {
		add("re-entry threshold must be at least 0 and strictly below the removal threshold (%g), got %g", c.RemovalThreshold, c.ReentryThreshold)
	}
	if hl && rm {
		if d := c.SoftDetection(); d > MaxSoftDetection {
			add("with removal threshold %g and half-life %v a failing instance is removed after %v; the platform allows at most %v", c.RemovalThreshold, c.HalfLife, d.Round(time.Millisecond), MaxSoftDetection)
		}
	}
	between("minimum dwell", c.MinDwell, 5*time.Second, 600*time.Second)
	between("slow start", c.SlowStart, 0, 600*time.Second)
	if !(c.PassivePrimaryRPS >= 0 && c.PassivePrimaryRPS <= 1e6) {
		add("passive-primary traffic must be between 0 and 1e6 requests/s, got %g", c.PassivePrimaryRPS)
	}
	if c.MinPassiveReporters < 1 || c.MinPassiveReporters > maxReporters {
		add("minimum passive reporters must be between 1 and %d, got %d", maxReporters, c.MinPassiveReporters)
	}
	positive := 0
	for cl := range Class(numClasses) {
		w := c.Weights[cl]
		switch {
		case !(w >= 0 && w <= 10):
			add("weight of %s must be between 0 and 10, got %g", cl, w)
		case w > 0 && !c.Capabilities.Has(cl):
			add("weight of %s is %g but the service does not declare the %s capability", cl, w, cl)
		case w > 0:
			positive++
		}
	}
	caps := c.Capabilities
	if positive == 0 && (caps.Probe || caps.Self || caps.Passive) {
		add("give at least one evidence class the service supplies a positive weight; with none every instance would stay unknown forever")
	}
	if c.RequireReadiness && !caps.Readiness {
		add("require readiness needs the readiness capability; a service without a readiness signal enters rotation with health unknown (ADR-16)")
	}
	if len(c.Dependencies) > MaxDependencies {
		add("at most %d dependencies, got %d", MaxDependencies, len(c.Dependencies))
	}
	if len(c.Dependencies) > 0 && !caps.Self {
		add("dependencies are named in self-reports and the service does not declare the self capability")
	}
	names := make([]string, 0, len(c.Dependencies))
	for n := range c.Dependencies {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		d := c.Dependencies[n]
		if n == "" {
			add("a dependency needs a name")
		}
		if d.Authority > Unready {
			add("dependency %q: authority must be informational, weight or unready, got %v", n, d.Authority)
		}
		if d.Shared && d.Authority == Unready {
			add("dependency %q: a shared dependency may not have unready authority: its failure would make every instance unready at once and drain the service (ADR-06)", n)
		}
	}
	return errors.Join(errs...)
}

// sanitized returns c with every value that would break the arithmetic
// replaced by its platform default. SetService uses it so that an
// unvalidated contract degrades to the defaults rather than to NaNs; the
// evaluator is expected to have called Validate.
func (c Contract) sanitized() Contract {
	d := DefaultContract(c.Capabilities)
	if c.Interval <= 0 {
		c.Interval = d.Interval
	}
	if c.HalfLife <= 0 {
		c.HalfLife = d.HalfLife
	}
	if c.MinDwell < 0 {
		c.MinDwell = d.MinDwell
	}
	if c.SlowStart < 0 || c.SlowStart > 24*time.Hour {
		c.SlowStart = d.SlowStart
	}
	if !(c.RemovalThreshold > 0 && c.RemovalThreshold < 1) || !(c.ReentryThreshold >= 0 && c.ReentryThreshold < c.RemovalThreshold) {
		c.RemovalThreshold, c.ReentryThreshold = d.RemovalThreshold, d.ReentryThreshold
	}
	if !(c.PassivePrimaryRPS >= 0) || math.IsInf(c.PassivePrimaryRPS, 0) {
		c.PassivePrimaryRPS = d.PassivePrimaryRPS
	}
	if c.MinPassiveReporters < 1 || c.MinPassiveReporters > maxReporters {
		c.MinPassiveReporters = d.MinPassiveReporters
	}
	positive := false
	for cl := range Class(numClasses) {
		if !(c.Weights[cl] >= 0) || math.IsInf(c.Weights[cl], 0) {
			c.Weights[cl] = 0
		}
		positive = positive || c.present(cl)
	}
	if !positive {
		c.Weights = d.Weights
	}
	return c
}

// ContractSpec is a contract in plain values, shaped like the registry's
// stored contract (durations in seconds, classes and authorities by name),
// so the evaluator can convert one field by field without this package
// importing the registry. Values are taken literally, as the registry
// stores them fully populated; only nil Weights has a default (1 for each
// evidence class the capabilities include), as in the registry, and a zero
// MinPassiveReporters (a contract stored before the field existed) means
// DefaultMinPassiveReporters.
type ContractSpec struct {
	IntervalSeconds   float64
	HalfLifeSeconds   float64
	RemovalThreshold  float64
	ReentryThreshold  float64
	MinDwellSeconds   float64
	SlowStartSeconds  float64
	PassivePrimaryRPS float64
	// MinPassiveReporters: 0 means DefaultMinPassiveReporters.
	MinPassiveReporters int
	// Weights by class name; nil means 1 for each evidence class the
	// capabilities include.
	Weights          map[string]float64
	RequireReadiness bool
	// Capabilities by name: probe, self, passive, readiness.
	Capabilities []string
	Dependencies []DependencySpec
}

// DependencySpec is one dependency in plain values.
type DependencySpec struct {
	Name      string
	Shared    bool
	Authority string // informational, weight, unready; "" is weight
}

// ContractFrom builds a Contract from plain values and validates it.
func ContractFrom(s ContractSpec) (Contract, error) {
	var caps Capabilities
	for _, n := range s.Capabilities {
		switch n {
		case "probe":
			caps.Probe = true
		case "self":
			caps.Self = true
		case "passive":
			caps.Passive = true
		case "readiness":
			caps.Readiness = true
		default:
			return Contract{}, fmt.Errorf("build contract: unknown capability %q: want probe, self, passive or readiness", n)
		}
	}
	secs := func(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
	c := DefaultContract(caps)
	c.Interval = secs(s.IntervalSeconds)
	c.HalfLife = secs(s.HalfLifeSeconds)
	c.MinDwell = secs(s.MinDwellSeconds)
	c.SlowStart = secs(s.SlowStartSeconds)
	c.RemovalThreshold = s.RemovalThreshold
	c.ReentryThreshold = s.ReentryThreshold
	c.PassivePrimaryRPS = s.PassivePrimaryRPS
	if s.MinPassiveReporters != 0 {
		c.MinPassiveReporters = s.MinPassiveReporters
	}
	if s.Weights != nil {
		c.Weights = [numClasses]float64{}
		for n, w := range s.Weights {
			cl, err := ParseClass(n)
			if err != nil {
				return Contract{}, fmt.Errorf("build contract: weights: %w", err)
			}
			c.Weights[cl] = w
		}
	}
	c.RequireReadiness = s.RequireReadiness
	if len(s.Dependencies) > 0 {
		c.Dependencies = make(map[string]Dependency, len(s.Dependencies))
	}
	for _, d := range s.Dependencies {
		a, err := ParseAuthority(d.Authority)
		if err != nil {
			return Contract{}, fmt.Errorf("build contract: dependency %q: %w", d.Name, err)
		}
		if _, dup := c.Dependencies[d.Name]; dup {
			return Contract{}, fmt.Errorf("build contract: dependency %q listed twice", d.Name)
		}
		c.Dependencies[d.Name] = Dependency{Shared: d.Shared, Authority: a}
	}
	if err := c.Validate(); err != nil {
		return Contract{}, fmt.Errorf("build contract: %w", err)
	}
	return c, nil
}
