// Package peer authenticates one muster replica to another: the relay of
// published views, the forwarding of evidence and the authorisation copy
// travel between replicas of one region, and each replica must know that
// what it reads or ingests came from another replica of the region, meant
// for it, once, not from a caller claiming to be one.
//
// Replicas of a region share its signing key (the seal key: the same one
// that seals instances, overrides, shifts and the replicas' own rows). A
// request from a replica carries the Header (Muster-Peer):
//
//	Muster-Peer: <sender> <receiver> <signed at> <nonce> <key id> <signature>
//
// the sending replica's id, the receiving replica's name (its id, or the
// base URL it advertises when the sender knows it only by address: a
// configured peer), the signing time in unix milliseconds, a random
// 128-bit nonce and the signature, both base64 (RFC 4648 §5, no padding),
// and the key's id. The Ed25519 signature covers the method, the path
// with its query, the SHA-256 of the body, the signing time, the sender,
// the receiver, the nonce and the key id (RFC 9421's idea: bind the
// request's parts and its audience).
//
// A receiver accepts a request when the header is in its one canonical
// form (the exact text Sign writes: any other spelling of the same
// numbers or bytes is refused as malformed, so no two texts carry one
// signature), its signing time is within MaxSkew of the receiver's clock,
// the key is one it trusts (the region's keys: a rotation keeps working
// while both keys are trusted), the signature verifies, it names this
// replica as the receiver (a request meant for one replica is refused by
// every other), and neither its signature nor its nonce was seen within
// the window (a captured request cannot be replayed).
//
// The header of the release before (HeaderV1, Muster-Replica: sender,
// time, key id, signature over method, path, time, sender and body) names
// no receiver and no nonce. It is refused (reason legacy) unless the
// verifier is told to accept it during a rolling upgrade from that release
// (MUSTER_PEER_TRUST=upgrade), when a Signer also sends it beside the new
// one so that the older replicas accept its requests.
//
// No key, no peers: a region without a signing key cannot authenticate
// its replicas, so relaying and forwarding are off (and muster says so
// at start); one replica then works alone as before.
package peer

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/seal"
)

// Header is the request header that carries a replica's proof.
const Header = "Muster-Peer"

// HeaderV1 is the header of the release before, which names neither the
// receiver nor a nonce: accepted, and sent beside Header, only during a
// rolling upgrade from that release (Signer.V1, Verifier.AcceptV1).
const HeaderV1 = "Muster-Replica"

// Seal domains: a request's signature can pass for nothing else, and a
// v1 signature never for a v2 one.
const (
	domainV1 = "peer.request"
	domain   = "muster peer request v2"
)

// MaxSkew is how far a request's signing time may be from the receiver's
// clock by default. Replicas' clocks drift apart (muster raises
// clock_skew from 2 s), and two replicas whose clocks are a minute apart
// must still relay and forward to each other: nothing they exchange is
// judged by the sender's clock (forwarded evidence is translated with
// SignedAt), so the window only bounds replay, and every signature seen
// is remembered for the whole of it.
const MaxSkew = 2 * time.Minute

// DefaultMaxSeen bounds how many verified requests a Verifier remembers
// (their signatures and nonces). Only requests that verified are
// remembered, so only the region's own replicas fill it, at the rate of
// their genuine traffic: a forwarder sends a peer at most about 20
// requests a second (50 ms batches), so ten replicas send each other
// about 180 a second, 21,600 in a 2-minute window. Past the bound the
// oldest are forgotten and the window is shortened to what is still
// remembered (see Verifier), never a replay let through.
const DefaultMaxSeen = 100_000

// ErrNotPeer is wrapped by every error Verify returns.
var ErrNotPeer = errors.New("not a request from a replica of this region")

