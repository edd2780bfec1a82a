package identity

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Sentinel errors. Verify's errors wrap exactly one of ErrNoToken,
// ErrInvalidToken or ErrIssuerUnavailable (ErrUnknownIssuer errors also wrap
// ErrInvalidToken), or are the caller's context error.
var (
	// ErrNoToken means the request presented no bearer token.
	ErrNoToken = errors.New("no bearer token")
	// ErrInvalidToken means the token was presented and refused. The error's
	// text is a short reason that is safe to show the caller.
	ErrInvalidToken = errors.New("invalid token")
	// ErrUnknownIssuer means the token names an issuer that is not
	// configured. Errors wrapping it also wrap ErrInvalidToken.
	ErrUnknownIssuer = errors.New("unknown issuer")
	// ErrIssuerUnavailable means a configured issuer could not be reached to
	// discover it or fetch its keys; the token was not judged. It is the
	// server's problem, not the caller's (503, not 401).
	ErrIssuerUnavailable = errors.New("issuer unavailable")
)

// DefaultAudience is the audience muster's tokens are addressed to unless
// an issuer is configured with another.
const DefaultAudience = "muster"

const (
	// discoveryTimeout bounds one discovery request, independent of the
	// request that triggered it.
	discoveryTimeout = 10 * time.Second
	// discoveryRetryInterval is the least time between a failed discovery and
	// the next attempt for the same issuer, so a down issuer is not hammered
	// once per incoming request.
	discoveryRetryInterval = 5 * time.Second
	// defaultHTTPTimeout applies when NewVerifier is given no client; key set
	// refreshes made by go-oidc run on a background context, so the client's
	// timeout is their only deadline.
	defaultHTTPTimeout = 10 * time.Second
	// maxTokenBytes is far above any real token (a Kubernetes service account
	// token is about 1 KiB) and keeps parsing cheap.
	maxTokenBytes = 16 << 10
)

// routingAlgs are the signature algorithms go-oidc can verify. Tokens with
// any other "alg" (notably "none" and HMAC) are refused as malformed before
// any issuer is contacted.
func routingAlgs() []jose.SignatureAlgorithm {
	return []jose.SignatureAlgorithm{
		jose.RS256, jose.RS384, jose.RS512,
		jose.ES256, jose.ES384, jose.ES512,
		jose.PS256, jose.PS384, jose.PS512,
		jose.EdDSA,
	}
}

// IssuerConfig names an OIDC issuer whose tokens muster accepts.
type IssuerConfig struct {
	// URL is the issuer identifier; tokens' "iss" must equal it exactly and
	// discovery is fetched from URL + "/.well-known/openid-configuration".
	// It must be https, or http on a loopback host (the dev issuer).
	URL string
	// Audience must appear in tokens' "aud"; "muster" when empty.
	Audience string
	// Mapping, when set, reads the platform's own claims instead of
	// muster's (a Kubernetes service-account issuer, AWS web identity):
	// the issuer is then trusted for mapped workloads only.
	Mapping *ClaimMapping
	// Kinds, when set, are the only kinds of principal the issuer is
	// trusted for (an issuer of workload tokens should never mint an
	// operator); a token claiming another kind is refused.
	Kinds []Kind
	// Keys, when set, are the issuer's public keys (RS256): tokens are
	// checked against them and nothing is discovered or fetched. For the
	// dev issuer, whose key is a file in the data folder.
	Keys []crypto.PublicKey
	// LoopbackPath, when set (with Keys), makes the issuer trusted under
	// every http URL on a loopback host with this path, whatever the
	// port: every `muster dev` process on one data folder signs with the
	// folder's key under its own address, and they are one issuer, so a
	// token one of them (or `muster token`) minted is good at all of them.
	// Its principals are home when URL is the home issuer.
	LoopbackPath string
}

// Verifier authenticates bearer tokens against a fixed set of OIDC issuers.
// It is safe for concurrent use.
type Verifier struct {
	issuers map[string]*issuerState
	home    string // the first issuer's URL
	client  *http.Client
	now     func() time.Time
	// verified remembers accepted tokens by digest (see verifiedCache).
	verified *verifiedCache
}

