// Package proxied takes the client's address from a PROXY protocol header
// (v1 or v2, as an AWS NLB sends it) on connections from the load
// balancers' networks, and from nowhere else.
//
// muster proves a workload's address by where its request comes from
// (ADR-15). Behind a load balancer that terminates TLS, or balances
// across zones, the TCP peer is the load balancer: its PROXY header says
// who the client is. A header is believed only from the networks the
// operator names (--proxy-protocol-from); forwarded HTTP headers
// (X-Forwarded-For) never are.
//
// Wrap turns a listener into one whose connections report the proved
// client address as RemoteAddr, so net/http's Request.RemoteAddr, and so
// every use muster makes of it (address proof, rate-limit keys by
// address, audit, request logs), is the client's:
//
//   - a connection from a listed network must open with a PROXY header
//     (a load balancer always sends one; a connection without it was
//     not proxied by it and proves nothing): without one it is closed;
//   - a connection from any other network that opens with a PROXY header
//     is closed: only the listed networks may speak for a client;
//   - one that does not is served as before, with its TCP peer address;
//   - a header that does not parse, or that has not arrived within
//     Config.HeaderTimeout, closes the connection.
//
// Each closed connection is counted in
// muster_proxy_protocol_refused_total{listener, reason}. The header is read by
// github.com/pires/go-proxyproto, in the connection's own goroutine (on
// its first read, which net/http does when it asks for RemoteAddr), so a
// slow client holds up no other.
//
// A TLS listener goes around this one (the PROXY header comes before the
// TLS handshake on the wire): tls.NewListener(proxied.Wrap(ln, ...), cfg).
package proxied

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultHeaderTimeout is how long a connection may take to send its
// PROXY header, or its first bytes when it is from elsewhere.
const DefaultHeaderTimeout = 5 * time.Second

// Reasons a connection is refused, the values of the metric's reason
// label.
const (
	// ReasonNotAllowed: a PROXY header from a network not listed.
	ReasonNotAllowed = "not_allowed"
	// ReasonMissing: no PROXY header from a listed network.
	ReasonMissing = "missing"
	// ReasonMalformed: a header that does not parse.
	ReasonMalformed = "malformed"
	// ReasonTimeout: no header (or no first byte) within the timeout.
	ReasonTimeout = "timeout"
)

// Config says whose PROXY headers are believed.
type Config struct {
	// From are the networks whose connections must carry a PROXY
	// header (the load balancers' addresses, or their subnets).
	From []netip.Prefix
	// HeaderTimeout bounds the wait for the header;
	// DefaultHeaderTimeout when zero.
	HeaderTimeout time.Duration
	// Metrics registers muster_proxy_protocol_refused_total; nil: the
	// refusals are not counted.
	Metrics prometheus.Registerer
	// Listener names the listener in the metric's listener label, so
	// that the API's and xDS's refusals are told apart in one registry
	// (default "api").
	Listener string
}

// Validate checks c.
func (c Config) Validate() error {
	if len(c.From) == 0 {
		return errors.New("proxy protocol: no network to accept PROXY headers from")
	}
	for _, p := range c.From {
		if !p.IsValid() {
			return fmt.Errorf("proxy protocol: invalid network %v", p)
		}
	}
	if c.HeaderTimeout < 0 {
		return fmt.Errorf("proxy protocol: header timeout %s is negative", c.HeaderTimeout)
	}
	return nil
}

