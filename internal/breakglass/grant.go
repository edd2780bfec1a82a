package breakglass

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/seal"
)

// Bounds of a grant.
const (
	// DefaultTTL is a grant's life unless asked otherwise: long enough to
	// set up the identity provider, short enough that a forgotten token
	// is soon worthless.
	DefaultTTL = time.Hour
	// MaxTTL caps it: break glass is for getting in, not for working in.
	MaxTTL = 4 * time.Hour
	// maxReason bounds the reason as the table's CHECK does.
	maxReason = 1024
)

// sealDomain names the table and the version of the sealed encoding.
const sealDomain = "muster/breakglass_grants/v1"

// Errors of the store. Issue's validation errors wrap ErrInvalid.
var (
	ErrInvalid  = errors.New("invalid break-glass request")
	ErrNotFound = errors.New("no such break-glass grant")
	ErrRevoked  = errors.New("break-glass grant already revoked")
	ErrNoKey    = errors.New("break glass needs the region's signing key (MUSTER_AUDIT_SIGNING_KEY_FILE)")
)

// operatorName is the table's CHECK on operator: a name that is safe in
// the audit log and in a principal's name.
var operatorName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$`)

// Grant is one break-glass grant.
type Grant struct {
	ID       uuid.UUID     `json:"id"`
	Region   string        `json:"region"`
	Operator string        `json:"operator"`
	Role     identity.Role `json:"role"`
	Reason   string        `json:"reason"`
	// IssuedBy is who ran `muster breakglass`: the OS user and host.
	IssuedBy  string     `json:"issued_by"`
	IssuedAt  time.Time  `json:"issued_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	RevokedBy string     `json:"revoked_by,omitempty"`
}

// Live reports whether g allows anything at now.
func (g Grant) Live(now time.Time) bool { return g.RevokedAt == nil && now.Before(g.ExpiresAt) }

// sealed is what a grant's seal covers: everything that decides what
// its token may do. revoked_at is left out: setting it can only refuse.
type sealed struct {
	ID        string `json:"id"`
	Region    string `json:"region"`
	Operator  string `json:"operator"`
	Role      string `json:"role"`
	Reason    string `json:"reason"`
	IssuedBy  string `json:"issued_by"`
	IssuedAt  int64  `json:"issued_at_us"`
	ExpiresAt int64  `json:"expires_at_us"`
}

func sealedOf(g Grant) sealed {
	return sealed{ID: g.ID.String(), Region: g.Region, Operator: g.Operator, Role: string(g.Role), Reason: g.Reason,
		IssuedBy: g.IssuedBy, IssuedAt: g.IssuedAt.UnixMicro(), ExpiresAt: g.ExpiresAt.UnixMicro()}
}

// stored is a row with its seal, converted at the edge.
type stored struct {
	Grant
	seal    []byte
	sealKey string
}

func fromRow(r db.BreakglassGrant) stored {
	g := Grant{ID: r.ID, Region: r.Region, Operator: r.Operator, Role: identity.Role(r.Role), Reason: r.Reason,
		IssuedBy: r.IssuedBy, IssuedAt: r.IssuedAt.UTC(), ExpiresAt: r.ExpiresAt.UTC(), RevokedAt: r.RevokedAt}
	if r.RevokedBy != nil {
		g.RevokedBy = *r.RevokedBy
	}
	if g.RevokedAt != nil {
		t := g.RevokedAt.UTC()
		g.RevokedAt = &t
	}
	return stored{Grant: g, seal: r.Seal, sealKey: r.SealKey}
}

// verify checks the row's seal with keys; empty keys verify nothing here
// (unlike seal.Keys.Verify): a grant is only ever as good as its seal.
func (s stored) verify(keys seal.Keys) error {
	if len(keys) == 0 {
		return seal.ErrUnknownKey
	}
	k := s.sealKey
	return keys.Verify(sealDomain, sealedOf(s.Grant), s.seal, &k)
}

// Request is what `muster breakglass` asks for.
type Request struct {
	Operator string
	Reason   string
	// Role is admin when empty.
	Role identity.Role
	// TTL is DefaultTTL when zero; at most MaxTTL.
	TTL time.Duration
	// IssuedBy names who ran the command (OS user@host).
	IssuedBy string
	// Audience is the token's "aud": identity.DefaultAudience when empty.
	Audience string
}

// Validate checks r, filling its defaults. Its errors wrap ErrInvalid
// and say what to change.
func (r *Request) Validate() error {
	if !operatorName.MatchString(r.Operator) {
		return fmt.Errorf("%w: --operator %s: want a name of letters, digits and . _ @ - (at most 128), e.g. alice or alice@example.com", ErrInvalid, identity.QuoteClaim(r.Operator))
	}
	r.Reason = strings.TrimSpace(r.Reason)
	if r.Reason == "" {
		return fmt.Errorf("%w: --reason is required: say why the glass is broken (it goes on the audit record and the alarm)", ErrInvalid)
	}
	if len(r.Reason) > maxReason || !utf8.ValidString(r.Reason) || strings.IndexFunc(r.Reason, unicode.IsControl) >= 0 {
		return fmt.Errorf("%w: --reason must be one line of printable text of at most %d bytes", ErrInvalid, maxReason)
	}
	if r.Role == "" {
		r.Role = identity.RoleAdmin
	}
	if _, err := identity.ParseRole(string(r.Role)); err != nil {
		return fmt.Errorf("%w: --role: %w (viewer, operator or admin)", ErrInvalid, err)
	}
	if r.TTL == 0 {
		r.TTL = DefaultTTL
	}
	if r.TTL < time.Minute || r.TTL > MaxTTL {
		return fmt.Errorf("%w: --ttl %s: want 1m to %s", ErrInvalid, r.TTL, MaxTTL)
	}
	if r.IssuedBy == "" || len(r.IssuedBy) > 256 || strings.IndexFunc(r.IssuedBy, unicode.IsControl) >= 0 {
		return fmt.Errorf("%w: issued-by %s", ErrInvalid, identity.QuoteClaim(r.IssuedBy))
	}
	if r.Audience == "" {
		r.Audience = identity.DefaultAudience
	}
	return nil
}