// issuerState is the lazily discovered verifier of one issuer, with the
// bookkeeping that rate-limits rediscovery after a failure.
type issuerState struct {
	url      string
	audience string
	mapping  *ClaimMapping
	kinds    []Kind
	// keys, when set, verify every token (no discovery); loopbackPath
	// extends the issuer to every loopback URL with that path.
	keys         oidc.KeySet
	loopbackPath string

	mu       sync.Mutex
	provider *oidc.Provider
	verifier *oidc.IDTokenVerifier // nil until discovery succeeds
	lastErr  error                 // cause of the last failed discovery
	failedAt time.Time             // when lastErr happened
	pending  chan struct{}         // non-nil while a discovery runs; closed when it ends
}

// NewVerifier returns a Verifier for issuers, using client for discovery and
// key fetches. A nil client means one with a 10 s timeout; a client without
// a timeout is not recommended, since go-oidc fetches keys on a background
// context. No network call is made until the first token of each issuer.
func NewVerifier(issuers []IssuerConfig, client *http.Client) (*Verifier, error) {
	return newVerifier(issuers, client, time.Now)
}

// newVerifier is NewVerifier with the clock injected, for tests of expiry and
// of the discovery retry interval.
func newVerifier(issuers []IssuerConfig, client *http.Client, now func() time.Time) (*Verifier, error) {
	if len(issuers) == 0 {
		return nil, errors.New("new verifier: no issuers configured")
	}
	if client == nil {
		client = &http.Client{Timeout: defaultHTTPTimeout}
	}
	v := &Verifier{
		issuers:  make(map[string]*issuerState, len(issuers)),
		client:   client,
		now:      now,
		verified: newVerifiedCache(verifiedMax),
	}
	for i, ic := range issuers {
		if err := ValidateIssuerURL(ic.URL); err != nil {
			return nil, fmt.Errorf("new verifier: issuer %d: %w", i, err)
		}
		if _, dup := v.issuers[ic.URL]; dup {
			return nil, fmt.Errorf("new verifier: issuer %q configured twice", ic.URL)
		}
		aud := ic.Audience
		if aud == "" {
			aud = DefaultAudience
		}
		if strings.TrimSpace(aud) != aud {
			return nil, fmt.Errorf("new verifier: issuer %q: audience %q has surrounding space", ic.URL, aud)
		}
		if ic.Mapping != nil {
			m := *ic.Mapping
			if err := m.Validate(); err != nil {
				return nil, fmt.Errorf("new verifier: issuer %q: %w", ic.URL, err)
			}
			ic.Mapping = &m
		}
		for _, k := range ic.Kinds {
			if _, err := ParseKind(string(k)); err != nil {
				return nil, fmt.Errorf("new verifier: issuer %q: %w", ic.URL, err)
			}
		}
		st := &issuerState{url: ic.URL, audience: aud, mapping: ic.Mapping, kinds: ic.Kinds}
		if len(ic.Keys) > 0 {
			st.keys = &oidc.StaticKeySet{PublicKeys: slices.Clone(ic.Keys)}
		}
		if ic.LoopbackPath != "" {
			if st.keys == nil || !strings.HasPrefix(ic.LoopbackPath, "/") {
				return nil, fmt.Errorf("new verifier: issuer %q: a loopback path needs Keys and must begin with /", ic.URL)
			}
			st.loopbackPath = ic.LoopbackPath
		}
		v.issuers[ic.URL] = st
	}
	v.home = issuers[0].URL
	return v, nil
}

// loopbackFamily finds the issuer whose LoopbackPath covers iss: http or
// https (a dev process serving TLS) on a
// loopback host, any port, exactly that path, nothing else.
func (v *Verifier) loopbackFamily(iss string) (*issuerState, bool) {
	u, err := url.Parse(iss)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || !loopbackHost(u.Hostname()) || u.User != nil || u.RawQuery != "" ||
		u.Fragment != "" || u.ForceQuery || strings.Contains(iss, "#") || u.Port() == "" {
		return nil, false
	}
	for _, st := range v.issuers {
		if st.loopbackPath != "" && u.Path == st.loopbackPath {
			return st, true
		}
	}
	return nil, false
}

// ValidateIssuerURL accepts an absolute https URL, or http on a loopback
// host: keys fetched over plain http from another host could be swapped in
// transit, which would let anyone mint tokens.
func ValidateIssuerURL(raw string) error {
	if raw == "" {
		return errors.New("issuer URL is empty")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("parse issuer URL: %w", err)
	}
	if u.Host == "" || u.Opaque != "" {
		return fmt.Errorf("issuer URL %q is not absolute", raw)
	}
	// '#' is checked on the raw text: an empty fragment leaves no trace in
	// u, and principals of other issuers are named "issuer#kind:subject".
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery || strings.Contains(raw, "#") {
		return fmt.Errorf("issuer URL %q has user info, a query or a fragment", raw)
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !loopbackHost(u.Hostname()) {
			return fmt.Errorf("issuer URL %q uses http on a non-loopback host; use https", raw)
		}
	default:
		return fmt.Errorf("issuer URL %q: scheme must be https", raw)
	}
	return nil
}

func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Verify authenticates raw, a compact JWT, and returns the principal it
// names. The unverified "iss" only routes the token to a configured issuer;
// signature, issuer, audience, expiry and not-before are then checked by
// go-oidc with that issuer's published keys, and muster's claims by the
// rules in the package documentation.
//
// Errors wrap ErrNoToken, ErrInvalidToken (with ErrUnknownIssuer for an
// unconfigured issuer) or ErrIssuerUnavailable, or are ctx's error. They
// never contain the token.
func (v *Verifier) Verify(ctx context.Context, raw string) (Principal, error) {
	if raw == "" {
		return Principal{}, ErrNoToken
	}
	if len(raw) > maxTokenBytes {
		return Principal{}, invalidAs(FailureMalformed, "token too large")
	}
	key := tokenKey(raw)
	if p, ok := v.verified.get(key, v.now()); ok {
		return p, nil
	}
	iss, err := unverifiedIssuer(raw)
	if err != nil {
		return Principal{}, invalidAs(FailureMalformed, err.Error())
	}
	st, ok := v.issuers[iss]
	if !ok {
		st, ok = v.loopbackFamily(iss)
	}
	if !ok {
		return Principal{}, fmt.Errorf("issuer %s: %w: %w", QuoteClaim(iss), ErrUnknownIssuer, ErrInvalidToken)
	}
	var idv *oidc.IDTokenVerifier
	if st.keys != nil {
		// Checked against iss itself: go-oidc requires the token's iss
		// to equal it, and iss is one of the issuer's URLs.
		idv = oidc.NewVerifier(iss, st.keys, &oidc.Config{ClientID: st.audience, Now: v.now, SupportedSigningAlgs: []string{oidc.RS256}})
	} else if idv, err = v.tokenVerifier(ctx, st); err != nil {
		return Principal{}, err
	}
	tok, err := idv.Verify(ctx, raw)
	if err != nil {
		return Principal{}, v.verifyError(ctx, st, err)
	}
	var claims map[string]json.RawMessage
	if err := tok.Claims(&claims); err != nil {
		return Principal{}, invalid("malformed claims")
	}
	var p Principal
	if st.mapping != nil {
		if p, err = st.mapping.principal(tok.Issuer, tok.Subject, claims); err != nil {
			return Principal{}, invalid(err.Error())
		}
	} else {
		cs, err := decodeClaims(claims)
		if err != nil {
			return Principal{}, invalid(err.Error())
		}
		if p, err = NewPrincipal(tok.Issuer, tok.Subject, cs); err != nil {
			return Principal{}, invalid(err.Error())
		}
	}
	if len(st.kinds) > 0 && !slices.Contains(st.kinds, p.Kind) {
		return Principal{}, invalid(fmt.Sprintf("issuer is not trusted for kind %s", p.Kind))
	}
	p.Home, p.Expiry = tok.Issuer == v.home || st == v.issuers[v.home], tok.Expiry
	v.verified.put(key, p, v.now())
	return p, nil
}

// Known returns the principal of a token this verifier accepted before
// and may still reuse (within the token's lifetime, and at most 5 min
// after it was last verified), without any signature check or network
// call. The server serves such a token even while its source address is
// refused for a flood of invalid ones.
func (v *Verifier) Known(raw string) (Principal, bool) {
	if raw == "" || len(raw) > maxTokenBytes {
		return Principal{}, false
	}
	return v.verified.get(tokenKey(raw), v.now())
}

