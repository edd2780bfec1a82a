package policy

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Buckets is a set of in-process token buckets of one Limit, one bucket
// per key (an actor, a source address): a bucket holds at most Max
// tokens and refills at Max per Window, so Max is the burst and
// Max/Window the sustained rate. It is for the hot paths (reports,
// registrations, lease renewals, failed authentication), where a
// database round trip per request would cost more than the work it
// guards; each replica counts on its own, so a region admits up to its
// replica count times the limit. The limits that must hold across
// replicas (overrides, policy writes) are the PostgreSQL-backed ones
// (take).
//
// A bucket at full capacity is the same as none, so full buckets are
// dropped whenever the set has doubled since the last sweep: memory is
// bounded by the keys active within one Window. Safe for concurrent use.
type Buckets struct {
	lim   Limit
	every rate.Limit
	now   func() time.Time

	mu    sync.Mutex
	m     map[string]*rate.Limiter
	sweep int // sweep full buckets when the set reaches this size
}

// minSweep is the set size below which full buckets are never swept.
const minSweep = 1024

// NewBuckets returns an empty set of buckets of lim; now defaults to
// time.Now.
func NewBuckets(lim Limit, now func() time.Time) (*Buckets, error) {
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &Buckets{lim: lim, every: rate.Limit(float64(lim.Max) / lim.Window.Seconds()), now: now,
		m: map[string]*rate.Limiter{}, sweep: minSweep}, nil
}

// Limit is the limit every bucket follows.
func (b *Buckets) Limit() Limit { return b.lim }

// Peek reports, without taking anything, whether key's bucket holds a
// token: a request can be refused before any of its work is done (its
// body decoded, its token verified).
// A key without a bucket is not given one: its bucket would be full, and
// most callers Peek at (every source address that authenticates) never
// take anything.
func (b *Buckets) Peek(key string) Decision {
	now := b.now()
	b.mu.Lock()
	l, ok := b.m[key]
	b.mu.Unlock()
	if !ok {
		return b.decision(true, float64(b.lim.Max))
	}
	tokens := l.TokensAt(now)
	return b.decision(tokens >= 1, tokens)
}

// Take takes n tokens from key's bucket if it holds them, and refuses
// (taking nothing) otherwise.
func (b *Buckets) Take(key string, n int) Decision {
	now := b.now()
	l := b.get(key, now)
	ok := l.AllowN(now, n)
	return b.decision(ok, l.TokensAt(now))
}

// Charge takes n tokens from key's bucket even when that leaves it in
// debt, for work already done once Peek let it in (a batch whose size is
// known only once decoded): the debt is repaid by refusing what comes
// next until the bucket refills, so the sustained rate holds and a
// caller overshoots by at most one request. n above Max is charged as
// Max.
func (b *Buckets) Charge(key string, n int) Decision {
	now := b.now()
	l := b.get(key, now)
	l.ReserveN(now, min(n, b.lim.Max))
	return b.decision(true, l.TokensAt(now))
}

func (b *Buckets) get(key string, now time.Time) *rate.Limiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l, ok := b.m[key]; ok {
		return l
	}
	if len(b.m) >= b.sweep {
		for k, l := range b.m {
			if l.TokensAt(now) >= float64(b.lim.Max) {
				delete(b.m, k)
			}
		}
		b.sweep = max(2*len(b.m), minSweep)
	}
	l := rate.NewLimiter(b.every, b.lim.Max) // full
	b.m[key] = l
	return l
}

// Len is the number of buckets held (not yet swept).
func (b *Buckets) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

// decision describes a bucket holding tokens after an attempt. Reset is
// the wait until it holds one more token when allowed (at most a token's
// refill time), and until it holds one again when refused.
func (b *Buckets) decision(allowed bool, tokens float64) Decision {
	d := Decision{Allowed: allowed, Limit: b.lim, Remaining: max(0, int(math.Floor(tokens)))}
	perToken := float64(time.Second) / float64(b.every)
	switch {
	case !allowed || tokens < 1:
		d.Reset = time.Duration(math.Ceil((1 - tokens) * perToken))
	case tokens < float64(b.lim.Max):
		d.Reset = time.Duration(math.Ceil((1 - (tokens - math.Floor(tokens))) * perToken))
	}
	return d
}
