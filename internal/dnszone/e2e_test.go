package dnszone_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/testbin"
	"github.com/musterhq/muster/internal/wait"
)

// TestMain stops the PostgreSQL cluster the tests start.
func TestMain(m *testing.M) { dbtest.Main(m) }

const zoneName = "muster.internal."

// env is muster (apptest: real PostgreSQL, HTTP, tokens) serving its DNS
// zone on loopback.
type env struct {
	s    *apptest.Stack
	addr string // host:port of the DNS zone
	port string
}

func newEnv(t *testing.T, cfg dnszone.Config) *env {
	t.Helper()
	if cfg.Services == nil {
		cfg.Services = []string{dnszone.AllServices}
	}
	cfg.Interval = 20 * time.Millisecond
	s := apptest.New(t, apptest.Options{DNS: &cfg})
	s.Seed(t)
	addr := s.DNS.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	return &env{s: s, addr: addr, port: port}
}

// register registers instances of api (passive evidence only: capacity
// on registration) at the given addresses in zone, ports 9000 up, and
// returns their ids.
func (e *env) register(t *testing.T, zone string, addrs ...string) []string {
	t.Helper()
	var ids []string
	var tok string
	for i, a := range addrs {
		if i%32 == 0 { // a token vouches for 32 addresses at most
			tok = e.s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "api", Addresses: addrs[i:min(i+32, len(addrs))]})
		}
		r := e.s.JSON(t, "POST", "/v1/services/api/instances", tok, fmt.Sprintf(`{"address":%q,"port":%d,"zone":%q}`, a, 9000+i, zone))
		if r.Status != http.StatusCreated {
			t.Fatalf("register %s: %d %s", a, r.Status, r.Body)
		}
		ids = append(ids, apptest.Decode[registry.Instance](t, r).ID.String())
	}
	return ids
}

// deregister ends instances the way they end themselves.
func (e *env) deregister(t *testing.T, addr string, ids ...string) {
	t.Helper()
	tok := e.s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "api", Addresses: []string{addr}})
	for _, id := range ids {
		if r := e.s.DoWith(t, "DELETE", "/v1/instances/"+id, tok, "", "", e.s.AsInstance(id)); r.Status != http.StatusNoContent {
			t.Fatalf("deregister %s: %d %s", id, r.Status, r.Body)
		}
	}
}

// publish runs evaluation and publication through to the hub.
func (e *env) publish(t *testing.T) {
	t.Helper()
	if err := e.s.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.s.Evaluator.EvaluateNow()
	e.s.Publisher.RunOnce()
	e.s.Clock.Advance(time.Minute) // past every batching window
	e.s.Publisher.RunOnce()
}

// dig runs Debian's dig against the zone and returns its output.
func (e *env) dig(t *testing.T, args ...string) string {
	t.Helper()
	return dig(t, e.port, args...)
}

func dig(t *testing.T, port string, args ...string) string {
	t.Helper()
	bin := testbin.Require(t, "dig")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"@127.0.0.1", "-p", port, "+time=2", "+tries=2"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("dig %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// lines splits dig +short output into sorted lines.
func lines(s string) []string {
	out := strings.Fields(strings.TrimSpace(s))
	if strings.Contains(s, " ") { // SRV +short: one record per line
		out = strings.Split(strings.TrimSpace(s), "\n")
	}
	slices.Sort(out)
	return slices.DeleteFunc(out, func(l string) bool { return l == "" })
}

// exchange sends one query with miekg/dns's client.
func (e *env) exchange(t *testing.T, name string, qtype uint16, netw string, bufsize uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if bufsize > 0 {
		m.SetEdns0(bufsize, false)
	}
	c := &dns.Client{Net: netw, Timeout: 3 * time.Second}
	r, _, err := c.Exchange(m, e.addr)
	if err != nil {
		t.Fatalf("%s %s over %s: %v", dns.TypeToString[qtype], name, netw, err)
	}
	return r
}

// goResolver is Go's own resolver, pointed at muster's zone.
func (e *env) goResolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, e.addr)
	}}
}

func sortedHosts(t *testing.T, r *net.Resolver, name string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	hs, err := r.LookupHost(ctx, name)
	if err != nil {
		t.Fatalf("LookupHost %s: %v", name, err)
	}
	slices.Sort(hs)
	return hs
}