// Home is the URL of the home issuer, the first configured: its
// principals are named without it (Principal.String).
func (v *Verifier) Home() string { return v.home }

// invalid returns an ErrInvalidToken error with a reason safe to show.
func invalid(reason string) error {
	return invalidAs(FailureInvalid, reason)
}

// invalidAs is invalid with the code FailureCode reports for it.
func invalidAs(code, reason string) error {
	return &invalidError{code: code, reason: reason}
}

// invalidError is an ErrInvalidToken with its failure code.
type invalidError struct{ code, reason string }

func (e *invalidError) Error() string { return e.reason + ": " + ErrInvalidToken.Error() }
func (e *invalidError) Unwrap() error { return ErrInvalidToken }

// Failure codes (FailureCode): why a token was refused, coarse enough to
// count and to put on the audit record, never the token itself.
const (
	FailureMissing       = "missing"        // no bearer token
	FailureMalformed     = "malformed"      // not a signed JWT, or no issuer
	FailureBadSignature  = "bad_signature"  // a signature the issuer's keys do not verify: forged
	FailureExpired       = "expired"        // past its exp
	FailureUnknownIssuer = "unknown_issuer" // an issuer muster does not trust
	FailureInvalid       = "invalid"        // any other refusal (audience, claims, kind, not yet valid)
	FailureUnavailable   = "issuer_unavailable"
)

// FailureCode says why Verify refused a token, as one of the Failure
// codes ("" for nil, FailureInvalid for an error it does not know).
func FailureCode(err error) string {
	var ie *invalidError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrNoToken):
		return FailureMissing
	case errors.Is(err, ErrUnknownIssuer):
		return FailureUnknownIssuer
	case errors.Is(err, ErrIssuerUnavailable):
		return FailureUnavailable
	case errors.As(err, &ie):
		return ie.code
	}
	return FailureInvalid
}

// unverifiedIssuer reads "iss" without checking the signature. Its only use
// is choosing which issuer's keys to verify with; go-oidc then checks that
// "iss" matches that issuer, so a lie here only ever fails verification.
func unverifiedIssuer(raw string) (string, error) {
	tok, err := jwt.ParseSigned(raw, routingAlgs())
	if err != nil {
		return "", errors.New("malformed token")
	}
	var c struct {
		Issuer string `json:"iss"`
	}
	if err := tok.UnsafeClaimsWithoutVerification(&c); err != nil {
		return "", errors.New("malformed token")
	}
	if c.Issuer == "" {
		return "", errors.New("missing issuer")
	}
	return c.Issuer, nil
}

// tokenVerifier returns the issuer's go-oidc verifier, discovering the issuer
// on first use. At most one discovery per issuer runs at a time; concurrent
// callers wait for it. After a failure, callers get the same error without a
// new attempt until discoveryRetryInterval has passed.
//
// Discovery runs in its own goroutine on a context detached from ctx, with
// its own timeout: one impatient caller giving up must not fail discovery
// for everyone (and start the retry interval). The caller only stops waiting.
func (v *Verifier) tokenVerifier(ctx context.Context, st *issuerState) (*oidc.IDTokenVerifier, error) {
	for {
		st.mu.Lock()
		if st.verifier != nil {
			idv := st.verifier
			st.mu.Unlock()
			return idv, nil
		}
		if st.pending == nil {
			if st.lastErr != nil && v.now().Sub(st.failedAt) < discoveryRetryInterval {
				err := st.lastErr
				st.mu.Unlock()
				return nil, fmt.Errorf("discover issuer %s: %w: %w", st.url, err, ErrIssuerUnavailable)
			}
			st.pending = make(chan struct{})
			go v.discover(context.WithoutCancel(ctx), st, st.pending)
		}
		pending := st.pending
		st.mu.Unlock()

		select {
		case <-pending:
			// Loop: the verifier is cached now, or lastErr is fresh.
		case <-ctx.Done():
			return nil, fmt.Errorf("discover issuer %s: %w", st.url, ctx.Err())
		}
	}
}