// Reasons a request is refused, the label of
// muster_peer_requests_refused_total.
const (
	ReasonMissing       = "missing"        // no header
	ReasonMalformed     = "malformed"      // not the one canonical form
	ReasonStale         = "stale"          // signed too far from this replica's clock
	ReasonUntrustedKey  = "untrusted_key"  // a key this replica does not trust (or it has none)
	ReasonBadSignature  = "bad_signature"  // the signature does not match the request
	ReasonReplayed      = "replayed"       // its signature or nonce was seen within the window
	ReasonWrongReceiver = "wrong_receiver" // signed for another replica
	ReasonLegacy        = "legacy"         // only the release before's header, while it is not accepted
)

// Reasons lists every reason, in the order of the constants.
var Reasons = []string{ReasonMissing, ReasonMalformed, ReasonStale, ReasonUntrustedKey, ReasonBadSignature, ReasonReplayed, ReasonWrongReceiver, ReasonLegacy}

// RefusedError is why Verify refused a request. It wraps ErrNotPeer.
type RefusedError struct {
	Reason string // one of Reasons
	Detail string
}

func (e *RefusedError) Error() string { return ErrNotPeer.Error() + ": " + e.Detail }

// Unwrap makes errors.Is(err, ErrNotPeer) hold.
func (e *RefusedError) Unwrap() error { return ErrNotPeer }

