package identity

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Kind is the class of caller a token speaks for. It decides which other
// claims a token may carry; see the claim table in the package documentation.
type Kind string

// The kinds of principal muster knows.
const (
	// KindWorkload is an instance of a service; it is bound to that service.
	KindWorkload Kind = "workload"
	// KindProber is an external health prober; its assignments live in the
	// registry, and it may be bound to a service of its own.
	KindProber Kind = "prober"
	// KindTool is automation (target-group sync, DNS) that reads views and,
	// with a role, may act.
	KindTool Kind = "tool"
	// KindOperator is a human signed in through an OIDC login.
	KindOperator Kind = "operator"
)

// ParseKind returns the Kind named by s. Names are lowercase and matched
// exactly, as they are in tokens.
func ParseKind(s string) (Kind, error) {
	switch k := Kind(s); k {
	case KindWorkload, KindProber, KindTool, KindOperator:
		return k, nil
	}
	return "", fmt.Errorf("unknown kind %s", QuoteClaim(s))
}

// Role is the privilege level of an operator or tool. Roles are ordered:
// viewer < operator < admin.
type Role string

// The roles, from least to most privileged.
const (
	// RoleViewer may read everything the caller is granted and change nothing.
	RoleViewer Role = "viewer"
	// RoleOperator may issue overrides within the disruption budget.
	RoleOperator Role = "operator"
	// RoleAdmin may also change policy and co-sign beyond the budget.
	RoleAdmin Role = "admin"
)

// ParseRole returns the Role named by s. Names are lowercase and matched
// exactly, as they are in tokens.
func ParseRole(s string) (Role, error) {
	if Role(s).rank() == 0 {
		return "", fmt.Errorf("unknown role %s", QuoteClaim(s))
	}
	return Role(s), nil
}

// AtLeast reports whether r grants at least the privileges of min. It fails
// closed: an unknown role on either side is never sufficient.
func (r Role) AtLeast(min Role) bool {
	have, want := r.rank(), min.rank()
	return have > 0 && want > 0 && have >= want
}

func (r Role) rank() int {
	switch r {
	case RoleViewer:
		return 1
	case RoleOperator:
		return 2
	case RoleAdmin:
		return 3
	}
	return 0
}

// Principal is an authenticated caller.
type Principal struct {
	// Issuer is the URL of the issuer that signed the token.
	Issuer string
	// Subject is the token's "sub", unique within Issuer.
	Subject string
	// Kind is the class of caller.
	Kind Kind
	// Service is, for workloads and probers, the service they are bound to
	// (always set for workloads). Empty for other kinds.
	Service string
	// Team is, for operators and tools, the owning team they belong to
	// ("" for none). Empty for other kinds.
	Team string
	// Role is, for operators and tools, their privilege level; RoleViewer
	// unless the token says otherwise. Empty for other kinds.
	Role Role
	// Addresses are the addresses the issuer vouches for; may be empty.
	// IPv4-mapped IPv6 addresses are unmapped so they compare equal to the
	// IPv4 source address of a request.
	Addresses []netip.Addr
	// Home reports that Issuer is muster's home issuer (the first one
	// configured; the dev issuer under muster dev), whose principals are
	// named without it. The Verifier sets it; it is never read from a
	// token.
	Home bool
	// Expiry is when the token that authenticated the principal expires
	// (zero when unknown): a watch stream ends then.
	Expiry time.Time
	// Pod is, for a workload whose token a Kubernetes service-account
	// issuer minted for one pod (ClaimMapping), the pod's UID; Cluster is
	// the reconciliation cluster the issuer belongs to. Together they bind
	// the principal to that pod's reconciled instance: it reports
	// self-health for that instance only. Never read from muster claims.
	Pod, Cluster string
}

// String returns the principal as the audit log, the rate limiters and
// the access log name it: "kind:service/subject" for a caller bound to a
// service, "kind:subject" otherwise, e.g. "workload:web/alice" or
// "operator:oscar", prefixed with "issuer#" when the issuer is not the
// home one, e.g. "https://idp.example#operator:oscar". The same subject at
// two issuers is thus two actors. Service names cannot contain '/', an
// unprefixed name starts with a kind and a prefixed one with "http" (or
// "spiffe://" for a client certificate's workload, TrustDomains), and
// issuer URLs and trust domains cannot contain '#', so the form is
// unambiguous whatever the subject holds.
func (p Principal) String() string {
	var s string
	if p.Service != "" {
		s = string(p.Kind) + ":" + p.Service + "/" + p.Subject
	} else {
		s = string(p.Kind) + ":" + p.Subject
	}
	if p.Issuer != "" && !p.Home {
		return p.Issuer + "#" + s
	}
	return s
}

// ProberName is the name prober assignments are held under: the subject
// for the home issuer, "issuer#subject" for any other, so that a prober of
// the same subject at a second issuer does not inherit the first one's
// targets.
func (p Principal) ProberName() string {
	if p.Issuer != "" && !p.Home {
		return p.Issuer + "#" + p.Subject
	}
	return p.Subject
}

