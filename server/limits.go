package server

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
)

// Limits bound what one identity (or, before authentication, one source
// address) may ask of a replica. Each is a token bucket per key, written
// "N/window" as the policy limits are: at most N at once, refilled at N
// per window. They are in-process (policy.Buckets): each replica counts
// on its own, so behind R replicas an identity gets up to R times them.
// The privileged, audited writes whose limits must hold across replicas
// (overrides, policy writes, lifts, shift operations) are limited in
// PostgreSQL by the policy service instead.
type Limits struct {
	// ReportItems bounds the report items (samples) per identity:
	// 100000/2s, a sustained 50,000 a second with a burst of 100,000.
	// A healthy region of 60,000 instances reporting every second spread
	// over many identities is far inside it; so is a prober for 10,000
	// targets (10,000 a second in two batches of 5,000).
	ReportItems policy.Limit
	// ReportRequests bounds POST /v1/reports per identity, whatever their
	// size: 10000/2s (5,000 a second). Every instance of a service shares
	// its workload identity, and self-reports come once a second from each.
	ReportRequests policy.Limit
	// Registrations and Deregistrations bound instance registrations and
	// deregistrations per identity: 1200/1m each (a fleet of 1,200
	// replaced at once, then 20 a second).
	Registrations   policy.Limit
	Deregistrations policy.Limit
	// LeaseRenewals bounds lease renewals per identity: 6000/10s (600 a
	// second: 2,000 instances of one service renewing every 10 s use a
	// third of it), and grows with the identity's fleet: each live lease
	// it registered adds one renewal at once and renewalsPerLease (4) per
	// lease TTL, so a fleet renewing every TTL/3 under one identity is
	// never refused for its size (renewalLimiter). A batch
	// (POST /v1/leases/renewals) costs renewalBatchCost: 1, plus 1 per
	// renewalsPerToken (10) leases it names, plus 1 per lease it names
	// that it does not renew.
	LeaseRenewals policy.Limit
	// Unauthenticated bounds the requests refused 401 per source address
	// (per /64 for IPv6): 120/1m. Past it, requests from the address are
	// answered 429 without their token being verified, until the bucket
	// refills.
	Unauthenticated policy.Limit
	// WatchStreams bounds the watch streams one identity holds open on a
	// replica: 10,000.
	WatchStreams int
}

// DefaultLimits returns the default Limits.
func DefaultLimits() Limits {
	return Limits{
		ReportItems:     policy.Limit{Max: 100_000, Window: 2e9},
		ReportRequests:  policy.Limit{Max: 10_000, Window: 2e9},
		Registrations:   policy.Limit{Max: 1200, Window: 60e9},
		Deregistrations: policy.Limit{Max: 1200, Window: 60e9},
		LeaseRenewals:   policy.Limit{Max: 6000, Window: 10e9},
		Unauthenticated: policy.Limit{Max: 120, Window: 60e9},
		WatchStreams:    10_000,
	}
}

// validate fills zero limits with the defaults and checks the rest.
func (l *Limits) validate() error {
	def := DefaultLimits()
	for _, f := range []struct {
		name     string
		lim, def *policy.Limit
	}{
		{"ReportItems", &l.ReportItems, &def.ReportItems},
		{"ReportRequests", &l.ReportRequests, &def.ReportRequests},
		{"Registrations", &l.Registrations, &def.Registrations},
		{"Deregistrations", &l.Deregistrations, &def.Deregistrations},
		{"LeaseRenewals", &l.LeaseRenewals, &def.LeaseRenewals},
		{"Unauthenticated", &l.Unauthenticated, &def.Unauthenticated},
	} {
		if *f.lim == (policy.Limit{}) {
			*f.lim = *f.def
		}
		if err := f.lim.Validate(); err != nil {
			return fmt.Errorf("server: limit %s: %w", f.name, err)
		}
	}
	if l.WatchStreams == 0 {
		l.WatchStreams = def.WatchStreams
	}
	if l.WatchStreams < 0 {
		return fmt.Errorf("server: limit WatchStreams %d is negative", l.WatchStreams)
	}
	return nil
}