func refuse(reason, format string, args ...any) error {
	return &RefusedError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Reason is the reason err (from Verify) gives, "" when it is none of
// Verify's refusals.
func Reason(err error) string {
	var re *RefusedError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}

// The encodings of the nonce and the signature: base64url without
// padding, strict (the unused bits of the last character must be zero).
// Strictness alone is not enough (the decoder skips CR and LF), so a
// value is also checked to be exactly what encoding its bytes gives.
var b64 = base64.RawURLEncoding.Strict()

const (
	nonceSize = 16
	nonceLen  = 22 // base64 characters of 16 bytes
	sigLen    = 86 // of 64
	// maxToken bounds the sender, receiver and key id: an id, a base
	// URL or a hex key id.
	maxToken = 512
)

// ValidName reports whether s can name a replica in the Header: 1 to 512
// printable ASCII characters, no space. Replica ids, base URLs and key
// ids are such names.
func ValidName(s string) bool {
	if s == "" || len(s) > maxToken {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// Signature is a parsed Header.
type Signature struct {
	Sender, Receiver string
	// At is the signing time, unix milliseconds on the sender's clock.
	At    int64
	Nonce [nonceSize]byte
	KeyID string
	Sig   [ed25519.SignatureSize]byte
}

// String is the header's one canonical text.
func (s Signature) String() string {
	return strings.Join([]string{s.Sender, s.Receiver, strconv.FormatInt(s.At, 10),
		b64.EncodeToString(s.Nonce[:]), s.KeyID, b64.EncodeToString(s.Sig[:])}, " ")
}

// ParseHeader parses a Header value in its canonical form only: six
// parts separated by single spaces; names as ValidName allows; the time
// a non-negative decimal without a sign or leading zeros; the nonce 16
// and the signature 64 bytes, each in base64url without padding exactly
// as encoding its bytes writes it. Anything else is an error, so one
// signature has exactly one text.
func ParseHeader(h string) (Signature, error) {
	var s Signature
	parts := strings.Split(h, " ")
	if len(parts) != 6 {
		return s, fmt.Errorf("%d space-separated parts, want 6 (sender receiver time nonce key signature)", len(parts))
	}
	for i, name := range []string{"sender", "receiver", "", "", "key id"} {
		if name != "" && !ValidName(parts[i]) {
			return s, fmt.Errorf("the %s is not 1 to %d printable characters", name, maxToken)
		}
	}
	s.Sender, s.Receiver, s.KeyID = parts[0], parts[1], parts[4]
	at, ok := canonicalMillis(parts[2])
	if !ok {
		return s, errors.New("the signing time is not unix milliseconds in decimal")
	}
	s.At = at
	if !canonical(parts[3], nonceLen, s.Nonce[:]) {
		return s, errors.New("the nonce is not 16 bytes in canonical base64url")
	}
	if !canonical(parts[5], sigLen, s.Sig[:]) {
		return s, errors.New("the signature is not 64 bytes in canonical base64url")
	}
	return s, nil
}

// canonicalMillis parses a non-negative decimal with no sign and no
// leading zero.
func canonicalMillis(v string) (int64, bool) {
	if v == "" || len(v) > 19 || (len(v) > 1 && v[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// canonical decodes v into out (whose length is the byte count wanted)
// when v is exactly the encoding of len(out) bytes.
func canonical(v string, chars int, out []byte) bool {
	if len(v) != chars {
		return false
	}
	b, err := b64.DecodeString(v)
	if err != nil || len(b) != len(out) || b64.EncodeToString(b) != v {
		return false
	}
	copy(out, b)
	return true
}

// message is what a v2 signature covers.
type message struct {
	Method   string `json:"method"`
	Target   string `json:"target"`
	Body     string `json:"body"`
	At       int64  `json:"at"`
	Sender   string `json:"sender"`
	Receiver string `json:"receiver"`
	Nonce    string `json:"nonce"`
	Key      string `json:"key"`
}

// messageV1 is what the release before's signature covers.
type messageV1 struct {
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

func (s Signature) message(r *http.Request, body []byte) message {
	return message{Method: r.Method, Target: target(r), Body: bodyHash(body), At: s.At, Sender: s.Sender,
		Receiver: s.Receiver, Nonce: b64.EncodeToString(s.Nonce[:]), Key: s.KeyID}
}

// Signer signs requests as replica ID.
type Signer struct {
	ID  string
	Key seal.Signer
	Now func() time.Time
	// V1 also adds the release before's header (HeaderV1), so that
	// replicas of that release accept the request during a rolling
	// upgrade (MUSTER_PEER_TRUST=upgrade). Never set in strict mode.
	V1 bool
	// Rand is where nonces come from: crypto/rand when nil.
	Rand io.Reader
}

// Sign adds the Header to r, whose body is body (nil for none), for the
// replica named to: the id the receiver has in the replicas table, or the
// base URL it advertises when only that is known (a configured peer).
func (s Signer) Sign(ctx context.Context, r *http.Request, to string, body []byte) error {
	switch {
	case s.Key == nil || s.ID == "":
		return errors.New("peer: a replica needs an id and the region's signing key to sign")
	case !ValidName(s.ID):
		return fmt.Errorf("peer: replica id %q cannot be sent: want 1 to %d printable characters without spaces", s.ID, maxToken)
	case !ValidName(to):
		return fmt.Errorf("peer: the receiver %q cannot be named: want 1 to %d printable characters without spaces", to, maxToken)
	case !ValidName(s.Key.KeyID()):
		return fmt.Errorf("peer: key id %q cannot be sent", s.Key.KeyID())
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	rnd := s.Rand
	if rnd == nil {
		rnd = rand.Reader
	}
	sig := Signature{Sender: s.ID, Receiver: to, At: now().UnixMilli(), KeyID: s.Key.KeyID()}
	if _, err := io.ReadFull(rnd, sig.Nonce[:]); err != nil {
		return fmt.Errorf("peer: draw a nonce: %w", err)
	}
	b, kid, err := seal.Sign(ctx, s.Key, domain, sig.message(r, body))
	if err != nil {
		return err
	}
	if kid != sig.KeyID || len(b) != ed25519.SignatureSize {
		return fmt.Errorf("peer: the key signed as %q with %d bytes, want %q with %d", kid, len(b), sig.KeyID, ed25519.SignatureSize)
	}
	copy(sig.Sig[:], b)
	r.Header.Set(Header, sig.String())
	if s.V1 {
		m := messageV1{Method: r.Method, Target: target(r), At: sig.At, Replica: s.ID, Body: bodyHash(body)}
		b, kid, err := seal.Sign(ctx, s.Key, domainV1, m)
		if err != nil {
			return err
		}
		r.Header.Set(HeaderV1, strings.Join([]string{m.Replica, strconv.FormatInt(m.At, 10), kid, base64.RawURLEncoding.EncodeToString(b)}, " "))
	} else {
		r.Header.Del(HeaderV1)
	}
	return nil
}

// Signed reports whether r carries either header (it may still be
// refused).
func Signed(r *http.Request) bool {
	return len(r.Header.Values(Header)) > 0 || len(r.Header.Values(HeaderV1)) > 0
}

// SignedAt is the signing time r's header carries: the sending replica's
// clock when it signed. Only meaningful once Verify accepted r. The
// receiver's clock minus it is how far the sender's clock is behind the
// receiver's, transit included: a time the sender stamped on its own
// clock plus that is the same moment on the receiver's.
func SignedAt(r *http.Request) (time.Time, bool) {
	if v := r.Header.Values(Header); len(v) == 1 {
		s, err := ParseHeader(v[0])
		if err != nil {
			return time.Time{}, false
		}
		return time.UnixMilli(s.At), true
	}
	parts := strings.Split(r.Header.Get(HeaderV1), " ")
	if len(parts) < 4 {
		return time.Time{}, false
	}
	at, ok := canonicalMillis(parts[1])
	if !ok {
		return time.Time{}, false
	}
	return time.UnixMilli(at), true
}

// NewRefusedCounter registers muster_peer_requests_refused_total{reason}
// with reg (nil: registered nowhere), every reason at 0, for
// Verifier.Refused.
func NewRefusedCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_peer_requests_refused_total",
		Help: "Requests to the replica-to-replica routes refused, by reason: missing, malformed, stale, untrusted_key, bad_signature, replayed, wrong_receiver, legacy (docs/replicas.md, \"Peer requests\")."},
		[]string{"reason"})
	for _, r := range Reasons {
		c.WithLabelValues(r)
	}
	if reg != nil {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// NewAcceptedCounter registers muster_peer_requests_accepted_total{header}
// (v2, or v1: the release before's, accepted only in upgrade mode): once
// v1 stops rising on every replica, no replica of the release before is
// left and the region can be rolled to strict.
func NewAcceptedCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_peer_requests_accepted_total",
		Help: "Requests from the region's replicas accepted, by header: v2 (Muster-Peer), or v1 (Muster-Replica, the release before's, accepted only with MUSTER_PEER_TRUST=upgrade)."},
		[]string{"header"})
	c.WithLabelValues("v1")
	c.WithLabelValues("v2")
	if reg != nil {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Verifier checks requests from replicas.
type Verifier struct {
	// Keys are the keys a replica's signature is trusted from (the
	// region's). With none, Verify refuses everything.
	Keys func() seal.Keys
	// Self are the names this replica answers to as a receiver: its
	// replica id and the base URL it advertises (without a trailing
	// slash). A request naming any other receiver is refused.
	Self []string
	// AcceptV1 also accepts the release before's header when a request
	// carries no v2 one (MUSTER_PEER_TRUST=upgrade).
	AcceptV1 bool
	// MaxSkew: MaxSkew by default.
	MaxSkew time.Duration
	// MaxSeen bounds the requests remembered: DefaultMaxSeen by default.
	MaxSeen int
	Now     func() time.Time
	// Refused and Accepted count requests (NewRefusedCounter,
	// NewAcceptedCounter); nil counts nothing.
	Refused, Accepted *prometheus.CounterVec

	mu sync.Mutex
	// sigs and nonces remember the requests that verified, by their
	// decoded signature and nonce, each with its signing time (unix ms).
	sigs   map[[ed25519.SignatureSize]byte]int64
	nonces map[[nonceSize]byte]int64
	// floor: requests signed at or before it are refused, because the
	// cache was full and forgot requests signed then.
	floor int64
	swept time.Time
}

// Verify checks r (whose body is body) and returns the replica it came
// from. It fails, with a *RefusedError wrapping ErrNotPeer, when the
// header is missing or not canonical, the time is too far off, the key
// is not trusted, the signature does not match, the request names
// another receiver, or it was seen before; every refusal is counted by
// reason.
func (v *Verifier) Verify(r *http.Request, body []byte) (string, error) {
	id, version, err := v.verify(r, body)
	if err != nil {
		if v.Refused != nil {
			v.Refused.WithLabelValues(Reason(err)).Inc()
		}
		return "", err
	}
	if v.Accepted != nil {
		v.Accepted.WithLabelValues(version).Inc()
	}
	return id, nil
}

func (v *Verifier) verify(r *http.Request, body []byte) (string, string, error) {
	h2, h1 := r.Header.Values(Header), r.Header.Values(HeaderV1)
	switch {
	case len(h2) > 1:
		return "", "", refuse(ReasonMalformed, "%d %s headers, want one", len(h2), Header)
	case len(h2) == 1:
		// A v1 header sent beside it (upgrade mode) is remembered with
		// it: stripped of the v2 header, the request must not pass as
		// a v1 one at a replica that accepts those.
		var also *[ed25519.SignatureSize]byte
		if len(h1) == 1 {
			if parts := strings.Split(h1[0], " "); len(parts) >= 4 {
				var sig [ed25519.SignatureSize]byte
				if canonical(parts[3], sigLen, sig[:]) {
					also = &sig
				}
			}
		}
		id, err := v.verifyV2(r, h2[0], also, body)
		return id, "v2", err
	case len(h1) == 0:
		return "", "", refuse(ReasonMissing, "no %s header", Header)
	case !v.AcceptV1:
		return "", "", refuse(ReasonLegacy, "only the %s header of an earlier release, which names no receiver and no nonce; it is accepted only with MUSTER_PEER_TRUST=upgrade", HeaderV1)
	case len(h1) > 1:
		return "", "", refuse(ReasonMalformed, "%d %s headers, want one", len(h1), HeaderV1)
	}
	id, err := v.verifyV1(r, h1[0], body)
	return id, "v1", err
}

func (v *Verifier) verifyV2(r *http.Request, h string, also *[ed25519.SignatureSize]byte, body []byte) (string, error) {
	s, err := ParseHeader(h)
	if err != nil {
		return "", refuse(ReasonMalformed, "a malformed %s header: %v", Header, err)
	}
	now, skew, err := v.fresh(s.At)
	if err != nil {
		return "", err
	}
	if err := v.check(domain, s.message(r, body), s.Sig[:], s.KeyID); err != nil {
		return "", err
	}
	if !slices.Contains(v.Self, s.Receiver) {
		return "", refuse(ReasonWrongReceiver, "signed for replica %q, not this one (%s)", s.Receiver, strings.Join(v.Self, ", "))
	}
	if err := v.remember(s.Sig, &s.Nonce, also, s.At, now, skew); err != nil {
		return "", err
	}
	return s.Sender, nil
}

// verifyV1 checks the release before's header: four parts (more are
// ignored, as that release ignored them), the signature in canonical
// base64url, remembered by its bytes.
func (v *Verifier) verifyV1(r *http.Request, h string, body []byte) (string, error) {
	parts := strings.Split(h, " ")
	if len(parts) < 4 || !ValidName(parts[0]) || !ValidName(parts[2]) {
		return "", refuse(ReasonMalformed, "a malformed %s header", HeaderV1)
	}
	at, ok := canonicalMillis(parts[1])
	if !ok {
		return "", refuse(ReasonMalformed, "a malformed signing time")
	}
	var sig [ed25519.SignatureSize]byte
	if !canonical(parts[3], sigLen, sig[:]) {
		return "", refuse(ReasonMalformed, "a malformed signature: not 64 bytes in canonical base64url")
	}
	now, skew, err := v.fresh(at)
	if err != nil {
		return "", err
	}
	m := messageV1{Method: r.Method, Target: target(r), At: at, Replica: parts[0], Body: bodyHash(body)}
	if err := v.check(domainV1, m, sig[:], parts[2]); err != nil {
		return "", err
	}
	if err := v.remember(sig, nil, nil, at, now, skew); err != nil {
		return "", err
	}
	return m.Replica, nil
}

// fresh checks the signing time against this replica's clock.
func (v *Verifier) fresh(at int64) (time.Time, time.Duration, error) {
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
		return t, skew, refuse(ReasonStale, "signed %s from this replica's clock (at most %s allowed)", d.Round(time.Millisecond), skew)
	}
	return t, skew, nil
}

// check verifies sig over m under the key named kid.
func (v *Verifier) check(dom string, m any, sig []byte, kid string) error {
	var keys seal.Keys
	if v.Keys != nil {
		keys = v.Keys()
	}
	if len(keys) == 0 {
		return refuse(ReasonUntrustedKey, "this region has no signing key, so replicas cannot prove themselves")
	}
	err := keys.Verify(dom, m, sig, &kid)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, seal.ErrUnknownKey):
		return refuse(ReasonUntrustedKey, "%v", err)
	case errors.Is(err, seal.ErrBadSeal):
		return refuse(ReasonBadSignature, "the signature does not match the request")
	}
	return refuse(ReasonBadSignature, "%v", err)
}

// remember refuses a request whose signature or nonce was seen within
// the window, or that is signed at or before the floor, and otherwise
// remembers it (and also, a v1 signature it carried beside its own)
// until its signing time leaves the window.
func (v *Verifier) remember(sig [ed25519.SignatureSize]byte, nonce *[nonceSize]byte, also *[ed25519.SignatureSize]byte, at int64, now time.Time, skew time.Duration) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sigs == nil {
		v.sigs, v.nonces = map[[ed25519.SignatureSize]byte]int64{}, map[[nonceSize]byte]int64{}
	}
	if now.Sub(v.swept) > time.Second {
		v.swept = now
		oldest := now.Add(-skew).UnixMilli() // signed before it: stale anyway
		for k, t := range v.sigs {
			if t < oldest {
				delete(v.sigs, k)
			}
		}
		for k, t := range v.nonces {
			if t < oldest {
				delete(v.nonces, k)
			}
		}
	}
	if _, dup := v.sigs[sig]; dup {
		return refuse(ReasonReplayed, "a request replayed (its signature was seen)")
	}
	if nonce != nil {
		if _, dup := v.nonces[*nonce]; dup {
			return refuse(ReasonReplayed, "a request replayed (its nonce was seen)")
		}
	}
	limit := v.MaxSeen
	if limit <= 0 {
		limit = DefaultMaxSeen
	}
	if len(v.sigs) >= limit {
		v.evict(limit * 9 / 10)
	}
	if at <= v.floor {
		return refuse(ReasonStale, "signed at %d ms, no later than requests this replica had to forget (its replay cache of %d is full): send a fresh one", at, limit)
	}
	v.sigs[sig] = at
	if nonce != nil {
		v.nonces[*nonce] = at
	}
	if also != nil {
		v.sigs[*also] = at
	}
	return nil
}

// evict forgets the oldest requests until at most keep are remembered,
// and raises the floor to the newest signing time forgotten: a replay of
// a forgotten request is then refused as stale, never accepted.
func (v *Verifier) evict(keep int) {
	times := make([]int64, 0, len(v.sigs))
	for _, t := range v.sigs {
		times = append(times, t)
	}
	slices.Sort(times)
	keep = min(max(keep, 0), len(times)-1)
	cut := times[len(times)-keep-1] // forget everything signed at or before it
	v.floor = max(v.floor, cut)
	for k, t := range v.sigs {
		if t <= cut {
			delete(v.sigs, k)
		}
	}
	for k, t := range v.nonces {
		if t <= cut {
			delete(v.nonces, k)
		}
	}
}