// Issue records a grant for r in region, sealed by signer, with its audit
// row in the same transaction, and returns it with its token. The expiry
// is a whole second (a JWT's exp is), at or before now + TTL.
func Issue(ctx context.Context, pool *pgxpool.Pool, signer seal.Signer, region string, r Request, now time.Time) (Grant, string, error) {
	if signer == nil {
		return Grant{}, "", ErrNoKey
	}
	if err := r.Validate(); err != nil {
		return Grant{}, "", err
	}
	now = now.UTC().Truncate(time.Microsecond)
	g := Grant{ID: uuid.New(), Region: region, Operator: r.Operator, Role: r.Role, Reason: r.Reason, IssuedBy: r.IssuedBy,
		IssuedAt: now, ExpiresAt: now.Add(r.TTL).Truncate(time.Second)}
	sig, kid, err := seal.Sign(ctx, signer, sealDomain, sealedOf(g))
	if err != nil {
		return Grant{}, "", err
	}
	tok, err := mint(ctx, signer, g, r.Audience)
	if err != nil {
		return Grant{}, "", err
	}
	err = db.WithTx(ctx, pool, func(q *db.Queries) error {
		if _, err := q.BreakGlassInsert(ctx, db.BreakGlassInsertParams{ID: g.ID, Region: g.Region, Operator: g.Operator,
			Role: string(g.Role), Reason: g.Reason, IssuedBy: g.IssuedBy, IssuedAt: g.IssuedAt, ExpiresAt: g.ExpiresAt,
			Seal: sig, SealKey: kid}); err != nil {
			return fmt.Errorf("record break-glass grant: %w", err)
		}
		_, err := audit.Append(ctx, q, now, audit.Entry{ActorKind: "tool", Actor: toolActor(r.IssuedBy), Action: "breakglass.issue",
			TargetKind: "breakglass_grant", Target: g.ID.String(), Outcome: audit.Accepted,
			Reason: fmt.Sprintf("break-glass %s grant for %s until %s: %s", g.Role, g.Operator, g.ExpiresAt.Format(time.RFC3339), g.Reason),
			After:  g})
		return err
	})
	if err != nil {
		return Grant{}, "", err
	}
	return g, tok, nil
}

// toolActor names the person at the pod's shell in the audit log.
func toolActor(by string) string { return "tool:breakglass:" + by }

// Revoke ends grant id at now, audited as by.
func Revoke(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID, by string, now time.Time) (Grant, error) {
	now = now.UTC().Truncate(time.Microsecond)
	var g Grant
	err := db.WithTx(ctx, pool, func(q *db.Queries) error {
		row, err := q.BreakGlassRevoke(ctx, db.BreakGlassRevokeParams{ID: id, RevokedAt: &now, RevokedBy: &by})
		if errors.Is(err, pgx.ErrNoRows) {
			if _, err := q.BreakGlassGet(ctx, id); errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: %s", ErrNotFound, id)
			} else if err != nil {
				return err
			}
			return fmt.Errorf("%w: %s", ErrRevoked, id)
		}
		if err != nil {
			return fmt.Errorf("revoke break-glass grant %s: %w", id, err)
		}
		g = fromRow(row).Grant
		_, err = audit.Append(ctx, q, now, audit.Entry{ActorKind: "tool", Actor: toolActor(by), Action: "breakglass.revoke",
			TargetKind: "breakglass_grant", Target: id.String(), Outcome: audit.Accepted,
			Reason: fmt.Sprintf("break-glass grant for %s revoked", g.Operator), After: g})
		return err
	})
	return g, err
}

// Listed is a grant as List shows it: with whether its seal verifies
// under the keys given.
type Listed struct {
	Grant
	// SealErr is why the row's seal does not verify; nil when it does.
	SealErr error `json:"-"`
}

// List returns the grants issued since since, newest first (at most max).
func List(ctx context.Context, pool *pgxpool.Pool, keys seal.Keys, since time.Time, max int) ([]Listed, error) {
	rows, err := db.New(pool).BreakGlassList(ctx, db.BreakGlassListParams{Since: since, MaxRows: int32(max)})
	if err != nil {
		return nil, fmt.Errorf("list break-glass grants: %w", err)
	}
	out := make([]Listed, 0, len(rows))
	for _, r := range rows {
		s := fromRow(r)
		out = append(out, Listed{Grant: s.Grant, SealErr: s.verify(keys)})
	}
	return out, nil
}

// live reads the grants live at now.
func live(ctx context.Context, pool *pgxpool.Pool, now time.Time) ([]stored, error) {
	rows, err := db.New(pool).BreakGlassLive(ctx, now)
	if err != nil {
		return nil, fmt.Errorf("list live break-glass grants: %w", err)
	}
	out := make([]stored, 0, len(rows))
	for _, r := range rows {
		out = append(out, fromRow(r))
	}
	return out, nil
}

// get reads one grant; ErrNotFound when there is no row.
func get(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID) (stored, error) {
	r, err := db.New(pool).BreakGlassGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return stored{}, ErrNotFound
	}
	if err != nil {
		return stored{}, fmt.Errorf("read break-glass grant %s: %w", id, err)
	}
	return fromRow(r), nil
}
