package views

import (
	"fmt"
	"net/url"
	"strconv"
	"time"
)

// Page is what the layout needs: who is signed in, which nav entry is
// current, the time the page was rendered at (for relative times) and the
// base path the UI is mounted at.
type Page struct {
	Title   string
	Base    string // e.g. "/ui"
	Nav     string // "overview", "shifts", "reconcile" or "audit"
	Subject string
	Role    string
	Team    string
	Now     time.Time
	// Refresh, when positive, lets the optional script reload the main
	// content every Refresh seconds.
	Refresh int
	// Live, when set with Refresh, is the events path whose change events
	// make the script reload the main content at once.
	Live string
}

// Counts are a service's instances by verdict.
type Counts struct {
	Eligible, Degraded, Ineligible, Unknown int
}

// Zone is the guard's status for one zone of a service.
type Zone struct {
	Name            string
	Guard           string // "ok" or "tripped"
	Eligible, Total int    // in rotation, of the guard's capacity
	// Registered counts the instances the registry lists in the zone;
	// above Total while new instances await their first success (they
	// are not capacity yet).
	Registered         int
	MinHealthyFraction float64
	// TrafficWeight is the zone's traffic preference (shift-backs): 1
	// normally, 0 drained.
	TrafficWeight float64
}

// Alarm is an open alarm as the banner shows it.
type Alarm struct {
	Kind, Service, Zone, Detail string
	Since                       time.Time
}

// Service is one row of the overview.
type Service struct {
	Name        string
	Owner       string
	Counts      Counts
	Zones       []Zone
	Classes     []string // evidence classes the contract weighs
	SingleClass bool
	// FlapRate is eligibility changes per instance-hour over the flap
	// window (10 min); Quarantined counts instances held out by flap
	// quarantine now.
	FlapRate    float64
	Quarantined int
	// OverriddenOut and OverriddenIn count instances that overrides in
	// force hold out of or force into rotation: the counts above are the
	// instances' own verdicts, the views apply the overrides.
	OverriddenOut, OverriddenIn int
	HasView                     bool
	Version                     uint64
	ViewAt                      time.Time
	Alarms                      int
	// State is the row's summary: alarm, tripped, unknown, ineligible,
	// degraded, healthy or empty.
	State string
}

// Overview is the data of the overview page.
type Overview struct {
	Page
	Alarms   []Alarm
	Services []Service
	// Total is the number of services before filtering.
	Total int
	// Evaluated is when the evaluator's figures were read.
	Evaluated time.Time
	// Filter and sort as given in the query.
	Owner, State, Sort string
	Owners             []string
	// Unavailable explains figures that could not be read (evaluator not
	// ready), so the page does not pass off missing data as zero.
	Unavailable string
	// Pending are override attempts waiting for a co-signer.
	Pending []OverrideRow
	// Zones are the per-zone sparklines (nil: no zone history kept
	// here), sampled every ZonesEvery.
	Zones      []ZoneTrend
	ZonesEvery string
	ZonesShown bool
	// Probers are the probers' reach sparklines (ProbersShown: a prober
	// history is kept here).
	Probers      []ProberTrend
	ProbersShown bool
}

// AuditEvent is one row of the audit page.
type AuditEvent struct {
	Seq                         int64
	At                          time.Time
	ActorKind, Actor, Action    string
	TargetKind, Target, Outcome string
	Reason                      string
}

// Audit is the data of the audit page.
type Audit struct {
	Page
	Events                 []AuditEvent
	Actor, Action, Outcome string
	Service                string // events aimed at the service or its instances
	Before                 int64  // the cursor this page started at (0: newest)
	Next                   int64  // cursor of the next (older) page, 0 for none
	ChainOK                bool
	ChainRows              int64
	ChainHead              string
	ChainError             string
	ChainCheckedAt         time.Time
	Error                  string
}

// Message is a page that only says something: an error, a refusal, or that
// the user signed out.
type Message struct {
	Page
	Status  int
	Heading string
	Text    string
	// Link, when set, is offered as the way on.
	Link, LinkText string
}

// Ago renders t relative to now: "12 s ago", "3 min ago", "in 5 min".
func Ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	future := d < 0
	if future {
		d = -d
	}
	var s string
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		s = fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		s = fmt.Sprintf("%d min", int(d.Minutes()))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%d h %d min", int(d.Hours()), int(d.Minutes())%60)
	default:
		s = fmt.Sprintf("%d days", int(d.Hours()/24))
	}
	if future {
		return "in " + s
	}
	return s + " ago"
}

