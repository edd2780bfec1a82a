// Package refusal is the one shape of a refused request in muster: what
// kind of refusal it is, its stable problem type, a detail a person can
// act on, the invalid fields, the check that decided and its figures. The
// registry, policy and the shift-backs return an *Error; server/ maps it
// to an RFC 9457 problem in one place, and the UI explains it. It imports
// nothing of muster, so every domain package may use it.
//
// A Kind is one of the broad kinds below, which decide the HTTP status,
// or a narrower kind made with Sub, which keeps its parent's status and
// names its own problem type. Kinds are errors compared with errors.Is,
// and a narrower kind is its parent too: errors.Is(err, Conflict) holds
// for a budget refusal.
package refusal

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Kind is a kind of refusal.
type Kind struct {
	name    string
	problem string
	parent  *Kind
}

// The broad kinds; each maps to one HTTP status in server/.
var (
	Invalid      = &Kind{name: "invalid", problem: "validation"}
	NotFound     = &Kind{name: "not found", problem: "not-found"}
	Forbidden    = &Kind{name: "forbidden", problem: "forbidden"}
	Conflict     = &Kind{name: "conflict", problem: "conflict"}
	Gone         = &Kind{name: "gone", problem: "gone"}
	Precondition = &Kind{name: "precondition failed", problem: "precondition-failed"}
	RateLimited  = &Kind{name: "rate limited", problem: "rate-limited"}
)

// Sub returns a narrower kind of k, named name (its error text), with its
// own stable problem type.
func (k *Kind) Sub(name, problemType string) *Kind {
	return &Kind{name: name, problem: problemType, parent: k}
}

func (k *Kind) Error() string { return k.name }

// Unwrap returns the broader kind, so errors.Is matches it too.
func (k *Kind) Unwrap() error {
	if k.parent == nil {
		return nil
	}
	return k.parent
}

// ProblemType is the kind's stable problem type ("budget-exceeded").
func (k *Kind) ProblemType() string { return k.problem }

// Broad returns the broad kind k is, or is narrower than.
func (k *Kind) Broad() *Kind {
	for k.parent != nil {
		k = k.parent
	}
	return k
}

// Field names one invalid field by its JSON path.
type Field struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Quota is a rate limit's state when a refusal was decided: at most Max
// attempts in any sliding Window, Remaining more allowed, Reset until the
// oldest counted attempt leaves the window.
type Quota struct {
	Max       int
	Window    time.Duration
	Remaining int
	Reset     time.Duration
}

// ResetSeconds is Reset rounded up to whole seconds, at least 1: what the
// Retry-After and RateLimit-Reset headers carry.
func (q Quota) ResetSeconds() int { return max(1, int(math.Ceil(q.Reset.Seconds()))) }

// Policy is the quota in the form of the RateLimit-Policy header
// ("5;w=600").
func (q Quota) Policy() string {
	return strconv.Itoa(q.Max) + ";w=" + strconv.Itoa(int(math.Ceil(q.Window.Seconds())))
}

// Error is a refusal with a reason a person can act on. Nothing was
// changed by the request it refuses.
type Error struct {
	Kind *Kind
	// Check is the check that decided (authorisation, budget, dwell…), as
	// the audit log names it; empty where there is only one.
	Check  string
	Detail string
	Fields []Field
	// Figures are the numbers the deciding check used (budget counts,
	// rate-limit state); they are audited, and the server sends them as
	// problem extension members.
	Figures map[string]any
	// RetryAfter, when positive, is how long until a retry can succeed
	// (a dwell not yet elapsed).
	RetryAfter time.Duration
	// Quota is the caller's rate limit, when one was counted on the way.
	Quota *Quota
	// Subject is what the refusal left behind for its caller, if anything
	// (policy: an override stored pending a co-signature). When it has a
	// ProblemMembers method, those members are sent too.
	Subject any
}

func (e *Error) Error() string { return fmt.Sprintf("%v: %s", e.Kind, e.Detail) }

// Unwrap lets errors.Is match the kind (and its broader kinds).
func (e *Error) Unwrap() error {
	if e.Kind == nil {
		return nil
	}
	return e.Kind
}

// New returns a refusal of kind, decided by check, with a formatted detail.
func New(kind *Kind, check, format string, args ...any) *Error {
	return &Error{Kind: kind, Check: check, Detail: fmt.Sprintf(format, args...)}
}
