package eligibility

import (
	"encoding/hex"
	"errors"
	"fmt"
)

// Errors returned by the engine. They are sentinels so the hot path can
// return them without allocating; callers match them with errors.Is.
var (
	// ErrUnknownInstance: the sample or call names an instance the engine
	// does not hold (never added, or removed).
	ErrUnknownInstance = errors.New("eligibility: unknown instance")
	// ErrUnknownService: AddInstance named a service SetService never saw.
	ErrUnknownService = errors.New("eligibility: unknown service")
	// ErrDuplicateInstance: AddInstance named an instance already held.
	ErrDuplicateInstance = errors.New("eligibility: instance already added")
	// ErrInvalidSample: the sample has an unknown class, no outcome and no
	// counts, or a zero time.
	ErrInvalidSample = errors.New("eligibility: invalid sample")
	// ErrInvalidQuarantine: RestoreQuarantine was given a step below 1 or
	// an end before the start.
	ErrInvalidQuarantine = errors.New("eligibility: invalid quarantine")
)

// Class is an evidence class (ADR-04). Its value indexes Contract.Weights.
type Class uint8

// Evidence classes.
const (
	Probe   Class = iota // an active prober's verdict
	Self                 // the instance's own report (readiness, dependencies)
	Passive              // outcomes callers observed on real traffic

	numClasses = 3
)

var classNames = [numClasses]string{"probe", "self", "passive"}

// String returns the class's name as the registry spells it.
func (c Class) String() string {
	if int(c) < numClasses {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// ParseClass parses "probe", "self" or "passive".
func ParseClass(s string) (Class, error) {
	for i, n := range classNames {
		if n == s {
			return Class(i), nil
		}
	}
	return 0, fmt.Errorf("parse evidence class %q: want probe, self or passive", s)
}

// Outcome is what one sample says. The zero value is invalid, so a sample
// left unset is refused rather than read as a success.
type Outcome uint8

// Outcomes.
const (
	// Success: the instance served (the probe passed, the call succeeded,
	// the instance reports itself ready).
	Success Outcome = iota + 1
	// Failure: a soft failure; it moves the decaying failure rate.
	Failure
	// HardFailure: connection refused, process gone. It bypasses the
	// decay (ADR-07).
	HardFailure
	// Unobservable: the reporter could not observe the instance (a
	// prober-side failure). It is recorded and never counted as a failure,
	// nor as a sample that keeps the class from being silent (ADR-05).
	Unobservable
)

var outcomeNames = [...]string{"", "success", "failure", "hard_failure", "unobservable"}

// String returns the outcome's name.
func (o Outcome) String() string {
	if o >= Success && o <= Unobservable {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// ParseOutcome parses an outcome name as String returns it.
func ParseOutcome(s string) (Outcome, error) {
	for i := Success; i <= Unobservable; i++ {
		if outcomeNames[i] == s {
			return i, nil
		}
	}
	return 0, fmt.Errorf("parse outcome %q: want success, failure, hard_failure or unobservable", s)
}

// State is an instance's eligibility (ADR-05). The zero value is Unknown.
type State uint8

// States.
const (
	// Unknown: every available evidence class is silent, or the only
	// speaking class reports failure without corroboration. The instance
	// stays in rotation.
	Unknown State = iota
	// Eligible: in rotation at its weight (below 1 only during slow start).
	Eligible
	// Degraded: in rotation at a weight in (0,1) because a dependency it
	// named has weight authority, or because a failure from one evidence
	// class is contradicted by another (or by a peer prober).
	Degraded
	// Ineligible: out of rotation.
	Ineligible
)

var stateNames = [...]string{"unknown", "eligible", "degraded", "ineligible"}

// String returns the state's name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// MarshalText implements encoding.TextMarshaler.
func (s State) MarshalText() ([]byte, error) {
	if int(s) >= len(stateNames) {
		return nil, fmt.Errorf("marshal state %d: out of range", uint8(s))
	}
	return []byte(stateNames[s]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *State) UnmarshalText(b []byte) error {
	for i, n := range stateNames {
		if n == string(b) {
			*s = State(i)
			return nil
		}
	}
	return fmt.Errorf("unmarshal state %q: want unknown, eligible, degraded or ineligible", b)
}

// InRotation reports whether callers may be routed to an instance in s.
// Unknown is in rotation: silence is not failure.
func (s State) InRotation() bool { return s != Ineligible }

// InstanceID is an instance's identity: the registry's UUID bytes.
type InstanceID [16]byte

// String formats the id as a UUID.
func (id InstanceID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}

// ReporterID is an interned identity of whoever reported a sample: a
// prober's subject, a workload, a calling service. The evaluator interns
// the authenticated identity strings (ADR-15); the engine only compares.
type ReporterID uint64

// Authority is what a degraded dependency named in a self-report may do to
// the reporting instance (ADR-06). The zero value is Weight, the default.
type Authority uint8

// Authorities.
const (
	Weight        Authority = iota // lowers the instance's weight (default)
	Informational                  // recorded, changes nothing
	Unready                        // makes the instance ineligible; only for non-shared dependencies
)

var authorityNames = [...]string{"weight", "informational", "unready"}

// String returns the authority's name as the registry spells it.
func (a Authority) String() string {
	if int(a) < len(authorityNames) {
		return authorityNames[a]
	}
	return fmt.Sprintf("authority(%d)", uint8(a))
}

// ParseAuthority parses "informational", "weight" or "unready"; "" is the
// default, Weight.
func ParseAuthority(s string) (Authority, error) {
	if s == "" {
		return Weight, nil
	}
	for i, n := range authorityNames {
		if n == s {
			return Authority(i), nil
		}
	}
	return 0, fmt.Errorf("parse dependency authority %q: want informational, weight or unready", s)
}

// Dependency is the contract's word on one dependency a self-report may
// name.
type Dependency struct {
	// Shared dependencies fail for every replica at once, so they never
	// get unready authority: the engine treats shared+unready as Weight
	// even though the policy API already refuses it.
	Shared    bool
	Authority Authority
}

// effective is the authority the engine applies.
func (d Dependency) effective() Authority {
	if d.Shared && d.Authority == Unready {
		return Weight
	}
	return d.Authority
}

// Capabilities are the health signals a service's runtime can supply
// (ADR-16).
type Capabilities struct {
	Probe, Self, Passive, Readiness bool
}

// Has reports whether the capabilities include evidence class c.
func (c Capabilities) Has(cl Class) bool {
	switch cl {
	case Probe:
		return c.Probe
	case Self:
		return c.Self
	case Passive:
		return c.Passive
	}
	return false
}

// readinessSignal reports whether the service can tell the engine it is
// ready: by a readiness self-report or by a probe. Without one a new
// instance enters rotation with health unknown (ADR-16).
func (c Capabilities) readinessSignal() bool { return c.Readiness || c.Probe }