// IsAdmin reports whether p is an operator or tool holding RoleAdmin.
func (p Principal) IsAdmin() bool {
	return (p.Kind == KindOperator || p.Kind == KindTool) && p.Role == RoleAdmin
}

// Names of muster's custom token claims, for issuers that write them (the
// dev issuer) and the Verifier that reads them.
const (
	ClaimKind      = "muster_kind"
	ClaimService   = "muster_service"
	ClaimTeam      = "muster_team"
	ClaimRole      = "muster_role"
	ClaimAddresses = "muster_addresses"
)

// Limits on claim values. They bound the work an issuer (or a bug in one) can
// cause, and keep what ends up in audit records printable.
const (
	maxSubjectLen = 256
	maxTeamLen    = 128
	maxAddresses  = 32
)

// Claims holds muster's custom claims as strings, before validation. It is
// the common ground of Verify (decoded from a token) and the dev issuer's
// Mint (built from its token request), so both apply the same rules through
// NewPrincipal.
type Claims struct {
	Kind      string
	Service   string
	Team      string
	Role      string
	Addresses []string
}

// NewPrincipal validates claims for issuer iss and subject sub and returns
// the principal they describe. Its errors are short reasons that are safe to
// show the caller: they never contain more than a truncated, quoted claim.
func NewPrincipal(iss, sub string, c Claims) (Principal, error) {
	if c.Kind == "" {
		return Principal{}, errors.New("missing kind")
	}
	kind, err := ParseKind(c.Kind)
	if err != nil {
		return Principal{}, err
	}
	if sub == "" {
		return Principal{}, errors.New("missing subject")
	}
	if !printable(sub, maxSubjectLen) {
		return Principal{}, errors.New("invalid subject")
	}
	p := Principal{Issuer: iss, Subject: sub, Kind: kind}

	switch kind {
	case KindWorkload, KindProber:
		if c.Service == "" && kind == KindWorkload {
			return Principal{}, errors.New("workload without service")
		}
		if c.Service != "" && !validServiceName(c.Service) {
			return Principal{}, fmt.Errorf("invalid service name %s", QuoteClaim(c.Service))
		}
		// A team or role on a workload would be honoured by nothing, but a
		// caller that checks Role.AtLeast without looking at Kind could be
		// fooled; refusing the token surfaces the misconfigured issuer.
		if c.Team != "" {
			return Principal{}, fmt.Errorf("team not allowed for kind %s", kind)
		}
		if c.Role != "" {
			return Principal{}, fmt.Errorf("role not allowed for kind %s", kind)
		}
		p.Service = c.Service
	case KindOperator, KindTool:
		if c.Service != "" {
			return Principal{}, fmt.Errorf("service not allowed for kind %s", kind)
		}
		if c.Team != "" && !printable(c.Team, maxTeamLen) {
			return Principal{}, errors.New("invalid team")
		}
		p.Team = c.Team
		p.Role = RoleViewer
		if c.Role != "" {
			if p.Role, err = ParseRole(c.Role); err != nil {
				return Principal{}, err
			}
		}
	}

	if len(c.Addresses) > maxAddresses {
		return Principal{}, fmt.Errorf("too many addresses (%d, at most %d)", len(c.Addresses), maxAddresses)
	}
	for _, s := range c.Addresses {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return Principal{}, fmt.Errorf("bad address %s", QuoteClaim(s))
		}
		p.Addresses = append(p.Addresses, a.Unmap())
	}
	return p, nil
}

// validServiceName mirrors the CHECK on services.name: a lowercase DNS label.
func validServiceName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z':
		case (c >= '0' && c <= '9') || c == '-':
			if i == 0 {
				return false
			}
		default:
			return false
		}
	}
	return s[len(s)-1] != '-'
}

// printable reports whether s is valid UTF-8 of at most limit bytes without
// control characters, so it can be written to logs and audit records as is.
func printable(s string, limit int) bool {
	if len(s) > limit || !utf8.ValidString(s) {
		return false
	}
	return strings.IndexFunc(s, unicode.IsControl) < 0
}

// QuoteClaim renders an untrusted claim for an error message: truncated,
// then quoted so control characters cannot forge log lines.
func QuoteClaim(s string) string {
	const limit = 64
	if len(s) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return fmt.Sprintf("%q…", s[:cut])
	}
	return fmt.Sprintf("%q", s)
}

// NewOperator returns the operator principal for a person signed in through
// an OIDC login (the web UI), from the claims of their ID token: team and
// role are checked by the same rules as muster_team and muster_role in
// bearer tokens, and an empty role means RoleViewer.
func NewOperator(iss, sub, team, role string) (Principal, error) {
	return NewPrincipal(iss, sub, Claims{Kind: string(KindOperator), Team: team, Role: role})
}
