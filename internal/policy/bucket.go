package policy

import (
	"math"
	"sync"
	"time"
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
// A key may be given an allowance of its own on top of the Limit
// (TakeSized): lease renewals are sized by the leases an identity holds,
// so a fleet renewing under one identity is never refused for its size.
//
// A bucket at full capacity is the same as none, so full buckets are
// dropped whenever the set has doubled since the last sweep: memory is
// bounded by the keys active within one Window. Safe for concurrent use.
type Buckets struct {
	lim    Limit
	perSec float64 // lim's refill rate, tokens a second
	now    func() time.Time

	mu    sync.Mutex
	m     map[string]*bucket
	sweep int // sweep full buckets when the set reaches this size
}

// bucket is one key's tokens as of at: negative while in debt (Charge).
// extra is the key's own allowance on top of the set's Limit (TakeSized).
type bucket struct {
	tokens float64
	at     time.Time
	extra  Limit
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
	return &Buckets{lim: lim, perSec: lim.rate(), now: now, m: map[string]*bucket{}, sweep: minSweep}, nil
}

// rate is the limit's refill rate in tokens a second; zero for the zero
// Limit (no allowance).
func (l Limit) rate() float64 {
	if l.Max <= 0 || l.Window <= 0 {
		return 0
	}
	return float64(l.Max) / l.Window.Seconds()
}

// Limit is the limit every bucket follows.
func (b *Buckets) Limit() Limit { return b.lim }

// shape is a bucket's capacity and refill rate with extra on top of the
// set's Limit.
func (b *Buckets) shape(extra Limit) (capacity, perSec float64) {
	if extra.rate() == 0 {
		return float64(b.lim.Max), b.perSec
	}
	return float64(b.lim.Max + extra.Max), b.perSec + extra.rate()
}

// level is k's tokens at now, refilled since k.at and capped at its
// capacity.
func (b *Buckets) level(k *bucket, now time.Time) float64 {
	capacity, perSec := b.shape(k.extra)
	t := k.tokens
	if d := now.Sub(k.at); d > 0 {
		t += d.Seconds() * perSec
	}
	return min(t, capacity)
}

// Peek reports, without taking anything, whether key's bucket holds a
// token: a request can be refused before any of its work is done (its
// body decoded, its token verified).
// A key without a bucket is not given one: its bucket would be full, and
// most callers Peek at (every source address that authenticates) never
// take anything.
func (b *Buckets) Peek(key string) Decision {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.m[key]
	if !ok {
		return b.decision(true, float64(b.lim.Max), Limit{})
	}
	tokens := b.level(k, now)
	return b.decision(tokens >= 1, tokens, k.extra)
}

// Take takes n tokens from key's bucket if it holds them, and refuses
// (taking nothing) otherwise.
func (b *Buckets) Take(key string, n int) Decision { return b.TakeSized(key, n, Limit{}) }

// TakeSized is Take for a key with an allowance of its own, extra, on top
// of the set's Limit: its bucket holds up to Max+extra.Max tokens and
// refills at the sum of both rates. The zero extra is none (Take). A
// key's allowance may change from one call to the next: when it grows,
// the growth of the bucket's capacity is credited at once (a fleet that
// has just grown renews at once, whatever it spent before), and when it
// shrinks, what the bucket holds is cut to the new capacity. Only the
// caller decides the allowance, so the credit is only as generous as
// what it sizes the allowance by.
func (b *Buckets) TakeSized(key string, n int, extra Limit) Decision {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.get(key, now, extra)
	tokens := b.level(k, now)
	ok := float64(n) <= tokens
	if ok {
		tokens -= float64(n)
	}
	k.tokens, k.at = tokens, now
	return b.decision(ok, tokens, k.extra)
}

// Charge takes n tokens from key's bucket even when that leaves it in
// debt, for work already done once Peek let it in (a batch whose size is
// known only once decoded): the debt is repaid by refusing what comes
// next until the bucket refills, so the sustained rate holds and a
// caller overshoots by at most one request. n above the bucket's
// capacity is charged as its capacity. A key's own allowance (TakeSized)
// is kept.
func (b *Buckets) Charge(key string, n int) Decision {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.m[key]
	if !ok {
		k = b.get(key, now, Limit{})
	}
	capacity, _ := b.shape(k.extra)
	tokens := b.level(k, now) - min(float64(n), capacity)
	k.tokens, k.at = tokens, now
	return b.decision(true, tokens, k.extra)
}

// get returns key's bucket, made full when there is none, and sized to
// extra. b.mu is held.
func (b *Buckets) get(key string, now time.Time, extra Limit) *bucket {
	if extra.rate() == 0 {
		extra = Limit{}
	}
	if k, ok := b.m[key]; ok {
		if k.extra != extra {
			tokens := b.level(k, now)
			if grown := extra.Max - k.extra.Max; grown > 0 {
				tokens += float64(grown)
			}
			k.extra = extra
			capacity, _ := b.shape(extra)
			k.tokens, k.at = min(tokens, capacity), now
		}
		return k
	}
	if len(b.m) >= b.sweep {
		for key, k := range b.m {
			if capacity, _ := b.shape(k.extra); b.level(k, now) >= capacity {
				delete(b.m, key)
			}
		}
		b.sweep = max(2*len(b.m), minSweep)
	}
	capacity, _ := b.shape(extra)
	k := &bucket{tokens: capacity, at: now, extra: extra} // full
	b.m[key] = k
	return k
}

// Len is the number of buckets held (not yet swept).
func (b *Buckets) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

// decision describes a bucket with allowance extra holding tokens after
// an attempt. Its Limit is the bucket's own: capacity as Max, and the
// Window that refills it from empty. Reset is the wait until it holds
// one more token when allowed (at most a token's refill time), and until
// it holds one again when refused.
func (b *Buckets) decision(allowed bool, tokens float64, extra Limit) Decision {
	capacity, perSec := b.shape(extra)
	lim := b.lim
	if extra != (Limit{}) {
		lim = Limit{Max: int(capacity), Window: time.Duration(capacity / perSec * float64(time.Second))}
	}
	d := Decision{Allowed: allowed, Limit: lim, Remaining: max(0, int(math.Floor(tokens)))}
	perToken := float64(time.Second) / perSec
	switch {
	case !allowed || tokens < 1:
		d.Reset = time.Duration(math.Ceil((1 - tokens) * perToken))
	case tokens < capacity:
		d.Reset = time.Duration(math.Ceil((1 - (tokens - math.Floor(tokens))) * perToken))
	}
	return d
}