// Absolute renders t in UTC to the second.
func Absolute(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// ISO renders t for a <time datetime> attribute.
func ISO(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// Query renders base?key=value&… skipping empty values.
func Query(base string, kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	if len(q) == 0 {
		return base
	}
	return base + "?" + q.Encode()
}

func itoa(n int) string    { return strconv.Itoa(n) }
func i64(n int64) string   { return strconv.FormatInt(n, 10) }
func u64(n uint64) string  { return strconv.FormatUint(n, 10) }
func pct(f float64) string { return strconv.FormatFloat(f*100, 'f', 0, 64) + "%" }

// Evidence is one evidence class of one instance.
type Evidence struct {
	Class         string
	Present       bool
	Silent        bool
	FailureRate   float64
	LastSampleAt  time.Time
	HasLastSample bool
}

// Instance is one row of the service page.
type Instance struct {
	ID, Address, Zone string
	State             string // eligible, degraded, ineligible, unknown
	Weight            float64
	Health            string // known or unknown
	SingleClass       bool
	Primary           string
	Evidence          []Evidence
	Reasons           []string
	QuarantineUntil   time.Time
	Override          *OverrideRow
	Pending           *OverrideRow
}

// OverrideRow is an override as the service page shows it.
type OverrideRow struct {
	ID, Service, InstanceID, Zone, Action, State string
	Actor, Justification                         string
	Cosigner, CosignJustification                string
	BudgetDetail                                 string
	CreatedAt, ExpiresAt, CosignBy               time.Time
	// Own: the signed-in operator asked for it (and so may not co-sign).
	Own bool
}

// GuardEpisode is one recorded trip of a zone's fraction guard.
type GuardEpisode struct {
	Zone, Detail string
	TrippedAt    time.Time
	ClearedAt    time.Time // zero while open
	// Open: still tripped in the live view. An episode the log holds as
	// open whose zone is no longer tripped ended at a time not recorded.
	Open bool
}

// FlapStep is one transition in a quarantine's history.
type FlapStep struct {
	From, To, Reason string
	At               time.Time
}

// Flap is a quarantine with the transitions that caused it.
type Flap struct {
	InstanceID, Reason string
	At                 time.Time // when the quarantine began
	Until              time.Time // zero when no longer quarantined
	Current            bool
	History            []FlapStep
}

// Field is a labelled value (a contract setting).
type Field struct{ Label, Value, Note string }

// ServicePage is the data of a service's page.
type ServicePage struct {
	Page
	Name, Owner  string
	Capabilities []string
	// Contract, with its version (0: platform defaults) and authorship.
	Contract          []Field
	ContractVersion   int64
	ContractUpdatedAt time.Time
	ContractUpdatedBy string
	ContractError     string
	Evaluated         time.Time
	Unavailable       string
	Counts            Counts
	Instances         []Instance
	HasView           bool
	Version           uint64
	ViewAt            time.Time
	Zones             []Zone
	Guards            []GuardEpisode
	GuardsError       string
	Flaps             []Flap
	FlapsError        string
	Active, Pending   []OverrideRow
	OverridesError    string
	// CanAct: the signed-in operator may override this service's
	// instances (its team's operator, or admin).
	CanAct bool
	// Expiries are the override lifetimes offered: seconds and label.
	Expiries [][2]string
}

// OverrideResult is the page after an override form: what happened and,
// for a refusal, why in plain words with the numbers.
type OverrideResult struct {
	Page
	Service  string
	Outcome  string // accepted, pending (waiting for a co-signer) or refused
	Heading  string
	Lines    []string
	RetryAt  time.Time // rate limit: when a retry can succeed
	CosignBy time.Time // pending: when the wait for a co-signer ends
	Override *OverrideRow
	// Retry, when set, is the refused form again with what was typed, for
	// refusals the operator can fix (justification, expiry).
	Retry *OverrideRetry
}

// OverrideRetry is a refused override form, filled in as it was sent.
type OverrideRetry struct {
	Service, InstanceID, Action, Justification, ExpiresIn string
	Expiries                                              [][2]string
}

// LiftConfirm is the confirmation page before lifting an override.
type LiftConfirm struct {
	Page
	Service  string
	Override OverrideRow
}

func pctf(f float64) string { return strconv.FormatFloat(f*100, 'f', 0, 64) + "%" }
func fnum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
