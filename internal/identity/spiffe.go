package identity

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// ErrCertificateUnmapped means a client certificate that verified against
// the client CA bundle names no workload muster knows: it has no SPIFFE
// ID, its trust domain is not configured, or its path does not match the
// trust domain's template. The error's text is safe to show the caller.
var ErrCertificateUnmapped = errors.New("client certificate not mapped to a workload")

// FailureCertificateUnmapped is the failure code (as FailureCode's) of a
// request refused for a client certificate that maps to no workload, and
// FailureConflictingProofs that of one whose bearer token and client
// certificate name different services.
const (
	FailureCertificateUnmapped = "certificate_unmapped"
	FailureConflictingProofs   = "conflicting_proofs"
)

// SPIFFEIssuerPrefix starts the Issuer of a principal authenticated by a
// client certificate: "spiffe://" and the trust domain.
const SPIFFEIssuerPrefix = "spiffe://"

// TrustDomainConfig maps the SPIFFE IDs of one trust domain to workloads:
// Path is a template such as "/ns/{namespace}/sa/{service}".
type TrustDomainConfig struct {
	// TrustDomain is the trust domain's name, e.g. "prod.example.org".
	TrustDomain string
	// Path is the template the ID's path must match (PathTemplate).
	Path string
}

// PathTemplate matches a SPIFFE ID's path segment by segment: a literal
// segment matches itself, "{service}" (exactly one) names the muster
// service, and any other "{name}" matches any one non-empty segment. The
// number of segments must be equal: no prefix matches, no globs.
type PathTemplate struct {
	segs    []string // literal segments; "" where a placeholder stands
	service int      // index of {service}
	raw     string
}

// maxTemplateSegments bounds a template (and so the work of a match).
const maxTemplateSegments = 32

// ParsePathTemplate parses and checks a template. Its errors say what is
// wrong with it, for a start that refuses a bad configuration.
func ParsePathTemplate(s string) (PathTemplate, error) {
	if !strings.HasPrefix(s, "/") {
		return PathTemplate{}, fmt.Errorf("path template %s must begin with /", QuoteClaim(s))
	}
	parts := strings.Split(s[1:], "/")
	if len(parts) > maxTemplateSegments {
		return PathTemplate{}, fmt.Errorf("path template %s has more than %d segments", QuoteClaim(s), maxTemplateSegments)
	}
	t := PathTemplate{segs: make([]string, len(parts)), service: -1, raw: s}
	seen := map[string]bool{}
	for i, p := range parts {
		if p == "" {
			return PathTemplate{}, fmt.Errorf("path template %s has an empty segment (segment %d)", QuoteClaim(s), i+1)
		}
		if name, ok := strings.CutPrefix(p, "{"); ok {
			name, ok = strings.CutSuffix(name, "}")
			if !ok || !validPlaceholder(name) {
				return PathTemplate{}, fmt.Errorf("path template %s: segment %s must be a literal or a whole {name} placeholder (lowercase letters, digits, _)", QuoteClaim(s), QuoteClaim(p))
			}
			if seen[name] {
				return PathTemplate{}, fmt.Errorf("path template %s names {%s} twice", QuoteClaim(s), name)
			}
			seen[name] = true
			if name == "service" {
				t.service = i
			}
			continue
		}
		if strings.ContainsAny(p, "{}") || !validPathSegment(p) {
			return PathTemplate{}, fmt.Errorf("path template %s: segment %s is not a valid SPIFFE path segment (letters, digits, '.', '-', '_'; not . or ..)", QuoteClaim(s), QuoteClaim(p))
		}
		t.segs[i] = p
	}
	if t.service < 0 {
		return PathTemplate{}, fmt.Errorf("path template %s has no {service} placeholder: it must name the segment that is the muster service", QuoteClaim(s))
	}
	return t, nil
}

// String is the template as written.
func (t PathTemplate) String() string { return t.raw }