// TestAnswersFollowTheView: A, per-zone names, SRV with ports and
// weights, TXT, NXDOMAIN with the SOA, NODATA, REFUSED outside the zone,
// through dig and Go's resolver; a withdrawal reaches the answer within
// 1 s of its publication and the SOA serial moves on.
func TestAnswersFollowTheView(t *testing.T) {
	t.Parallel()
	e := newEnv(t, dnszone.Config{Zone: zoneName})
	az1 := e.register(t, "az1", "10.0.1.1", "10.0.1.2", "10.0.1.3")
	e.register(t, "az2", "10.0.2.1", "10.0.2.2")
	e.publish(t)
	all := []string{"10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.2.1", "10.0.2.2"}
	wait.For(t, 2*time.Second, "api's five endpoints in the zone", func() bool {
		return slices.Equal(lines(e.dig(t, "+short", "A", "api."+zoneName)), all)
	})
	serial0 := e.s.DNS.Serial()

	if got := lines(e.dig(t, "+short", "A", "az2.api."+zoneName)); !slices.Equal(got, []string{"10.0.2.1", "10.0.2.2"}) {
		t.Errorf("az2.api: %v", got)
	}
	r := e.goResolver()
	if got := sortedHosts(t, r, "api."+zoneName); !slices.Equal(got, all) {
		t.Errorf("Go resolver, api: %v", got)
	}
	if got := sortedHosts(t, r, "az1.api.muster.internal"); !slices.Equal(got, all[:3]) {
		t.Errorf("Go resolver, az1.api: %v", got)
	}
	_, srvs, err := r.LookupSRV(t.Context(), "api", "tcp", "muster.internal")
	if err != nil {
		t.Fatalf("LookupSRV: %v", err)
	}
	if len(srvs) != 5 {
		t.Fatalf("SRV: %d records, want 5", len(srvs))
	}
	ports := map[uint16]bool{}
	for _, s := range srvs {
		ports[s.Port] = true
		// Every endpoint of api has weight 1 in zones at traffic 1: equal
		// shares, the largest scaled to 65535.
		if s.Priority != 0 || s.Weight != 65535 {
			t.Errorf("SRV %+v: want priority 0, weight 65535", s)
		}
		if addrs := sortedHosts(t, r, s.Target); len(addrs) != 1 || !slices.Contains(all, addrs[0]) {
			t.Errorf("SRV target %s resolves to %v", s.Target, addrs)
		}
	}
	if len(ports) != 3 { // 9000-9002 in az1, 9000-9001 in az2
		t.Errorf("SRV ports %v", ports)
	}
	if out := e.dig(t, "+short", "TXT", "_muster."+zoneName); !strings.Contains(out, "cache answers beyond the TTL") {
		t.Errorf("_muster TXT: %s", out)
	}

	nx := e.exchange(t, "nope."+zoneName, dns.TypeA, "udp", 0)
	if nx.Rcode != dns.RcodeNameError || !nx.Authoritative || len(nx.Ns) != 1 || nx.Ns[0].Header().Rrtype != dns.TypeSOA {
		t.Errorf("unknown service: %s", nx)
	} else if soa := nx.Ns[0].(*dns.SOA); soa.Minttl != 5 || soa.Hdr.Ttl != 5 {
		t.Errorf("negative TTL: SOA %s", soa)
	}
	if out := e.dig(t, "A", "az9.api."+zoneName); !strings.Contains(out, "status: NXDOMAIN") {
		t.Errorf("unknown zone of api:\n%s", out)
	}
	if _, err := r.LookupHost(t.Context(), "nope.muster.internal"); !isNotFound(err) {
		t.Errorf("Go resolver, unknown service: %v", err)
	}
	nodata := e.exchange(t, "api."+zoneName, dns.TypeAAAA, "udp", 0)
	if nodata.Rcode != dns.RcodeSuccess || len(nodata.Answer) != 0 || len(nodata.Ns) != 1 || nodata.Ns[0].Header().Rrtype != dns.TypeSOA {
		t.Errorf("AAAA of an IPv4-only service (NODATA): %s", nodata)
	}
	a := e.exchange(t, "API.Muster.Internal.", dns.TypeA, "udp", 0)
	if len(a.Answer) != 5 || a.Answer[0].Header().Ttl != 5 || !a.Authoritative {
		t.Errorf("A, mixed case: %s", a)
	}
	if out := e.dig(t, "A", "example.com."); !strings.Contains(out, "status: REFUSED") {
		t.Errorf("outside the zone:\n%s", out)
	}

	// A withdrawal: az1's first instance deregisters itself.
	e.deregister(t, "10.0.1.1", az1[0])
	e.publish(t)
	start := time.Now()
	wait.For(t, time.Second, "the withdrawal in the A answer", func() bool {
		m := e.exchange(t, "api."+zoneName, dns.TypeA, "udp", 0)
		return len(m.Answer) == 4 && !strings.Contains(fmt.Sprint(m.Answer), "10.0.1.1")
	})
	t.Logf("the withdrawal reached the DNS answer %s after its publication", time.Since(start).Round(time.Millisecond))
	if serial := e.s.DNS.Serial(); serial == serial0 || int32(serial-serial0) < 0 {
		t.Errorf("serial %d after the withdrawal, %d before: want it later in RFC 1982 order", serial, serial0)
	}
	if got := lines(e.dig(t, "+short", "A", "az1.api."+zoneName)); !slices.Equal(got, []string{"10.0.1.2", "10.0.1.3"}) {
		t.Errorf("az1.api after the withdrawal: %v", got)
	}
	metrics := string(e.s.Scrape(t))
	for _, want := range []string{`muster_dns_queries_total{qtype="A",rcode="NOERROR"}`, `muster_dns_queries_total{qtype="A",rcode="NXDOMAIN"}`,
		`muster_dns_queries_total{qtype="SRV",rcode="NOERROR"}`, `muster_dns_queries_total{qtype="A",rcode="REFUSED"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func isNotFound(err error) bool {
	var de *net.DNSError
	return err != nil && errorsAs(err, &de) && de.IsNotFound
}

// TestLargeAnswerTruncatesThenTCP: 200 endpoints do not fit a 512-byte
// UDP answer: it comes truncated (TC), and complete over TCP; an EDNS0
// buffer large enough gets it whole over UDP; dig and Go's resolver both
// end up with all 200.
func TestLargeAnswerTruncatesThenTCP(t *testing.T) {
	t.Parallel()
	// Answers of up to 4096 bytes over UDP (the default is 1232).
	e := newEnv(t, dnszone.Config{Zone: zoneName, UDPSize: 4096})
	var addrs []string
	for i := range 200 {
		addrs = append(addrs, fmt.Sprintf("10.1.%d.%d", i/100, i%100+1))
	}
	e.register(t, "az1", addrs...)
	e.publish(t)
	wait.For(t, 2*time.Second, "200 endpoints over TCP", func() bool {
		return len(e.exchange(t, "api."+zoneName, dns.TypeA, "tcp", 0).Answer) == 200
	})
	udp := e.exchange(t, "api."+zoneName, dns.TypeA, "udp", 0)
	if !udp.Truncated || len(udp.Answer) >= 200 {
		t.Errorf("UDP without EDNS0: TC %v, %d answers; want truncated", udp.Truncated, len(udp.Answer))
	}
	if big := e.exchange(t, "api."+zoneName, dns.TypeA, "udp", 4096); big.Truncated || len(big.Answer) != 200 || big.IsEdns0() == nil {
		t.Errorf("UDP with a 4096-byte EDNS0 buffer: TC %v, %d answers, OPT %v; want all 200", big.Truncated, len(big.Answer), big.IsEdns0())
	}
	// A 1232-byte buffer: more than 512 bytes' worth, still truncated
	// (sizes as sent: compressed).
	compressedLen := func(m *dns.Msg) int { m.Compress = true; return m.Len() }
	if mid := e.exchange(t, "api."+zoneName, dns.TypeA, "udp", 1232); !mid.Truncated || len(mid.Answer) <= len(udp.Answer) || compressedLen(mid) > 1232 {
		t.Errorf("UDP with a 1232-byte EDNS0 buffer: TC %v, %d answers (%d without EDNS0), %d bytes", mid.Truncated, len(mid.Answer), len(udp.Answer), compressedLen(mid))
	}
	// A client asking for more than muster's own buffer gets at most that.
	if huge := e.exchange(t, "_api._tcp."+zoneName, dns.TypeSRV, "udp", 65000); !huge.Truncated || compressedLen(huge) > 4096 {
		t.Errorf("SRV over UDP, a 65000-byte buffer asked for: TC %v, %d bytes; want at most 4096, truncated", huge.Truncated, compressedLen(huge))
	}
	if out := e.dig(t, "+notcp", "+ignore", "+noedns", "A", "api."+zoneName); !strings.Contains(out, " tc") {
		t.Errorf("dig over UDP, no retry: no TC flag\n%s", out)
	}
	if got := lines(e.dig(t, "+short", "+noedns", "A", "api."+zoneName)); len(got) != 200 {
		t.Errorf("dig (retrying over TCP): %d addresses", len(got))
	}
	srv := e.exchange(t, "_api._tcp."+zoneName, dns.TypeSRV, "tcp", 0)
	if len(srv.Answer) != 200 {
		t.Errorf("SRV over TCP: %d records", len(srv.Answer))
	}
	if got := sortedHosts(t, e.goResolver(), "api.muster.internal"); len(got) != 200 {
		t.Errorf("Go resolver: %d addresses", len(got))
	}
	_, srvs, err := e.goResolver().LookupSRV(t.Context(), "api", "tcp", "muster.internal")
	if err != nil || len(srvs) != 200 {
		t.Errorf("Go resolver SRV: %d records, %v", len(srvs), err)
	}
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }
