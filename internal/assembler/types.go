package assembler

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/eligibility"
)

// Values of ZoneStatus.Guard, Endpoint.Health and Alarm.Kind as they
// appear on the wire.
const (
	GuardOK      = "ok"
	GuardTripped = "tripped"

	HealthKnown   = "known"
	HealthUnknown = "unknown"

	// AlarmFractionGuard: a zone's routable fraction fell below the
	// service's minimum healthy fraction and its full endpoint set is
	// published (ADR-08).
	AlarmFractionGuard = "fraction_guard"
	// AlarmLastInstance: the service had an instance in rotation in the
	// region and now has none (incident grade, ADR-08).
	AlarmLastInstance = "last_instance"
)

// Defaults applied by New to zero (or out-of-range) options and inputs.
const (
	DefaultWithdrawalWindow      = 50 * time.Millisecond
	DefaultAdditionWindow        = time.Second
	DefaultMaxAdditionWindow     = 30 * time.Second
	DefaultChangeBudgetPerSecond = 2000
	// DefaultMinHealthyFraction replaces a fraction outside (0,1]: the
	// guard cannot be switched off by a bad input (the registry refuses 0
	// for the same reason).
	DefaultMinHealthyFraction = 0.5
	// TrippedWeight is the weight an out-of-rotation endpoint is published
	// at while its zone's guard is tripped, once its slow start is over:
	// health is disregarded, so it gets the share of a fully ramped
	// instance.
	TrippedWeight = 1.0
	// SlowStartSteps is how many weight steps a ramp the assembler runs
	// takes (the evaluation core's default, ADR-12).
	SlowStartSteps = 10
)

// ErrVersionNotFresh is returned by Drain when the VersionSource hands out a
// version that is not above the last one published or restored. Nothing is
// published.
var ErrVersionNotFresh = errors.New("assembler: version source returned a version not above the last published one")

// VersionSource hands out versions. Next returns the first of n
// consecutive versions nobody has been given before; the assembler uses
// first … first+n-1. Drain calls it with the caller's lock held, so it must
// not do I/O; the production source is Versions (an epoch taken once from
// PostgreSQL and a local counter).
type VersionSource interface {
	Next(n int) (first uint64, err error)
}

// Endpoint is one instance as a view publishes it. State is the instance's
// own verdict ("unknown", "eligible", "degraded", "ineligible") even when a
// tripped guard publishes it, so a reader can tell a broken fleet from a
// broken health check.
type Endpoint struct {
	InstanceID   uuid.UUID `json:"instance_id"`
	Address      string    `json:"address"`
	Port         int       `json:"port"`
	Zone         string    `json:"zone"`
	State        string    `json:"state"`
	Weight       float64   `json:"weight"`
	Health       string    `json:"health"`
	Capabilities []string  `json:"capabilities"`
	// Quarantined: held out of rotation by flap quarantine (ADR-09); it is
	// published only while its zone's guard is tripped.
	Quarantined bool `json:"quarantined,omitempty"`
	// Override is the operator's override in force, if any (ADR-15): the
	// reason this endpoint is forced out (published at weight 0) or in.
	// It is not part of the checksum.
	Override *Override `json:"override,omitempty"`
	// LeaseExpired: the instance's lease ran out and the registry ended
	// it, but its zone's guard is tripped, so it stays published (at
	// TrippedWeight, state "ineligible") until the guard clears. Lease
	// expiry is one signal, and no single signal may drain a zone
	// (ADR-08). It is not part of the checksum.
	LeaseExpired bool `json:"lease_expired,omitempty"`
}

// Override actions, as InstanceInput.Override.Action carries them.
const (
	OverrideIneligible = "mark_ineligible"
	OverrideEligible   = "mark_eligible"
)

// Override is an operator's override of one instance's verdict. Shared:
// do not modify one handed in or out.
type Override struct {
	ID     uuid.UUID `json:"id"`
	Action string    `json:"action"`
	// Reason says who, until when and why, for a person reading the view.
	Reason string `json:"reason"`
}

// ZoneStatus is the guard's decision for one zone of one service, as of
// the last Update included in the version. Eligible counts the instances in
// rotation (Routable: eligible, degraded, unknown; not quarantined; or
// forced in); Total counts the zone's capacity, the guard's denominator
// (Counted: every instance but those awaiting their first success);
// Registered counts the instances the registry lists in the zone (all but
// lease-expired ones the guard still keeps), so a client can tell a set
// the registry shrank (a scale-down, a decommission) from one verdicts
// shrank.
type ZoneStatus struct {
	Guard              string  `json:"guard"`
	Eligible           int     `json:"eligible"`
	Total              int     `json:"total"`
	Registered         int     `json:"registered"`
	MinHealthyFraction float64 `json:"min_healthy_fraction"`
	// TrafficWeight is the zone's traffic preference set by shift-backs
	// (ADR-13): 1 normally, 0 while the zone is drained, a step in
	// between while traffic returns. Clients (and xDS locality weights)
	// multiply it into the endpoint weights; it is not health, so it
	// never trips the guard and never changes an endpoint.
	TrafficWeight float64 `json:"traffic_weight"`
}

// View is a service's published routing view. A View handed out by the
// Assembler is immutable and shared: do not modify it.
type View struct {
	Service     string                `json:"service"`
	Version     uint64                `json:"version"`
	Endpoints   []Endpoint            `json:"endpoints"` // ordered by instance id
	Zones       map[string]ZoneStatus `json:"zones"`
	GeneratedAt time.Time             `json:"generated_at"`
	Checksum    string                `json:"checksum"`
	// Signature is the owner's signature by the region's key over the
	// service, version, checksum and zones (sign.go); nil without a key.
	// Clients of an earlier release ignore it.
	Signature *Signature `json:"signature,omitempty"`

	enc []byte
}

// Encoded returns the view's JSON encoding, computed once when the view was
// published; the slice is shared and must not be modified.
func (v *View) Encoded() []byte { return v.enc }

// Delta takes a client from the view at FromVersion to the view at
// Version: remove Removals, upsert Upserts (by instance id), set Zones and
// delete RemovedZones; the result's Checksum equals Checksum. A Delta
// handed out by the Assembler is immutable and shared.
type Delta struct {
	Service      string                `json:"service"`
	FromVersion  uint64                `json:"from_version"`
	Version      uint64                `json:"version"`
	Upserts      []Endpoint            `json:"upserts,omitempty"`  // ordered by instance id
	Removals     []uuid.UUID           `json:"removals,omitempty"` // ordered
	Zones        map[string]ZoneStatus `json:"zones,omitempty"`    // zones whose status changed
	RemovedZones []string              `json:"removed_zones,omitempty"`
	Checksum     string                `json:"checksum"`
	// Withdrawal: the delta carries at least one withdrawal (an endpoint
	// leaving the set or its weight going to 0).
	Withdrawal  bool      `json:"withdrawal"`
	GeneratedAt time.Time `json:"generated_at"`
	// Signature is the signature of the view the delta produces (View's).
	Signature *Signature `json:"signature,omitempty"`

	enc []byte
}

// Encoded returns the delta's JSON encoding, computed once when it was
// published; the slice is shared and must not be modified.
func (d *Delta) Encoded() []byte { return d.enc }

// Alarm is an open alarm. Since is when the condition began; Detail carries
// the numbers as of the last Update.
type Alarm struct {
	Kind    string `json:"kind"`
	Service string `json:"service"`
	Zone    string `json:"zone,omitempty"`
	// Instance is the instance the alarm is about, if one (a
	// quarantine).
	Instance string    `json:"instance,omitempty"`
	Since    time.Time `json:"since"`
	Detail   string    `json:"detail"`
}

// InstanceInput is one instance's verdict after overrides, as the evaluator
// hands it over.
type InstanceInput struct {
	ID          uuid.UUID
	Address     string
	Port        int
	Zone        string
	State       eligibility.State
	Weight      float64
	HealthKnown bool
	Quarantined bool
	// Override, when set, is applied before the guard (see the package
	// documentation). State stays the instance's own verdict.
	Override *Override
	// FirstFailureAt is the first failed sample of the episode that took
	// the instance out (zero if unknown); a published withdrawal reports
	// now − FirstFailureAt as its lag.
	FirstFailureAt time.Time
	// LeaseExpired: the registry ended the instance because its lease ran
	// out. It is never routable (an override cannot bring it back: there
	// is nothing there), counts in its zone's total, and is published only
	// while the zone's guard is tripped.
	LeaseExpired bool
	// Awaiting: the instance has never been in rotation since it
	// registered (a new instance of a service with a readiness signal,
	// before its first success). It is not capacity that was there: the
	// guard does not count it, and a tripped guard never publishes it.
	Awaiting bool
}

// ServiceInput is everything the assembler needs to know about a service:
// its contract's minimum healthy fraction, its capability profile and every
// instance it has (an instance left out is gone).
type ServiceInput struct {
	Name               string
	MinHealthyFraction float64
	Capabilities       []string
	Instances          []InstanceInput
	// Traffic gives each zone's traffic weight (shift-backs, ADR-13); nil
	// means 1 everywhere.
	Traffic TrafficWeights
	// SlowStart is the contract's ramp (ADR-12) for endpoints the
	// assembler itself puts into rotation: those a tripped guard
	// publishes and those a mark_eligible override forces in while their
	// own verdict has them out. They start at TrippedWeight/SlowStartSteps
	// and reach TrippedWeight after SlowStart, in SlowStartSteps steps.
	// Zero: full weight at once.
	SlowStart time.Duration
}

// TrafficWeights returns a zone's traffic weight in [0,1]. A value outside
// it is clamped, and NaN reads as 1: a bad input cannot drain a zone.
type TrafficWeights func(zone string) float64

// Options tunes the two queues. Zero values take the defaults.
type Options struct {
	// WithdrawalWindow: the longest a withdrawal waits to be batched with
	// others of the same service, and the least time between two of a
	// service's withdrawal versions (default 50 ms). A withdrawal arriving
	// when the service's withdrawal queue is idle does not wait (see the
	// package documentation, Queues).
	WithdrawalWindow time.Duration
	// AdditionWindow: the batching window for every other change when the
	// region is within budget (default 1 s).
	AdditionWindow time.Duration
	// MaxAdditionWindow caps the grown addition window (default 30 s).
	MaxAdditionWindow time.Duration
	// ChangeBudgetPerSecond: endpoint changes per second across the region
	// above which additions are shed (default 2,000).
	ChangeBudgetPerSecond int
	// Sign, when set, signs each version as it is encoded (sign.go); nil:
	// views are unsigned (a keyless replica).
	Sign ViewSigner
}

// Published is one service's new version as Drain produced it.
type Published struct {
	View *View
	// Delta is nil for the first version of a service.
	Delta     *Delta
	ViewJSON  []byte
	DeltaJSON []byte
	// WithdrawalLags: now − FirstFailureAt for each withdrawn endpoint
	// whose input carried a FirstFailureAt.
	WithdrawalLags []time.Duration
}

// Stats is the queues' state at a moment.
type Stats struct {
	Services          int
	QueuedWithdrawals int
	QueuedAdditions   int
	// ShedEpisodes counts the times the addition window grew from its base.
	ShedEpisodes uint64
	// Shedding: the addition window is above its base.
	Shedding       bool
	AdditionWindow time.Duration
	// Published counts versions published since New.
	Published uint64
}

func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only non-finite floats could fail, and weights and fractions
		// are sanitised on the way in.
		panic("assembler: encode: " + err.Error())
	}
	return b
}