// limiters are the server's buckets.
type limiters struct {
	reportItems, reportRequests    *policy.Buckets
	registrations, deregistrations *policy.Buckets
	unauthenticated                *policy.Buckets
	renewals                       *renewalLimiter
	streams                        *streamCounts
}

// newLimiters builds the buckets of l on the clock now.
func newLimiters(l Limits, now func() time.Time) (limiters, error) {
	var (
		out      limiters
		renewals *policy.Buckets
	)
	for _, b := range []struct {
		dst **policy.Buckets
		lim policy.Limit
	}{
		{&out.reportItems, l.ReportItems}, {&out.reportRequests, l.ReportRequests},
		{&out.registrations, l.Registrations}, {&out.deregistrations, l.Deregistrations},
		{&renewals, l.LeaseRenewals}, {&out.unauthenticated, l.Unauthenticated},
	} {
		var err error
		if *b.dst, err = policy.NewBuckets(b.lim, now); err != nil {
			return limiters{}, err
		}
	}
	out.renewals = &renewalLimiter{buckets: renewals, now: now, sized: map[string]*leaseCount{}}
	out.streams = &streamCounts{max: l.WatchStreams, open: map[string]int{}}
	return out, nil
}

// limitActor is middleware that takes one token per request from the
// caller's bucket in b, answering 429 when it is empty. It runs after
// authenticate.
func (s *Server) limitActor(b *policy.Buckets, name string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p := principal(r)
			d := b.Take(p.String(), 1)
			setRateLimit(w.Header(), d)
			if !d.Allowed {
				s.refuseLimited(w, r, d, name, fmt.Sprintf("%s has made %d %s within %s, the most allowed; retry in %d s",
					p, d.Limit.Max, name, d.Limit.Window, d.ResetSeconds()))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// refuseLimited answers 429 rate-limited as the policy limits do: a
// problem with Retry-After, the RateLimit-* headers, and the limit's
// figures as extension members.
func (s *Server) refuseLimited(w http.ResponseWriter, r *http.Request, d policy.Decision, name, detail string) {
	s.metrics.rateLimited.WithLabelValues(name).Inc()
	setRateLimit(w.Header(), d)
	p := problem(http.StatusTooManyRequests, "rate-limited", detail)
	p.retryAfter = d.ResetSeconds()
	p.Extensions = map[string]any{
		"check": policy.CheckRateLimit, "limit": d.Limit.Max, "window_seconds": d.Limit.Window.Seconds(),
		"remaining": d.Remaining, "reset_seconds": d.ResetSeconds(),
	}
	writeProblem(w, r, p)
}

// addressKey is the key of a source address in the unauthenticated
// limiter: the address for IPv4, its /64 for IPv6 (one host usually holds
// a whole /64).
func addressKey(a netip.Addr) string {
	if a.Is6() {
		if p, err := a.Prefix(64); err == nil {
			return p.String()
		}
	}
	return a.String()
}

// streamCounts counts the watch streams each identity holds open.
type streamCounts struct {
	max  int
	mu   sync.Mutex
	open map[string]int
}

// acquire counts a stream of key unless key holds max already; it returns
// how many key holds after the call.
func (c *streamCounts) acquire(key string) (n int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n = c.open[key]
	if n >= c.max {
		return n, false
	}
	c.open[key] = n + 1
	return n + 1, true
}

func (c *streamCounts) release(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[key]--; c.open[key] <= 0 {
		delete(c.open, key)
	}
}

// watchStreamsRetryAfter is the Retry-After (seconds) of a watch refused
// for the identity's stream limit: no stream is known to end sooner.
const watchStreamsRetryAfter = 10

// refuseStreams answers 429 for a watch beyond the identity's stream
// limit. The RateLimit-* headers say the limit and that none remain;
// the policy has no window of its own, so it names the retry hint.
func (s *Server) refuseStreams(w http.ResponseWriter, r *http.Request, key string, open int) {
	s.metrics.rateLimited.WithLabelValues("watch_streams").Inc()
	h := w.Header()
	max := s.limits.streams.max
	h.Set("RateLimit-Limit", strconv.Itoa(max))
	h.Set("RateLimit-Remaining", "0")
	h.Set("RateLimit-Reset", strconv.Itoa(watchStreamsRetryAfter))
	h.Set("RateLimit-Policy", strconv.Itoa(max)+";w="+strconv.Itoa(watchStreamsRetryAfter))
	p := problem(http.StatusTooManyRequests, "rate-limited",
		fmt.Sprintf("%s holds %d watch streams on this server, the most allowed; close one, or retry in %d s", key, open, watchStreamsRetryAfter))
	p.retryAfter = watchStreamsRetryAfter
	p.Extensions = map[string]any{"check": policy.CheckRateLimit, "limit": max, "remaining": 0}
	writeProblem(w, r, p)
}

// Lease renewals are limited per identity like the other hot paths, but a
// renewal refused for load must never cost a live lease: a
// fleet of 10,000 instances renewing every 10 s under one workload
// identity sends 1,000 renewals a second, past the 600 of the default
// LeaseRenewals. So the identity's bucket grows with the live leases it
// registered, counted in PostgreSQL (registry.LeasesRegisteredBy, an
// index of live leases by identity): each adds one renewal to the
// bucket's capacity (the whole fleet renewing at once) and
// renewalsPerLease per lease TTL to its refill. The count is read only
// when it matters: when the identity's bucket refuses a renewal and the
// count it was sized by is older than renewalCountFresh (or there is
// none), and when it is older than a lease TTL (an identity whose fleet
// has gone does not keep its allowance). Growth is credited at once
// (policy.Buckets.TakeSized). Each replica counts its own requests but
// sizes by the region's count, so however a load balancer spreads an
// identity's renewals, each replica allows the whole fleet.
//
// A client renewing each lease every TTL/3 (three per TTL) is then never
// refused: it needs 3 per lease per TTL of the 4 it gets, on top of the
// base limit, and a lease registered since the last count is counted
// before its first renewal can be refused (renewalCountFresh is below
// TTL/3). Leases renewed by an identity other than the one that
// registered them are not counted for it: it has the base limit, and
// batches (a batch of 1,000 costs 101). What is refused all the same is
// noted (registry.NoteRefusedRenewals) and applied later, so that it
// never expires a lease either.
const (
	// renewalsPerLease is the renewals per lease TTL each live lease adds
	// to its identity's refill: a client renews every TTL/3, and one more
	// is headroom for a retry.
	renewalsPerLease = 4
	// renewalCountFresh: a count younger than this is not read again when
	// the identity is refused. Below a third of the default 30 s TTL.
	renewalCountFresh = 5 * time.Second
	// renewalsPerToken is how many leases of a batch one token pays for:
	// a batch is one transaction of four statements, however many it
	// names.
	renewalsPerToken = 10
)

// renewalBatchCost is what a batch naming n leases costs up front.
func renewalBatchCost(n int) int { return 1 + (n+renewalsPerToken-1)/renewalsPerToken }

// leaseCounter counts the live leases an identity registered: the
// registry.
type leaseCounter interface {
	LeasesRegisteredBy(ctx context.Context, registeredBy string) (int, error)
	LeaseTTL() time.Duration
}

// renewalLimiter is the lease renewal limit: a bucket per identity of
// Limits.LeaseRenewals, grown by the live leases the identity registered.
type renewalLimiter struct {
	buckets *policy.Buckets
	now     func() time.Time

	mu    sync.Mutex
	sized map[string]*leaseCount // identities whose leases were counted
}

// leaseCount is one identity's count of live leases.
type leaseCount struct {
	reading sync.Mutex // one read of the count at a time

	mu sync.Mutex
	n  int
	at time.Time // when n was read
}

func (c *leaseCount) get() (int, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.at
}

// maxSizedIdentities is the count of identities above which those whose
// count is older than a lease TTL are forgotten (they are read again when
// they next matter).
const maxSizedIdentities = 10_000

// allowance is what n live leases add to their identity's bucket.
func allowance(n int, ttl time.Duration) policy.Limit {
	if n <= 0 {
		return policy.Limit{}
	}
	return policy.Limit{Max: n, Window: ttl / renewalsPerLease}
}

// take takes n tokens from key's bucket, sized by the leases key
// registered (see renewalLimiter). A count that cannot be read leaves the
// identity with the allowance it had; the error is returned with the
// decision, to be logged.
func (l *renewalLimiter) take(ctx context.Context, leases leaseCounter, key string, n int) (policy.Decision, error) {
	ttl := leases.LeaseTTL()
	l.mu.Lock()
	c := l.sized[key]
	l.mu.Unlock()
	var (
		count int
		at    time.Time
	)
	if c != nil {
		count, at = c.get()
	}
	d := l.buckets.TakeSized(key, n, allowance(count, ttl))
	now := l.now()
	switch {
	case d.Allowed && (c == nil || now.Sub(at) < ttl):
		return d, nil
	case !d.Allowed && c != nil && now.Sub(at) < renewalCountFresh:
		return d, nil
	}
	count, err := l.count(ctx, leases, key, ttl)
	if d.Allowed || err != nil {
		return d, err // refreshed for what comes next
	}
	return l.buckets.TakeSized(key, n, allowance(count, ttl)), nil
}

// count reads key's live leases, unless another request has just done so.
func (l *renewalLimiter) count(ctx context.Context, leases leaseCounter, key string, ttl time.Duration) (int, error) {
	now := l.now()
	l.mu.Lock()
	c := l.sized[key]
	if c == nil {
		if len(l.sized) >= maxSizedIdentities {
			for k, c := range l.sized {
				if _, at := c.get(); now.Sub(at) >= ttl {
					delete(l.sized, k)
				}
			}
		}
		c = &leaseCount{}
		l.sized[key] = c
	}
	l.mu.Unlock()
	c.reading.Lock()
	defer c.reading.Unlock()
	if n, at := c.get(); !at.IsZero() && now.Sub(at) < renewalCountFresh {
		return n, nil
	}
	n, err := leases.LeasesRegisteredBy(ctx, key)
	if err != nil {
		n, _ = c.get()
		return n, err
	}
	c.mu.Lock()
	c.n, c.at = n, now
	c.mu.Unlock()
	return n, nil
}

// allowRenewals takes cost tokens for actor's renewal of renewals (sized
// by its leases), setting the RateLimit-* headers. Refused, it notes the
// renewals as refused for load (the registry applies them later, as it
// would have then: the request is shed, the lease is not) and answers
// 429; false then.
func (s *Server) allowRenewals(w http.ResponseWriter, r *http.Request, actor identity.Principal, cost int, renewals []registry.LeaseRenewal) bool {
	key := actor.String()
	d, err := s.limits.renewals.take(r.Context(), s.cfg.Registry, key, cost)
	if err != nil {
		s.log.Warn("count live leases for the renewal limit", "actor", key, "err", err)
	}
	setRateLimit(w.Header(), d)
	if d.Allowed {
		return true
	}
	s.cfg.Registry.NoteRefusedRenewals(actor, renewals)
	s.refuseLimited(w, r, d, "lease_renewals", fmt.Sprintf("%s has made %d lease renewals within %s, the most allowed for it now (the limit grows with the live leases it registered); "+
		"the refused renewals are kept and will be applied, but retry in %d s", actor, d.Limit.Max, d.Limit.Window.Round(time.Second), d.ResetSeconds()))
	return false
}
