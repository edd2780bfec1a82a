package breakglass

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/seal"
	bgworker "github.com/musterhq/muster/internal/worker"
)

// Bounds of acceptance.
const (
	// Leeway is how far a replica's clock may be behind the one that
	// issued a grant (or ahead of it) without refusing its token early.
	Leeway = 30 * time.Second
	// DefaultCacheFor is how long a grant row read is reused: the bound on
	// how late a revocation (or a deleted or edited row) is honoured.
	DefaultCacheFor = 5 * time.Second
	// DefaultWatchEvery is how often the live grants are listed for the
	// alarms.
	DefaultWatchEvery = 10 * time.Second
	// refusalAuditEvery bounds the audit rows of one grant's refusals for
	// one reason on one replica (a script retrying a revoked token).
	refusalAuditEvery = time.Minute
)

// Failure codes of break-glass refusals beyond identity's: the server
// counts (muster_auth_failures_total) and audits them by code.
const (
	FailureNoGrant  = "breakglass_no_grant"  // signed by the region's key, and its grant row is gone
	FailureRevoked  = "breakglass_revoked"   // its grant was revoked
	FailureUnsealed = "breakglass_unsealed"  // its grant row's seal does not verify, or says something else than the token
	FailureNoKey    = "breakglass_no_key"    // this replica holds no key to check it with
	failureDB       = "breakglass_db_unread" // the row could not be read (counted only: answered 503)
)

// Alarm kinds.
const (
	// AlarmActive is open while a break-glass grant is live.
	AlarmActive = "breakglass_active"
	// AlarmUnsealed is open while a live grant row's seal does not verify
	// (written outside muster); its token is refused.
	AlarmUnsealed = "breakglass_unsealed"
)

// Config configures a Service.
type Config struct {
	Pool   *pgxpool.Pool
	Region string
	// Keys are the keys a grant's token and row must be signed by: the
	// region's signing key and a rotation's public keys. Empty: every
	// break-glass token is refused.
	Keys seal.Keys
	// Audience is the "aud" tokens must carry: identity.DefaultAudience
	// when empty.
	Audience string
	// CacheFor and WatchEvery: DefaultCacheFor, DefaultWatchEvery.
	CacheFor, WatchEvery time.Duration
	Now                  func() time.Time
	Logger               *slog.Logger
	Registerer           prometheus.Registerer
}

// Service accepts break-glass tokens (Wrap) and raises the alarms of the
// live grants (Start, Alarms). It is safe for concurrent use.
type Service struct {
	cfg    Config
	log    *slog.Logger
	runner bgworker.Runner

	refusals *prometheus.CounterVec
	accepted prometheus.Counter

	mu      sync.Mutex
	cache   map[uuid.UUID]cached
	used    map[uuid.UUID]bool
	audited map[string]time.Time // grant id + code -> last refusal audited
	alarms  []assembler.Alarm
	ends    []time.Time // alarms[i] closes at ends[i]
}

type cached struct {
	s     stored
	found bool
	at    time.Time
}

