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
	Nav     string // "overview", "shifts" or "audit"
	Subject string
	Role    string
	Team    string
	Now     time.Time
	// Refresh, when positive, lets the optional script reload the main
	// content every Refresh seconds.
	Refresh int
}

// Counts are a service's instances by verdict.
type Counts struct {
	Eligible, Degraded, Ineligible, Unknown int
}

// Zone is the guard's status for one zone of a service.
type Zone struct {
	Name               string
	Guard              string // "ok" or "tripped"
	Eligible, Total    int
	MinHealthyFraction float64
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
	Classes     []string // evidence classes present
	SingleClass bool
	HasView     bool
	Version     uint64
	ViewAt      time.Time
	Alarms      int
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