// Match returns the service a SPIFFE ID path names, or false when the
// path does not match the template. The service must be a muster service
// name (a lowercase DNS label).
func (t PathTemplate) Match(path string) (service string, ok bool) {
	rest, ok := strings.CutPrefix(path, "/")
	if !ok || len(t.segs) == 0 {
		return "", false
	}
	parts := strings.SplitN(rest, "/", len(t.segs)+1)
	if len(parts) != len(t.segs) {
		return "", false
	}
	for i, p := range parts {
		if p == "" {
			return "", false
		}
		if lit := t.segs[i]; lit != "" && lit != p {
			return "", false
		}
	}
	if s := parts[t.service]; validServiceName(s) {
		return s, true
	}
	return "", false
}

func validPlaceholder(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// validPathSegment is the SPIFFE ID rule for a path segment.
func validPathSegment(s string) bool {
	if s == "." || s == ".." || s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '.' && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

// TrustDomains maps client certificates' SPIFFE IDs to workload
// principals. It holds no keys and does no chain verification: the
// certificate must have been verified against the client CA bundle first
// (tlsreload.ClientCAs). It is immutable and safe for concurrent use.
type TrustDomains struct {
	byName map[spiffeid.TrustDomain]PathTemplate
}

// NewTrustDomains checks the configuration: each trust domain a valid
// SPIFFE trust domain name, configured once, with a valid template.
func NewTrustDomains(cfgs []TrustDomainConfig) (*TrustDomains, error) {
	td := &TrustDomains{byName: make(map[spiffeid.TrustDomain]PathTemplate, len(cfgs))}
	for _, c := range cfgs {
		name, err := spiffeid.TrustDomainFromString(c.TrustDomain)
		if err != nil || name.Name() != c.TrustDomain {
			return nil, fmt.Errorf("trust domain %s: not a SPIFFE trust domain name (lowercase letters, digits, '.', '-', '_'; no spiffe:// and no path)", QuoteClaim(c.TrustDomain))
		}
		if _, dup := td.byName[name]; dup {
			return nil, fmt.Errorf("trust domain %s configured twice", name.Name())
		}
		t, err := ParsePathTemplate(c.Path)
		if err != nil {
			return nil, fmt.Errorf("trust domain %s: %w", name.Name(), err)
		}
		td.byName[name] = t
	}
	return td, nil
}

// Principal maps a verified client certificate (the leaf) to the workload
// its SPIFFE ID names: Issuer "spiffe://<trust domain>", Subject the full
// ID, Expiry the certificate's notAfter, and Addresses its IP SANs (the
// addresses the CA vouches for, like a token's muster_addresses). Its
// errors wrap ErrCertificateUnmapped.
func (td *TrustDomains) Principal(leaf *x509.Certificate) (Principal, error) {
	if td == nil || leaf == nil {
		return Principal{}, fmt.Errorf("no certificate: %w", ErrCertificateUnmapped)
	}
	id, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return Principal{}, fmt.Errorf("no SPIFFE ID (%s): %w", err.Error(), ErrCertificateUnmapped)
	}
	t, ok := td.byName[id.TrustDomain()]
	if !ok {
		return Principal{}, fmt.Errorf("trust domain %s is not configured: %w", QuoteClaim(id.TrustDomain().Name()), ErrCertificateUnmapped)
	}
	service, ok := t.Match(id.Path())
	if !ok {
		return Principal{}, fmt.Errorf("SPIFFE ID %s does not match %s: %w", QuoteClaim(id.String()), t, ErrCertificateUnmapped)
	}
	if len(leaf.IPAddresses) > maxAddresses {
		return Principal{}, fmt.Errorf("too many IP SANs (%d, at most %d): %w", len(leaf.IPAddresses), maxAddresses, ErrCertificateUnmapped)
	}
	p, err := NewPrincipal(SPIFFEIssuerPrefix+id.TrustDomain().Name(), id.String(), Claims{Kind: string(KindWorkload), Service: service})
	if err != nil {
		return Principal{}, fmt.Errorf("SPIFFE ID %s: %s: %w", QuoteClaim(id.String()), err.Error(), ErrCertificateUnmapped)
	}
	for _, ip := range leaf.IPAddresses {
		if a, ok := netip.AddrFromSlice(ip); ok {
			p.Addresses = append(p.Addresses, a.Unmap())
		}
	}
	p.Expiry = leaf.NotAfter
	return p, nil
}
