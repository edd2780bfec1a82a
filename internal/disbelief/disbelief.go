// Package disbelief is muster's one rule for bulk removal: a
// signal that would remove more than a threshold of a scope at once is
// probably a broken signal path, not a mass death, and is not believed
// (Envoy's panic threshold, Kubernetes' zone disruption, Eureka's
// self-preservation; the field guide's "disbelief gate").
//
// Every caller that removes instances in bulk (the lease reaper, each
// reconciliation source) counts its proposed removals in scopes with a
// Counter, asks Over, and reports what it holds as Holds.
// The rule is the same everywhere:
//
//   - A scope is over when at least MinMass of its instances would be
//     removed and they are more than Fraction of what it had.
//   - A partitioned scope (a zone or a prober muster cannot hear) holds
//     whatever its size: muster's own deafness is never a reason to
//     remove (Partition).
//   - A hold is released only by recovery (the signal stops proposing the
//     removal: renewals land again, the source reports the instances
//     again, the partition heals) or by an authorised confirmation that
//     names what was held when it was made (Confirmation.Covers). Never
//     by a timer: a broken reading repeated is still broken.
//
// Merge makes the one list the holds are read from: GET
// /v1/removal-holds, the UI's holds page and the removal_held alarm.
package disbelief

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
)

// AlarmRemovalHeld is the alarm of every hold, whichever gate holds it.
const AlarmRemovalHeld = "removal_held"

// Kind is the kind of a scope removals are counted in.
type Kind string

// Scope kinds.
const (
	// Region: every instance the gate sees.
	Region Kind = "region"
	// Source: every instance of one reconciliation source.
	Source Kind = "source"
	// Zone: the instances of one zone, across services.
	Zone Kind = "zone"
	// Prober: the targets of one prober.
	Prober Kind = "prober"
	// Service: the instances of one service.
	Service Kind = "service"
)

// Scope is where removals are counted: a kind and a name (empty for the
// region).
type Scope struct {
	Kind Kind   `json:"kind"`
	Name string `json:"name,omitempty"`
}

func (s Scope) String() string {
	if s.Name == "" {
		return string(s.Kind)
	}
	return string(s.Kind) + " " + s.Name
}

// ParseScope reads a scope in String's form ("region", "zone az1"): a
// kind and, but for the region, one name after a single space. It takes
// outside input (a confirmation's body), so anything else is refused
// rather than guessed at: a scope names exactly one thing, and a
// confirmation releases what its scope names.
func ParseScope(s string) (Scope, error) {
	if len(s) > maxScopeText {
		return Scope{}, fmt.Errorf("a scope is at most %d bytes", maxScopeText)
	}
	kind, name, _ := strings.Cut(strings.TrimSpace(s), " ")
	sc := Scope{Kind: Kind(kind), Name: strings.TrimSpace(name)}
	return sc, sc.Validate()
}

// maxScopeText bounds the text ParseScope reads: a kind, a space and the
// longest name.
const maxScopeText = 300

// maxScopeName bounds a scope's name (a DNS name's length).
const maxScopeName = 253

// Validate checks the kind, that only the region has no name, and that a
// name is one printable word.
func (s Scope) Validate() error {
	switch s.Kind {
	case Region:
		if s.Name != "" {
			return errors.New("the region scope has no name")
		}
	case Source, Zone, Prober, Service:
		if s.Name == "" {
			return fmt.Errorf("a %s scope needs a name", s.Kind)
		}
		if len(s.Name) > maxScopeName {
			return fmt.Errorf("scope name %.20q… is too long (at most %d bytes)", s.Name, maxScopeName)
		}
		if !utf8.ValidString(s.Name) {
			return fmt.Errorf("scope name %.40q is not UTF-8", s.Name)
		}
		if i := strings.IndexFunc(s.Name, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }); i >= 0 {
			return fmt.Errorf("scope name %.40q is not one word: a scope names one %s", s.Name, s.Kind)
		}
	default:
		return fmt.Errorf("%.40q is not a scope kind (region, source, zone, prober, service)", string(s.Kind))
	}
	return nil
}

// Rule is a disbelief threshold.
type Rule struct {
	// Fraction: removing more than this fraction of a scope at once is
	// disbelieved.
	Fraction float64 `json:"fraction"`
	// MinMass: fewer removals than this are always believed (one or two
	// instances stopping are not a mass event, whatever fraction of a
	// small scope they are).
	MinMass int `json:"min_mass"`
}

// Validate checks the rule.
func (r Rule) Validate() error {
	if !(r.Fraction > 0 && r.Fraction <= 1) {
		return fmt.Errorf("disbelief fraction %g must be above 0 and at most 1", r.Fraction)
	}
	if r.MinMass < 1 {
		return fmt.Errorf("disbelief minimum mass %d must be at least 1", r.MinMass)
	}
	return nil
}

// Over says whether removing lacking of had is disbelieved.
func (r Rule) Over(had, lacking int) bool {
	return lacking >= r.MinMass && had > 0 && float64(lacking) > r.Fraction*float64(had)
}

// Counter counts, per scope, what a gate had and what it would remove.
type Counter struct {
	rules   map[Kind]Rule
	had     map[Scope]int
	lacking map[Scope]int
}

// NewCounter returns a counter applying rules by scope kind; a kind
// without a rule is never over (it may still be partitioned).
func NewCounter(rules map[Kind]Rule) *Counter {
	return &Counter{rules: rules, had: map[Scope]int{}, lacking: map[Scope]int{}}
}

