package proxied_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/proxied"
	"github.com/musterhq/muster/internal/wait"
)

// echoServer serves, on a loopback listener wrapped by proxied.Wrap with
// from, an HTTP handler answering the request's RemoteAddr.
func echoServer(t *testing.T, from string, timeout time.Duration) (addr string, reg *prometheus.Registry) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nets, err := proxied.ParseNetworks(from)
	if err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewRegistry()
	pln, err := proxied.Wrap(ln, proxied.Config{From: nets, HeaderTimeout: timeout, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.RemoteAddr)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(pln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String(), reg
}

// v2 is the PROXY v2 header an NLB sends for a client at src.
func v2(src string) *proxyproto.Header {
	return proxyproto.HeaderProxyFromAddrs(2, net.TCPAddrFromAddrPort(netip.MustParseAddrPort(src)),
		net.TCPAddrFromAddrPort(netip.MustParseAddrPort("10.0.0.1:8080")))
}

// get sends prefix (a PROXY header, or anything) and then a GET, and
// returns the body of the answer, or the error of a connection closed
// without one.
func get(t *testing.T, addr string, prefix func(net.Conn) error) (string, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if prefix != nil {
		if err := prefix(c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: muster\r\nConnection: close\r\n\r\n"); err != nil {
		return "", err
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return string(b), err
}

// refused reads muster_proxy_protocol_refused_total{reason}.
func refused(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "muster_proxy_protocol_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no muster_proxy_protocol_refused_total{reason=%q}", reason)
	return 0
}

func writeHeader(h *proxyproto.Header) func(net.Conn) error {
	return func(c net.Conn) error { _, err := h.WriteTo(c); return err }
}

func writeRaw(s string) func(net.Conn) error {
	return func(c net.Conn) error { _, err := io.WriteString(c, s); return err }
}

func TestAllowedNetworkHeaderIsTheAddress(t *testing.T) {
	t.Parallel()
	addr, reg := echoServer(t, "127.0.0.1/32", 0)
	for _, tc := range []struct {
		name string
		h    *proxyproto.Header
		want string
	}{
		{"v2", v2("10.9.8.7:41000"), "10.9.8.7:41000"},
		{"v1", func() *proxyproto.Header { h := v2("10.9.8.6:41001"); h.Version = 1; return h }(), "10.9.8.6:41001"},
		{"v2 IPv6", proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: net.ParseIP("2001:db8::7"), Port: 41002}, &net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 8080}), "[2001:db8::7]:41002"},
	} {
		got, err := get(t, addr, writeHeader(tc.h))
		if err != nil || got != tc.want {
			t.Errorf("%s: RemoteAddr %q (%v), want %q", tc.name, got, err, tc.want)
		}
	}
	for _, r := range []string{proxied.ReasonMissing, proxied.ReasonMalformed, proxied.ReasonNotAllowed, proxied.ReasonTimeout} {
		if n := refused(t, reg, r); n != 0 {
			t.Errorf("refused{%s} = %v, want 0", r, n)
		}
	}
}

func TestRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, from string
		prefix     func(net.Conn) error
		reason     string
	}{
		// The same header from a network not listed speaks for nobody.
		{"header from elsewhere", "10.0.0.0/8", writeHeader(v2("10.9.8.7:41000")), proxied.ReasonNotAllowed},
		{"v1 header from elsewhere", "10.0.0.0/8", writeRaw("PROXY TCP4 10.9.8.7 10.0.0.1 41000 8080\r\n"), proxied.ReasonNotAllowed},
		// A listed network's connection without one was not proxied.
		{"no header from a listed network", "127.0.0.0/8", nil, proxied.ReasonMissing},
		{"malformed v1", "127.0.0.1/32", writeRaw("PROXY TCP4 10.9.8.7 nonsense\r\n"), proxied.ReasonMalformed},
		{"malformed v2", "127.0.0.1/32", writeRaw("\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x04abcd"), proxied.ReasonMalformed},
		// A header for anything but TCP over IP proves no address.
		{"UDP header", "127.0.0.1/32", writeHeader(proxyproto.HeaderProxyFromAddrs(2, &net.UDPAddr{IP: net.IPv4(10, 9, 8, 7), Port: 41000}, &net.UDPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 8080})), proxied.ReasonMalformed},
		// A malformed header is refused from anywhere: it is no request.
		{"malformed v1 from elsewhere", "10.0.0.0/8", writeRaw("PROXY TCP4 10.9.8.7 nonsense\r\n"), proxied.ReasonMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr, reg := echoServer(t, tc.from, 0)
			got, err := get(t, addr, tc.prefix)
			if err == nil {
				t.Fatalf("served %q, want the connection closed", got)
			}
			if n := refused(t, reg, tc.reason); n != 1 {
				t.Errorf("refused{%s} = %v, want 1", tc.reason, n)
			}
		})
	}
}

func TestElsewhereWithoutHeaderServedAsBefore(t *testing.T) {
	t.Parallel()
	addr, _ := echoServer(t, "10.0.0.0/8", 0)
	got, err := get(t, addr, nil)
	if err != nil || !strings.HasPrefix(got, "127.0.0.1:") {
		t.Fatalf("RemoteAddr %q (%v), want the TCP peer's, 127.0.0.1:port", got, err)
	}
}