// ParseNetworks reads a comma-separated list of networks in CIDR
// notation ("10.0.0.0/8, 2001:db8::/32"); a bare address is that one
// address (/32 or /128). Blanks between commas are skipped; an empty
// list is an error. A network with host bits set is refused rather than
// silently widened or narrowed: "10.1.2.3/8" is most likely a typo.
func ParseNetworks(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		var p netip.Prefix
		if strings.Contains(f, "/") {
			var err error
			if p, err = netip.ParsePrefix(f); err != nil {
				return nil, fmt.Errorf("network %q: want CIDR notation, e.g. 10.0.0.0/8", f)
			}
		} else {
			a, err := netip.ParseAddr(f)
			if err != nil || a.Zone() != "" {
				return nil, fmt.Errorf("network %q: want CIDR notation, e.g. 10.0.0.0/8, or an address", f)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Addr().Is4In6() {
			// Peers are compared unmapped: say it the way they are.
			if p.Bits() < 96 {
				return nil, fmt.Errorf("network %q: an IPv4-mapped network must be /96 or longer", f)
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p.Masked() != p {
			return nil, fmt.Errorf("network %q has host bits set: did you mean %s?", f, p.Masked())
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errors.New("no network given")
	}
	return out, nil
}

// Wrap returns ln, whose connections from cfg.From must carry a PROXY
// header and report its source as their RemoteAddr, and whose other
// connections must not carry one (see the package comment). Closing it
// closes ln. It is a prometheus.Collector of its refusals, for a caller
// that wraps the listener before it has a registry (Config.Metrics nil).
func Wrap(ln net.Listener, cfg Config) (*Listener, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	name := cfg.Listener
	if name == "" {
		name = "api"
	}
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "muster_proxy_protocol_refused_total",
		Help:        "Connections closed for their PROXY protocol header, by listener (api, xds) and reason: not_allowed (a header from a network not listed in --proxy-protocol-from), missing (none from a listed network), malformed, timeout.",
		ConstLabels: prometheus.Labels{"listener": name},
	}, []string{"reason"})
	for _, r := range []string{ReasonNotAllowed, ReasonMissing, ReasonMalformed, ReasonTimeout} {
		refused.WithLabelValues(r)
	}
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(refused); err != nil {
			return nil, fmt.Errorf("proxy protocol: register metrics: %w", err)
		}
	}
	timeout := cfg.HeaderTimeout
	if timeout == 0 {
		timeout = DefaultHeaderTimeout
	}
	return &Listener{Listener: ln, from: cfg.From, timeout: timeout, refused: refused}, nil
}

// Listener is a listener Wrap made.
type Listener struct {
	net.Listener
	from    []netip.Prefix
	timeout time.Duration
	refused *prometheus.CounterVec
}

// allowed says whether the peer at a is a listed network's.
func (l *Listener) allowed(a net.Addr) bool {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	for _, p := range l.from {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Describe implements prometheus.Collector.
func (l *Listener) Describe(ch chan<- *prometheus.Desc) { l.refused.Describe(ch) }

// Collect implements prometheus.Collector.
func (l *Listener) Collect(ch chan<- prometheus.Metric) { l.refused.Collect(ch) }

// Accept returns the next connection, wrapped. The header is not read
// here (Accept must not wait on one client) but on the connection's
// first read.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	policy := proxyproto.REJECT
	if l.allowed(c.RemoteAddr()) {
		policy = proxyproto.REQUIRE
	}
	pc := proxyproto.NewConn(c, proxyproto.WithPolicy(policy), proxyproto.SetReadHeaderTimeout(l.timeout),
		proxyproto.ValidateHeader(tcpOnly))
	return &conn{Conn: pc, pc: pc, l: l}, nil
}

// errNotTCP refuses a header that proxies anything but TCP over IP: the
// API (HTTP) and xDS (gRPC) run over TCP, and a Unix socket or UDP
// source is no address to prove.
var errNotTCP = errors.New("the PROXY header is not for TCP over IPv4 or IPv6")

// tcpOnly accepts a LOCAL header (the balancer speaking for itself) and a
// PROXY header for TCP over IPv4 or IPv6.
func tcpOnly(h *proxyproto.Header) error {
	if h.Command.IsLocal() {
		return nil
	}
	if h.TransportProtocol != proxyproto.TCPv4 && h.TransportProtocol != proxyproto.TCPv6 {
		return errNotTCP
	}
	return nil
}

// conn is a connection whose header is checked: one that fails is
// counted once and closed, and every read and write on it fails.
type conn struct {
	net.Conn
	pc   *proxyproto.Conn
	l    *Listener
	once sync.Once
	err  error
}

// check reads the header (once) and refuses the connection when it is
// not as it must be.
func (c *conn) check() error {
	c.once.Do(func() {
		began := time.Now()
		// A read of nothing reads the header under the policy and
		// returns its error, consuming no data.
		_, err := c.pc.Read(nil)
		if err == nil {
			return
		}
		why := reason(err)
		if why == ReasonMissing && time.Since(began) >= c.l.timeout {
			why = ReasonTimeout
		}
		c.l.refused.WithLabelValues(why).Inc()
		c.err = fmt.Errorf("connection from %s refused (%s): %w", c.pc.Raw().RemoteAddr(), why, err)
		_ = c.pc.Close()
	})
	return c.err
}

// reason is the metric's label for the header error err.
func reason(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, proxyproto.ErrSuperfluousProxyHeader):
		return ReasonNotAllowed
	case errors.Is(err, proxyproto.ErrNoProxyProtocol):
		// The library says "no header" both when the first bytes are
		// not one and when none came in time (check tells them apart).
		return ReasonMissing
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return ReasonTimeout
	default:
		return ReasonMalformed
	}
}

// RemoteAddr is the client's address: the header's source from a listed
// network, the TCP peer's otherwise. On a refused connection it is the
// TCP peer's (nothing is served on it).
func (c *conn) RemoteAddr() net.Addr {
	_ = c.check()
	return c.pc.RemoteAddr()
}

func (c *conn) Read(b []byte) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	return c.pc.Read(b)
}

func (c *conn) Write(b []byte) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	return c.pc.Write(b)
}

// WriteBuffers writes b as net.Buffers.WriteTo would to the TCP
// connection itself: with one writev. net.Buffers finds writev only on
// the net package's own connections, so through this wrapper its WriteTo
// falls back to a write per buffer; a watch stream's sender (server's
// rawSender) writes its frames through here instead, one system call per
// fan-out as without a load balancer. Past the header, a write to the
// connection is exactly a write to the socket.
func (c *conn) WriteBuffers(b *net.Buffers) (int64, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	return b.WriteTo(c.pc.Raw())
}
