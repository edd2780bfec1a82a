package policy

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/refusal"
)

// Limit is a quota: at most Max counted attempts in any sliding Window.
type Limit struct {
	Max    int
	Window time.Duration
}

// Validate refuses a limit that would count nothing or forever.
func (l Limit) Validate() error {
	if l.Max < 1 || l.Window < time.Second {
		return fmt.Errorf("limit %d per %s: want at least 1 per at least 1s", l.Max, l.Window)
	}
	return nil
}

// Policy is the limit in the form of the RateLimit-Policy header
// ("5;w=600").
func (l Limit) Policy() string {
	return strconv.Itoa(l.Max) + ";w=" + strconv.Itoa(int(math.Ceil(l.Window.Seconds())))
}

// Decision is what the limiter decided about one attempt.
type Decision struct {
	Allowed bool
	Limit   Limit
	// Remaining is how many more attempts the window allows after this one.
	Remaining int
	// Reset is how long until the oldest counted attempt leaves the window
	// and the quota refills by one; when refused, the wait before a retry
	// can succeed (Retry-After).
	Reset time.Duration
}

// ResetSeconds is Reset rounded up to whole seconds, at least 1: what the
// Retry-After and RateLimit-Reset headers carry.
func (d Decision) ResetSeconds() int {
	return max(1, int(math.Ceil(d.Reset.Seconds())))
}

// Quota is the decision as a refusal carries it (and the RateLimit-*
// headers show it).
func (d Decision) Quota() *refusal.Quota {
	return &refusal.Quota{Max: d.Limit.Max, Window: d.Limit.Window, Remaining: d.Remaining, Reset: d.Reset}
}

// figures is the decision as the audit log records it.
func (d Decision) figures() map[string]any { return quotaFigures(*d.Quota()) }

func quotaFigures(q refusal.Quota) map[string]any {
	return map[string]any{
		"limit": q.Max, "window_seconds": q.Window.Seconds(),
		"remaining": q.Remaining, "reset_seconds": q.ResetSeconds(),
	}
}

// take counts an attempt by actor in scope against lim, using q, which must
// be bound to the transaction that makes the decision the attempt asks for:
// the counter lives in PostgreSQL (a sliding log, rate_limit_attempts), so
// every replica shares it, and the advisory lock on the key serialises
// concurrent attempts of the same actor and scope until that transaction
// ends. A refused attempt is not counted: a client that keeps retrying
// while refused does not push its own reset further away.
func take(ctx context.Context, q *db.Queries, now time.Time, actor, scope string, lim Limit) (Decision, error) {
	if err := q.RateLimitLock(ctx, actor+"\n"+scope); err != nil {
		return Decision{}, fmt.Errorf("rate limit %s %s: lock: %w", actor, scope, err)
	}
	since := now.Add(-lim.Window)
	if err := q.RateLimitPrune(ctx, db.RateLimitPruneParams{Actor: actor, Scope: scope, Before: since}); err != nil {
		return Decision{}, fmt.Errorf("rate limit %s %s: prune: %w", actor, scope, err)
	}
	w, err := q.RateLimitWindow(ctx, db.RateLimitWindowParams{Now: now, Actor: actor, Scope: scope, Since: since})
	if err != nil {
		return Decision{}, fmt.Errorf("rate limit %s %s: count: %w", actor, scope, err)
	}
	d := Decision{Limit: lim, Reset: w.Oldest.Add(lim.Window).Sub(now)}
	if int(w.Attempts) >= lim.Max {
		return d, nil
	}
	if err := q.RateLimitRecord(ctx, db.RateLimitRecordParams{Actor: actor, Scope: scope, At: now}); err != nil {
		return Decision{}, fmt.Errorf("rate limit %s %s: record: %w", actor, scope, err)
	}
	d.Allowed = true
	d.Remaining = lim.Max - int(w.Attempts) - 1
	if w.Attempts == 0 {
		d.Reset = lim.Window
	}
	return d, nil
}
