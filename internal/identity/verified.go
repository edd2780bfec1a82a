package identity

import (
	"crypto/sha256"
	"sync"
	"time"
)

// Bounds of the verified-token cache.
const (
	// verifiedFor is the longest a verification is reused: a token is
	// judged afresh at least this often, so a key the issuer withdrew
	// stops vouching for its tokens within it.
	verifiedFor = 5 * time.Minute
	// verifiedMax bounds the cache: a region's workloads, probers and
	// tools hold far fewer live tokens; past it an arbitrary entry makes
	// room (the next use of that token is simply verified again).
	verifiedMax = 100_000
)

// verifiedCache remembers tokens this verifier accepted, by their SHA-256,
// until the token expires or verifiedFor passes, whichever is sooner. It
// serves two ends: a token presented again (every report batch, renewal
// and watch of a workload) costs a hash and a map lookup instead of a
// signature check, and a source address that is being refused for a
// flood of bad tokens can still be served for the good tokens it
// presented before (Known), so an attacker sharing an address with real
// clients (a NAT, a node, a load balancer) cannot lock them out.
//
// Only the digest is kept: the token itself never stays in memory past
// the request, nor in anything this cache could log.
type verifiedCache struct {
	mu      sync.Mutex
	entries map[[sha256.Size]byte]verifiedEntry
	max     int
}

type verifiedEntry struct {
	p     Principal
	until time.Time
}

func newVerifiedCache(max int) *verifiedCache {
	return &verifiedCache{entries: map[[sha256.Size]byte]verifiedEntry{}, max: max}
}

// get returns the principal of a token verified before and still within
// its reuse period at now.
func (c *verifiedCache) get(key [sha256.Size]byte, now time.Time) (Principal, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return Principal{}, false
	}
	if !now.Before(e.until) {
		delete(c.entries, key)
		return Principal{}, false
	}
	return e.p, true
}

// put remembers a token verified at now.
func (c *verifiedCache) put(key [sha256.Size]byte, p Principal, now time.Time) {
	until := now.Add(verifiedFor)
	if !p.Expiry.IsZero() && p.Expiry.Before(until) {
		until = p.Expiry
	}
	if !now.Before(until) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.max {
		// Make room: first whatever has lapsed among a few entries, else
		// one arbitrary entry (map order).
		dropped := false
		n := 0
		for k, e := range c.entries {
			if !now.Before(e.until) {
				delete(c.entries, k)
				dropped = true
			}
			if n++; n >= 16 {
				break
			}
		}
		if !dropped {
			for k := range c.entries {
				delete(c.entries, k)
				break
			}
		}
	}
	c.entries[key] = verifiedEntry{p: p, until: until}
}

// tokenKey is the cache key of a raw token.
func tokenKey(raw string) [sha256.Size]byte { return sha256.Sum256([]byte(raw)) }