func TestHeaderTimeout(t *testing.T) {
	t.Parallel()
	addr, reg := echoServer(t, "127.0.0.1/32", 200*time.Millisecond)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Half a v2 signature, then silence.
	if _, err := io.WriteString(c, "\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %v, want the connection closed by muster", err)
	}
	wait.For(t, 5*time.Second, "refused{timeout} counted", func() bool { return refused(t, reg, proxied.ReasonTimeout) == 1 })
}

func TestParseNetworks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "10.0.0.0/8", want: "[10.0.0.0/8]"},
		{in: " 10.0.0.0/8 ,, 2001:db8::/32 ", want: "[10.0.0.0/8 2001:db8::/32]"},
		{in: "127.0.0.1", want: "[127.0.0.1/32]"},
		{in: "::1", want: "[::1/128]"},
		{in: "::ffff:10.0.0.0/104", want: "[10.0.0.0/8]"},
		{in: "", err: "no network given"},
		{in: " , ", err: "no network given"},
		{in: "10.1.2.3/8", err: "did you mean 10.0.0.0/8?"},
		{in: "10.0.0.0/33", err: "want CIDR notation"},
		{in: "example.com", err: "want CIDR notation"},
		{in: "fe80::1%eth0", err: "want CIDR notation"},
		{in: "::ffff:0.0.0.0/80", err: "must be /96 or longer"},
	} {
		got, err := proxied.ParseNetworks(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseNetworks(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("ParseNetworks(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseNetworks(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "127.0.0.1, ::1", "::ffff:10.0.0.0/104", "10.1.2.3/8", "", ",", "fe80::1%eth0/64", "1.2.3.4/", "/8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		nets, err := proxied.ParseNetworks(s)
		if err != nil {
			return
		}
		if len(nets) == 0 {
			t.Fatalf("ParseNetworks(%q): no network and no error", s)
		}
		var again []string
		for _, p := range nets {
			// What is accepted is canonical: valid, masked, unmapped,
			// zoneless, and reads back as itself.
			if !p.IsValid() || p.Masked() != p || p.Addr().Is4In6() || p.Addr().Zone() != "" {
				t.Fatalf("ParseNetworks(%q) accepted %v", s, p)
			}
			again = append(again, p.String())
		}
		back, err := proxied.ParseNetworks(strings.Join(again, ","))
		if err != nil || fmt.Sprint(back) != fmt.Sprint(nets) {
			t.Fatalf("ParseNetworks(%q) = %v, read back as %v, %v", s, nets, back, err)
		}
	})
}

// TestLocalHeaderKeepsPeerAddress: a LOCAL header (the load balancer
// speaking for itself, as health checks may) is a header, so it is
// accepted from a listed network, and the address is the TCP peer's.
func TestLocalHeaderKeepsPeerAddress(t *testing.T) {
	t.Parallel()
	addr, _ := echoServer(t, "127.0.0.1/32", 0)
	local := &proxyproto.Header{Version: 2, Command: proxyproto.LOCAL, TransportProtocol: proxyproto.UNSPEC}
	got, err := get(t, addr, writeHeader(local))
	if err != nil || !strings.HasPrefix(got, "127.0.0.1:") {
		t.Fatalf("RemoteAddr %q (%v), want the TCP peer's, 127.0.0.1:port", got, err)
	}
}

// TestListenersToldApart: the API's and xDS's wrapped listeners register
// their refusals in one registry, each under its own listener label, and
// a refusal on one is not counted on the other.
func TestListenersToldApart(t *testing.T) {
	reg := prometheus.NewRegistry()
	nets := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	var xaddr string
	for _, name := range []string{"", "xds"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		pln, err := proxied.Wrap(ln, proxied.Config{From: nets, Metrics: reg, Listener: name})
		if err != nil {
			t.Fatalf("wrap %q: %v", name, err)
		}
		t.Cleanup(func() { _ = pln.Close() })
		if name == "xds" {
			xaddr = ln.Addr().String()
			go func() {
				for {
					c, err := pln.Accept()
					if err != nil {
						return
					}
					go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
				}
			}()
		}
	}
	c, err := net.Dial("tcp", xaddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := v2("10.9.8.7:41000").WriteTo(c); err != nil {
		t.Fatal(err)
	}
	count := func(listener string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if mf.GetName() == "muster_proxy_protocol_refused_total" && labels["listener"] == listener && labels["reason"] == proxied.ReasonNotAllowed {
					return m.GetCounter().GetValue()
				}
			}
		}
		t.Fatalf("no muster_proxy_protocol_refused_total{listener=%q,reason=\"not_allowed\"}", listener)
		return 0
	}
	wait.For(t, 10*time.Second, "the xDS listener's refusal counted", func() bool { return count("xds") == 1 })
	if n := count("api"); n != 0 {
		t.Fatalf("the API listener counts %v refusals, want 0", n)
	}
}
