package dnszone

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/stream"
)

// AllServices in Config.Services serves every service the hub holds a
// view of.
const AllServices = "*"

// Defaults.
const (
	DefaultZone     = "muster.internal."
	DefaultTTL      = 5 * time.Second
	DefaultUDPSize  = 1232 // the EDNS0 buffer size muster advertises (DNS flag day 2020)
	DefaultHistory  = 64
	DefaultInterval = time.Second
)

// Config configures a Server.
type Config struct {
	// Addr is the address served over UDP and TCP, e.g. 127.0.0.1:8053
	// (port 0: any free port, the same for both; Server.Addr says which).
	Addr string
	// Zone is the zone muster is authoritative for: muster.internal. by
	// default.
	Zone string
	// Services are the services the zone serves; AllServices ("*") serves
	// every one. DNS carries no identity, so whatever is listed here can
	// be resolved by anybody who can reach Addr (see the package doc).
	Services []string
	// TTL of every record, and the negative-caching TTL (the SOA minimum):
	// 5 s by default.
	TTL time.Duration
	// Nameservers are the zone's NS names (fully qualified); ns.ZONE by
	// default. An in-zone name gets NameserverAddrs (or, when that is
	// empty, Addr's IP when Addr names one) as its address, and a service
	// of the same name is not served.
	Nameservers     []string
	NameserverAddrs []netip.Addr
	// Secondaries are the secondary servers (host:port) told of every
	// change by NOTIFY; zone transfers (AXFR, IXFR) are allowed to their
	// addresses only, and only signed with the TSIG key. Anyone else's
	// transfer is refused and counted.
	Secondaries []netip.AddrPort
	// TSIGKeyName and TSIGSecret (base64) are the hmac-sha256 key
	// transfers and NOTIFYs are signed with. Required with Secondaries.
	TSIGKeyName, TSIGSecret string
	// UDPSize is the EDNS0 buffer size advertised in answers: 1232.
	UDPSize int
	// History is how many commits' diffs are kept for IXFR: 64. An IXFR
	// from an older serial gets the whole zone (RFC 1995 allows it).
	History int
	// Regions are the peer regions (in order of preference) whose views
	// of a served service answer for it when this region has no capacity
	// for it (every instance withdrawn, or the region drained),
	// as the resolver's Pick does. A service only peer regions have is
	// served when Services names it (not under AllServices: DNS carries
	// no identity, so the peers' grants cannot apply).
	Regions []string
	// Interval is how often the hub is checked for new services when
	// Services is AllServices, and for peer regions' views of them: 1 s.
	Interval time.Duration

	// Optional makes a failure to listen on Addr a logged warning that
	// leaves DNS off, instead of failing Start: muster dev's default
	// address, which a second muster dev on the machine finds taken.
	Optional bool

	// Ready reports whether views have been published since muster
	// started (set by app: what /readyz says). Until it first holds, the
	// zone answers SERVFAIL and sends and serves no transfer, so neither
	// clients nor secondaries take a rebuilding muster's empty zone for
	// the truth. Nil: ready at once.
	Ready func() bool

	// Hub is where views come from (set by app).
	Hub    *stream.Hub
	Logger *slog.Logger
	// Registerer receives the muster_dns_* metrics; nil registers nowhere.
	Registerer prometheus.Registerer
}