// discover fetches the issuer's discovery document and records the outcome
// in st, then closes done. The mutex is not held during the HTTP call.
func (v *Verifier) discover(ctx context.Context, st *issuerState, done chan struct{}) {
	ctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
	defer cancel()

	provider, err := oidc.NewProvider(oidc.ClientContext(ctx, v.client), st.url)
	var idv *oidc.IDTokenVerifier
	if err == nil {
		idv, err = v.newTokenVerifier(provider, st)
	}

	st.mu.Lock()
	defer st.mu.Unlock()
	if err != nil {
		st.lastErr = err
		st.failedAt = v.now()
	} else {
		st.provider, st.verifier, st.lastErr = provider, idv, nil
	}
	st.pending = nil
	close(done)
}

// newTokenVerifier builds the issuer's go-oidc verifier over a keySet of
// muster's own rather than the provider's RemoteKeySet, which refetches
// the key set for every token with an unknown key ID. Now is the injected
// clock so expiry is testable.
func (v *Verifier) newTokenVerifier(provider *oidc.Provider, st *issuerState) (*oidc.IDTokenVerifier, error) {
	var meta struct {
		JWKSURI string   `json:"jwks_uri"`
		Algs    []string `json:"id_token_signing_alg_values_supported"`
	}
	if err := provider.Claims(&meta); err != nil {
		return nil, fmt.Errorf("read discovery document: %w", err)
	}
	if meta.JWKSURI == "" {
		return nil, errors.New("discovery document has no jwks_uri")
	}
	// As go-oidc's Provider.Verifier does: the algorithms the issuer
	// announces that can be verified, RS256 when it announces none.
	var algs []string
	for _, a := range meta.Algs {
		if routingAlg(a) {
			algs = append(algs, a)
		}
	}
	ks := newKeySet(meta.JWKSURI, v.client, v.now)
	return oidc.NewVerifier(st.url, ks, &oidc.Config{ClientID: st.audience, Now: v.now, SupportedSigningAlgs: algs}), nil
}

// verifyError turns a go-oidc verification error into a short reason. go-oidc
// formats its errors with %v, so apart from expiry they can only be told
// apart by their text; the tests pin each case, so an upgrade that changes
// the wording fails them rather than silently degrading reasons to the
// generic one. The go-oidc text itself is not passed on: it may quote claims.
func (v *Verifier) verifyError(ctx context.Context, st *issuerState, err error) error {
	var expired *oidc.TokenExpiredError
	if errors.As(err, &expired) {
		return invalidAs(FailureExpired, "token expired")
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "fetching keys"):
		// The issuer's key set could not be fetched (or ctx ended while
		// waiting for it): nothing is known about the token.
		if ctx.Err() != nil {
			return fmt.Errorf("fetch keys of issuer %s: %w", st.url, ctx.Err())
		}
		return fmt.Errorf("fetch keys of issuer %s: %w", st.url, ErrIssuerUnavailable)
	case strings.Contains(msg, "malformed jwt"), strings.Contains(msg, "not signed"),
		strings.Contains(msg, "multiple signatures"):
		return invalidAs(FailureMalformed, "malformed token")
	case strings.Contains(msg, "failed to verify signature"):
		return invalidAs(FailureBadSignature, "bad signature")
	case strings.Contains(msg, "expected audience"):
		return invalid("wrong audience")
	case strings.Contains(msg, "before the nbf"):
		return invalid("token not yet valid")
	case strings.Contains(msg, "different provider"):
		return invalid("issuer mismatch")
	}
	return invalid("token rejected")
}

// decodeClaims extracts muster's claims by exact name. encoding/json would
// match struct fields case-insensitively, letting "Muster_Role" stand in for
// "muster_role" at an issuer that only guards the exact spelling.
func decodeClaims(m map[string]json.RawMessage) (Claims, error) {
	var c Claims
	for _, f := range []struct {
		name string
		dst  any
	}{
		{ClaimKind, &c.Kind},
		{ClaimService, &c.Service},
		{ClaimTeam, &c.Team},
		{ClaimRole, &c.Role},
		{ClaimAddresses, &c.Addresses},
	} {
		raw, ok := m[f.name]
		if !ok {
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return Claims{}, fmt.Errorf("claim %s has the wrong type", f.name)
		}
	}
	return c, nil
}