// Had adds n to what s had.
func (c *Counter) Had(s Scope, n int) { c.had[s] += n }

// Lacking adds n to what s would lose. Removals already made within the
// window count in both: the caller adds them with Had and with Lacking.
func (c *Counter) Lacking(s Scope, n int) { c.lacking[s] += n }

// Count returns what s had and would lose.
func (c *Counter) Count(s Scope) (had, lacking int) { return c.had[s], c.lacking[s] }

// Rule returns the rule of s's kind.
func (c *Counter) Rule(s Scope) (Rule, bool) {
	r, ok := c.rules[s.Kind]
	return r, ok
}

// Over says whether s's removals are disbelieved.
func (c *Counter) Over(s Scope) bool {
	r, ok := c.rules[s.Kind]
	return ok && r.Over(c.had[s], c.lacking[s])
}

// Hold is one scope whose removals a gate does not believe.
type Hold struct {
	// Gate is what proposes the removals: "lease-expiry", or
	// "reconcile/<source>".
	Gate  string `json:"gate"`
	Scope Scope  `json:"scope"`
	// Since is when the hold began; a hold continues while the scope
	// stays held, across sweeps and readings.
	Since time.Time `json:"since"`
	// Had and Lacking are the scope's count; Threshold the rule's
	// fraction (0 for a partition, held whatever its size).
	Had       int     `json:"had"`
	Lacking   int     `json:"lacking"`
	Threshold float64 `json:"threshold,omitempty"`
	// Partition, when set, says why the scope is muster's deafness rather
	// than the instances' death (a prober in outage, a zone unheard).
	Partition string `json:"partition,omitempty"`
	// Held counts the removals held; Instances names them (at most
	// MaxNamed); Services are their services.
	Held      int         `json:"held"`
	Instances []uuid.UUID `json:"instances"`
	Services  []string    `json:"services"`
	// Detail is the sentence the alarm carries.
	Detail string `json:"detail"`
}

// MaxNamed bounds the instances a Hold names.
const MaxNamed = 1000

// Alarm is the hold as a removal_held alarm. Service is set when the
// hold covers one service, Zone for a zone scope.
func (h Hold) Alarm() assembler.Alarm {
	a := assembler.Alarm{Kind: AlarmRemovalHeld, Since: h.Since, Detail: h.Detail}
	if len(h.Services) == 1 {
		a.Service = h.Services[0]
	}
	if h.Scope.Kind == Zone {
		a.Zone = h.Scope.Name
	}
	return a
}

// Describe fills Detail: what is held, why, and how it is released.
func (h *Hold) Describe(what string) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: ", h.Gate)
	if h.Partition != "" {
		fmt.Fprintf(&b, "%s is partitioned from muster (%s); the removal of %d %s there is held: silence muster cannot hear through is not death", h.Scope, h.Partition, h.Held, what)
	} else {
		fmt.Fprintf(&b, "%d of %d %s in %s would be removed at once (%.0f%%, above the %.0f%% disbelief threshold); the removal of %d is held",
			h.Lacking, h.Had, what, h.Scope, 100*float64(h.Lacking)/float64(max(h.Had, 1)), 100*h.Threshold, h.Held)
	}
	b.WriteString(" until the signal recovers or an authorised operator confirms (POST /v1/removal-holds/confirmations")
	fmt.Fprintf(&b, " with gate %q and scope %q); no timer releases it", h.Gate, h.Scope.String())
	h.Detail = b.String()
}

// Name sorts and bounds ids into h.Instances and counts them in Held.
func (h *Hold) Name(ids []uuid.UUID) {
	h.Held = len(ids)
	ids = slices.Clone(ids)
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })
	if len(ids) > MaxNamed {
		ids = ids[:MaxNamed]
	}
	if ids == nil {
		ids = []uuid.UUID{}
	}
	h.Instances = ids
}

// Confirmation is an authorised operator's word that a hold's removals
// are real, given at At. It vouches for the instances it names, or, when
// it names none, for every removal held in its scope by At.
type Confirmation struct {
	At        time.Time
	Instances []uuid.UUID
}

// Covers says whether c, given at or after since, vouches for every id of
// held: an operator confirms what they were shown, so removals a hold
// gains afterwards wait for a confirmation of their own.
func (c Confirmation) Covers(held []uuid.UUID, since time.Time) bool {
	if c.At.IsZero() || c.At.Before(since) {
		return false
	}
	if c.Instances == nil {
		return true
	}
	vouched := make(map[uuid.UUID]struct{}, len(c.Instances))
	for _, id := range c.Instances {
		vouched[id] = struct{}{}
	}
	for _, id := range held {
		if _, ok := vouched[id]; !ok {
			return false
		}
	}
	return true
}

// Since keeps a hold's start across passes: prev holds the starts of the
// scopes held last time; a scope still held keeps its start, a new one
// starts now.
func Since(prev map[Scope]time.Time, s Scope, now time.Time) time.Time {
	if t, ok := prev[s]; ok {
		return t
	}
	return now
}

// Merge lists the holds of several gates by gate, then scope: the one
// list GET /v1/removal-holds, the UI's holds page and the removal_held
// alarms read.
func Merge(lists ...[]Hold) []Hold {
	out := []Hold{}
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.SortFunc(out, func(a, b Hold) int {
		if c := strings.Compare(a.Gate, b.Gate); c != 0 {
			return c
		}
		if c := strings.Compare(string(a.Scope.Kind), string(b.Scope.Kind)); c != 0 {
			return c
		}
		return strings.Compare(a.Scope.Name, b.Scope.Name)
	})
	return out
}
