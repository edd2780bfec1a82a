// Package peer authenticates one muster replica to another (issue 27):
// the relay of published views and the forwarding of evidence travel
// between replicas of one region, and each replica must know that what
// it reads or ingests came from another replica, not from a caller
// claiming to be one.
//
// Replicas of a region share its signing key (the seal key: the same one
// that seals instances, overrides and shifts). A request from a replica
// carries the Header: its replica id, the time it was signed (unix
// milliseconds), the key id, and an Ed25519 signature over the method,
// the path with its query, the time, the id and the SHA-256 of the body.
// A receiver accepts it when the key is one it trusts (the region's
// keys, so a rotation keeps working while both keys are trusted), the
// time is within MaxSkew of its own clock, and the same signature was not
// seen within that window (a captured request cannot be replayed).
//
// No key, no peers: a region without a signing key cannot authenticate
// its replicas, so relaying and forwarding are off (and muster says so
// at start); one replica then works alone as before.
package peer

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/musterhq/muster/internal/seal"
)

// Header is the request header that carries a replica's proof.
const Header = "Muster-Replica"

// domain is the seal domain of a replica's request.
const domain = "peer.request"

// MaxSkew is how far a request's signing time may be from the receiver's
// clock by default. Replicas' clocks drift apart (muster raises
// clock_skew from 2 s), and two replicas whose clocks are a minute apart
// must still relay and forward to each other: nothing they exchange is
// judged by the sender's clock (forwarded evidence is translated with
// SignedAt), so the window only bounds replay, and every signature seen
// is remembered for the whole of it.
const MaxSkew = 2 * time.Minute

// ErrNotPeer is wrapped by every error Verify returns.
var ErrNotPeer = errors.New("not a request from a replica of this region")

// Signer signs requests as replica ID.
type Signer struct {
	ID  string
	Key seal.Signer
	Now func() time.Time
}

// message is what is signed.
type message struct {
	Method  string `json:"method"`
	Target  string `json:"target"`
	At      int64  `json:"at"`
	Replica string `json:"replica"`
	Body    string `json:"body"`
}

func bodyHash(body []byte) string {
	h := sha256.Sum256(body)
	return hex.EncodeToString(h[:])
}

func target(r *http.Request) string { return r.URL.RequestURI() }

// Sign adds the Header to r, whose body is body (nil for none).
func (s Signer) Sign(ctx context.Context, r *http.Request, body []byte) error {
	if s.Key == nil || s.ID == "" {
		return errors.New("peer: a replica needs an id and the region's signing key to sign")
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	m := message{Method: r.Method, Target: target(r), At: now().UnixMilli(), Replica: s.ID, Body: bodyHash(body)}
	sig, kid, err := seal.Sign(ctx, s.Key, domain, m)
	if err != nil {
		return err
	}
	r.Header.Set(Header, strings.Join([]string{m.Replica, strconv.FormatInt(m.At, 10), kid, base64.RawURLEncoding.EncodeToString(sig)}, " "))
	return nil
}

// SignedAt is the signing time r's Header carries: the sending replica's
// clock when it signed. Only meaningful once Verify accepted r. The
// receiver's clock minus it is how far the sender's clock is behind the
// receiver's, transit included: a time the sender stamped on its own
// clock plus that is the same moment on the receiver's.
func SignedAt(r *http.Request) (time.Time, bool) {
	parts := strings.Split(r.Header.Get(Header), " ")
	if len(parts) != 4 {
		return time.Time{}, false
	}
	at, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(at), true
}

// Verifier checks requests from replicas.
type Verifier struct {
	// Keys are the keys a replica's signature is trusted from (the
	// region's). With none, Verify refuses everything.
	Keys func() seal.Keys
	// MaxSkew: MaxSkew by default.
	MaxSkew time.Duration
	Now     func() time.Time

	mu    sync.Mutex
	seen  map[string]time.Time // signature -> when it may be forgotten
	swept time.Time
}

// Verify checks r (whose body is body) and returns the replica it came
// from. It fails, wrapping ErrNotPeer, when the header is missing or
// malformed, the key is not trusted, the time is too far off, the
// signature does not match, or the request was seen before.
func (v *Verifier) Verify(r *http.Request, body []byte) (string, error) {
	h := r.Header.Get(Header)
	if h == "" {
		return "", fmt.Errorf("%w: no %s header", ErrNotPeer, Header)
	}
	// Parts after the fourth are ignored: a later release may append one
	// (the signature does not cover it, so nothing here may trust it),
	// and a replica of the release before must still take its requests
	// during a rolling upgrade.
	parts := strings.Split(h, " ")
	if len(parts) < 4 || parts[0] == "" {
		return "", fmt.Errorf("%w: a malformed %s header", ErrNotPeer, Header)
	}
	at, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: a malformed signing time", ErrNotPeer)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[3])
	if err != nil {
		return "", fmt.Errorf("%w: a malformed signature", ErrNotPeer)
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	skew := v.MaxSkew
	if skew <= 0 {
		skew = MaxSkew
	}
	t := now()
	if d := t.Sub(time.UnixMilli(at)); d > skew || d < -skew {
		return "", fmt.Errorf("%w: signed %s from this replica's clock (at most %s allowed)", ErrNotPeer, d.Round(time.Millisecond), skew)
	}
	var keys seal.Keys
	if v.Keys != nil {
		keys = v.Keys()
	}
	if len(keys) == 0 {
		return "", fmt.Errorf("%w: this region has no signing key, so replicas cannot prove themselves", ErrNotPeer)
	}
	kid := parts[2]
	m := message{Method: r.Method, Target: target(r), At: at, Replica: parts[0], Body: bodyHash(body)}
	if err := keys.Verify(domain, m, sig, &kid); err != nil {
		return "", fmt.Errorf("%w: %w", ErrNotPeer, err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.seen == nil {
		v.seen = map[string]time.Time{}
	}
	if t.Sub(v.swept) > time.Second {
		v.swept = t
		for k, until := range v.seen {
			if t.After(until) {
				delete(v.seen, k)
			}
		}
	}
	if _, dup := v.seen[parts[3]]; dup {
		return "", fmt.Errorf("%w: a request replayed", ErrNotPeer)
	}
	v.seen[parts[3]] = time.UnixMilli(at).Add(skew)
	return m.Replica, nil
}