// New returns a stopped Service.
func New(cfg Config) (*Service, error) {
	if cfg.Pool == nil {
		return nil, errors.New("breakglass: Pool is required")
	}
	if cfg.Audience == "" {
		cfg.Audience = identity.DefaultAudience
	}
	if cfg.CacheFor == 0 {
		cfg.CacheFor = DefaultCacheFor
	}
	if cfg.WatchEvery == 0 {
		cfg.WatchEvery = DefaultWatchEvery
	}
	if cfg.CacheFor < 0 || cfg.WatchEvery < 0 {
		return nil, errors.New("breakglass: CacheFor and WatchEvery must not be negative")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, log: cfg.Logger.With("worker", "breakglass"),
		cache: map[uuid.UUID]cached{}, used: map[uuid.UUID]bool{}, audited: map[string]time.Time{},
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_breakglass_refusals_total",
			Help: "Break-glass tokens refused, by reason (docs/identity.md)."}, []string{"reason"}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{Name: "muster_breakglass_accepted_total",
			Help: "Requests authenticated by a break-glass token (docs/identity.md)."}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{s.refusals, s.accepted} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// Inner is the authenticator a Service stands in front of (the server's
// identity.Verifier).
type Inner interface {
	Verify(ctx context.Context, raw string) (identity.Principal, error)
}

// Authenticator takes this region's break-glass tokens and hands every
// other token to the authenticator it wraps.
type Authenticator struct {
	s    *Service
	next Inner
}

// Wrap returns next behind s.
func (s *Service) Wrap(next Inner) *Authenticator { return &Authenticator{s: s, next: next} }

// Verify implements the server's Authenticator.
func (a *Authenticator) Verify(ctx context.Context, raw string) (identity.Principal, error) {
	if unverifiedIssuer(raw) != Issuer(a.s.cfg.Region) {
		return a.next.Verify(ctx, raw)
	}
	return a.s.Verify(ctx, raw)
}

// Known implements the server's KnownTokens for the wrapped verifier's
// tokens. A break-glass token is never "known": from an address refused
// for a flood of bad tokens it waits like any unknown token.
func (a *Authenticator) Known(raw string) (identity.Principal, bool) {
	k, ok := a.next.(interface {
		Known(string) (identity.Principal, bool)
	})
	if !ok || unverifiedIssuer(raw) == Issuer(a.s.cfg.Region) {
		return identity.Principal{}, false
	}
	return k.Known(raw)
}

// Verify checks a break-glass token and returns its operator principal.
// Its errors are identity.Refusal errors (401), or wrap
// identity.ErrIssuerUnavailable while the grant cannot be read (503).
func (s *Service) Verify(ctx context.Context, raw string) (identity.Principal, error) {
	p, c, code, err := s.check(ctx, raw)
	if err != nil {
		s.refusals.WithLabelValues(code).Inc()
		if c != nil && code != failureDB {
			s.auditRefusal(ctx, c, code, err)
		}
		return identity.Principal{}, err
	}
	s.accepted.Inc()
	s.noteUse(ctx, c)
	return p, nil
}

// check does Verify's work. c is the token's claims once its signature
// verified (nil before).
func (s *Service) check(ctx context.Context, raw string) (identity.Principal, *claims, string, error) {
	refuse := func(code, reason string) (identity.Principal, *claims, string, error) {
		return identity.Principal{}, nil, code, identity.Refusal(code, reason)
	}
	if len(s.cfg.Keys) == 0 {
		return refuse(FailureNoKey, "break-glass token refused: this replica holds no signing key to check it with")
	}
	if len(raw) > maxTokenBytes {
		return refuse(identity.FailureMalformed, "token too large")
	}
	jws, err := jose.ParseSignedCompact(raw, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil || len(jws.Signatures) != 1 {
		return refuse(identity.FailureMalformed, "malformed break-glass token")
	}
	pub, ok := s.cfg.Keys[jws.Signatures[0].Header.KeyID]
	if !ok || len(pub) != ed25519.PublicKeySize {
		return refuse(identity.FailureBadSignature, "break-glass token signed by a key this region does not trust")
	}
	payload, err := jws.Verify(pub)
	if err != nil {
		return refuse(identity.FailureBadSignature, "bad signature")
	}
	var c claims
	if err := json.Unmarshal(payload, &c); err != nil {
		return refuse(identity.FailureMalformed, "malformed break-glass claims")
	}
	// From here on the token is one the region's key signed: a refusal
	// is about a real grant, and is audited under it.
	refuseGrant := func(code, reason string) (identity.Principal, *claims, string, error) {
		return identity.Principal{}, &c, code, identity.Refusal(code, reason)
	}
	now := s.cfg.Now()
	switch {
	case c.Issuer != Issuer(s.cfg.Region):
		return refuseGrant(identity.FailureInvalid, "issuer mismatch")
	case c.Audience != s.cfg.Audience:
		return refuseGrant(identity.FailureInvalid, "wrong audience")
	case c.Kind != string(identity.KindOperator):
		return refuseGrant(identity.FailureInvalid, "not an operator's token")
	case !now.Before(time.Unix(c.Expiry, 0).Add(Leeway)):
		return refuseGrant(identity.FailureExpired, "token expired")
	case now.Add(Leeway).Before(time.Unix(c.NotUntil, 0)):
		return refuseGrant(identity.FailureInvalid, "token not yet valid")
	}
	id, err := uuid.Parse(c.ID)
	if err != nil {
		return refuseGrant(identity.FailureMalformed, "malformed break-glass grant id")
	}
	g, found, err := s.grant(ctx, id, now)
	if err != nil {
		return identity.Principal{}, &c, failureDB, fmt.Errorf("read break-glass grant: %w", identity.ErrIssuerUnavailable)
	}
	if !found {
		return refuseGrant(FailureNoGrant, fmt.Sprintf("break-glass grant %s does not exist", id))
	}
	if err := g.verify(s.cfg.Keys); err != nil {
		return refuseGrant(FailureUnsealed, fmt.Sprintf("break-glass grant %s is not as muster wrote it: %v", id, err))
	}
	if g.Region != s.cfg.Region || g.Operator != c.Subject || string(g.Role) != c.Role || g.ExpiresAt.Unix() != c.Expiry {
		return refuseGrant(FailureUnsealed, fmt.Sprintf("break-glass grant %s does not match the token", id))
	}
	if g.RevokedAt != nil {
		return refuseGrant(FailureRevoked, fmt.Sprintf("break-glass grant %s was revoked at %s", id, g.RevokedAt.Format(time.RFC3339)))
	}
	return identity.Principal{Issuer: PrincipalIssuer, Subject: g.Operator, Kind: identity.KindOperator, Role: g.Role,
		Expiry: g.ExpiresAt.Add(Leeway)}, &c, "", nil
}

// grant reads grant id, from the cache while its entry is younger than
// CacheFor.
func (s *Service) grant(ctx context.Context, id uuid.UUID, now time.Time) (stored, bool, error) {
	s.mu.Lock()
	e, ok := s.cache[id]
	s.mu.Unlock()
	if ok && now.Sub(e.at) < s.cfg.CacheFor && !now.Before(e.at) {
		return e.s, e.found, nil
	}
	g, err := get(ctx, s.cfg.Pool, id)
	found := err == nil
	if err != nil && !errors.Is(err, ErrNotFound) {
		s.log.Warn("read a break-glass grant", "grant", id, "err", err)
		return stored{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Only validly signed tokens reach here, so the cache holds no more
	// entries than grants were issued; entries past a grant's life go.
	for k, old := range s.cache {
		if now.Sub(old.at) > MaxTTL+Leeway {
			delete(s.cache, k)
		}
	}
	s.cache[id] = cached{s: g, found: found, at: now}
	return g, found, nil
}

// noteUse audits a grant's first use at this replica.
func (s *Service) noteUse(ctx context.Context, c *claims) {
	id, _ := uuid.Parse(c.ID)
	s.mu.Lock()
	done := s.used[id]
	s.mu.Unlock()
	if done {
		return
	}
	actor := identity.Principal{Issuer: PrincipalIssuer, Subject: c.Subject, Kind: identity.KindOperator}.String()
	if s.append(ctx, audit.Entry{ActorKind: string(identity.KindOperator), Actor: actor, Action: "breakglass.use",
		TargetKind: "breakglass_grant", Target: c.ID, Outcome: audit.Accepted,
		Reason: fmt.Sprintf("first request under break-glass grant %s (%s) at this replica", c.ID, c.Role)}) {
		s.mu.Lock()
		s.used[id] = true
		s.mu.Unlock()
	}
}

// auditRefusal writes the refusal of a real grant's token, at most once
// per grant and code per refusalAuditEvery.
func (s *Service) auditRefusal(ctx context.Context, c *claims, code string, err error) {
	key := c.ID + "\x00" + code
	now := s.cfg.Now()
	s.mu.Lock()
	last, seen := s.audited[key]
	if seen && now.Sub(last) < refusalAuditEvery && !now.Before(last) {
		s.mu.Unlock()
		return
	}
	s.audited[key] = now
	for k, t := range s.audited {
		if now.Sub(t) > refusalAuditEvery {
			delete(s.audited, k)
		}
	}
	s.mu.Unlock()
	actor := identity.Principal{Issuer: PrincipalIssuer, Subject: c.Subject, Kind: identity.KindOperator}.String()
	reason := code + ": " + err.Error()
	s.append(ctx, audit.Entry{ActorKind: string(identity.KindOperator), Actor: actor, Action: "breakglass.refuse",
		TargetKind: "breakglass_grant", Target: c.ID, Outcome: audit.Refused, Reason: reason})
}

// append writes e on its own, within a short deadline of its own: a
// request's authentication must not wait long on the audit log.
func (s *Service) append(ctx context.Context, e audit.Entry) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if _, err := audit.AppendAlone(ctx, s.cfg.Pool, s.cfg.Now(), e); err != nil {
		s.log.Warn("audit a break-glass event", "action", e.Action, "grant", e.Target, "err", err)
		return false
	}
	return true
}
