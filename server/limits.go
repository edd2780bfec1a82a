package server

import (
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"sync"

	"github.com/musterhq/muster/internal/policy"
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
	// third of it).
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
	reportItems, reportRequests              *policy.Buckets
	registrations, deregistrations, renewals *policy.Buckets
	unauthenticated                          *policy.Buckets
	streams                                  *streamCounts
}

func newLimiters(l Limits) (limiters, error) {
	var out limiters
	for _, b := range []struct {
		dst **policy.Buckets
		lim policy.Limit
	}{
		{&out.reportItems, l.ReportItems}, {&out.reportRequests, l.ReportRequests},
		{&out.registrations, l.Registrations}, {&out.deregistrations, l.Deregistrations},
		{&out.renewals, l.LeaseRenewals}, {&out.unauthenticated, l.Unauthenticated},
	} {
		var err error
		if *b.dst, err = policy.NewBuckets(b.lim, nil); err != nil {
			return limiters{}, err
		}
	}
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