// Validate checks the configuration and fills in defaults. Errors name
// the field.
func (c *Config) Validate() error {
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("dns: Addr is required"))
	} else if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("dns: Addr %q: %w", c.Addr, err))
	}
	if c.Zone == "" {
		c.Zone = DefaultZone
	}
	c.Zone = dns.CanonicalName(c.Zone)
	if _, ok := dns.IsDomainName(c.Zone); !ok || c.Zone == "." {
		errs = append(errs, fmt.Errorf("dns: Zone %q is not a domain name", c.Zone))
	}
	if len(c.Services) == 0 {
		errs = append(errs, errors.New(`dns: Services is required: the services DNS may serve, or "*" for all (DNS carries no identity)`))
	}
	for _, s := range c.Services {
		if s != AllServices && !validLabel(s) {
			errs = append(errs, fmt.Errorf("dns: Services: %q is not a service name", s))
		}
	}
	if slices.Contains(c.Services, AllServices) && len(c.Services) > 1 {
		errs = append(errs, fmt.Errorf(`dns: Services: "*" serves every service; list names or "*", not both`))
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.TTL < time.Second || c.TTL > 24*time.Hour {
		errs = append(errs, fmt.Errorf("dns: TTL %s outside [1s, 24h]", c.TTL))
	}
	if len(c.Nameservers) == 0 {
		c.Nameservers = []string{"ns." + c.Zone}
	}
	c.Nameservers = slices.Clone(c.Nameservers) // canonicalised below: not the caller's
	for i, ns := range c.Nameservers {
		c.Nameservers[i] = dns.CanonicalName(ns)
		if _, ok := dns.IsDomainName(c.Nameservers[i]); !ok {
			errs = append(errs, fmt.Errorf("dns: Nameservers: %q is not a domain name", ns))
		}
	}
	if len(c.NameserverAddrs) == 0 && c.Addr != "" {
		if host, _, err := net.SplitHostPort(c.Addr); err == nil {
			if ip, err := netip.ParseAddr(host); err == nil && !ip.IsUnspecified() {
				c.NameserverAddrs = []netip.Addr{ip}
			}
		}
	}
	if c.TSIGKeyName != "" || c.TSIGSecret != "" || len(c.Secondaries) > 0 {
		if c.TSIGKeyName == "" || c.TSIGSecret == "" {
			errs = append(errs, errors.New("dns: zone transfers need a TSIG key: TSIGKeyName and TSIGSecret (base64, hmac-sha256)"))
		} else {
			c.TSIGKeyName = dns.CanonicalName(c.TSIGKeyName)
			if b, err := base64.StdEncoding.DecodeString(c.TSIGSecret); err != nil {
				errs = append(errs, fmt.Errorf("dns: TSIGSecret is not base64: %w", err))
			} else if len(b) < 16 {
				errs = append(errs, fmt.Errorf("dns: TSIGSecret is %d bytes; use at least 16 (tsig-keygen makes 32)", len(b)))
			}
		}
	}
	for _, s := range c.Secondaries {
		if !s.IsValid() || s.Port() == 0 {
			errs = append(errs, fmt.Errorf("dns: Secondaries: %q is not an address and port", s))
		}
	}
	if c.UDPSize == 0 {
		c.UDPSize = DefaultUDPSize
	}
	if c.UDPSize < dns.MinMsgSize || c.UDPSize > dns.MaxMsgSize {
		errs = append(errs, fmt.Errorf("dns: UDPSize %d outside [512, 65535]", c.UDPSize))
	}
	if c.History == 0 {
		c.History = DefaultHistory
	}
	if c.History < 0 {
		errs = append(errs, fmt.Errorf("dns: History %d is negative", c.History))
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Interval < 0 {
		errs = append(errs, fmt.Errorf("dns: Interval %s is negative", c.Interval))
	}
	if c.Hub == nil {
		errs = append(errs, errors.New("dns: Hub is required"))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return errors.Join(errs...)
}

// ParseSecondaries parses a comma-separated list of host:port (port 53
// when omitted) secondaries, as the flags and environment give them.
func ParseSecondaries(s string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if ap, err := netip.ParseAddrPort(part); err == nil {
			out = append(out, ap)
			continue
		}
		ip, err := netip.ParseAddr(strings.Trim(part, "[]"))
		if err != nil {
			return nil, fmt.Errorf("secondary %q: want IP or IP:port", part)
		}
		out = append(out, netip.AddrPortFrom(ip, 53))
	}
	return out, nil
}

// inZone reports whether name is at or below origin.
func inZone(name, origin string) bool { return dns.IsSubDomain(origin, name) }
