package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"

	"github.com/musterhq/muster/internal/tlsreload/tlstest"
)

// throughLB sends a request to base on a new connection from local that
// opens with a PROXY v2 header for a client at src, as an NLB would, and
// returns the answer, or the error of a connection closed without one.
func throughLB(t *testing.T, local, src, method, base, path, tok, body string) (int, string, error) {
	t.Helper()
	return throughLBTLS(t, nil, local, src, method, base, path, tok, body)
}

// throughLBTLS is throughLB, and when tc is set the connection speaks
// TLS after the PROXY header, as through an NLB passing TLS through to
// muster.
func throughLBTLS(t *testing.T, tc *tls.Config, local, src, method, base, path, tok, body string) (int, string, error) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	h := proxyproto.HeaderProxyFromAddrs(2, net.TCPAddrFromAddrPort(netip.MustParseAddrPort(src)), c.RemoteAddr())
	if _, err := h.WriteTo(c); err != nil {
		t.Fatal(err)
	}
	if tc != nil {
		tc = tc.Clone()
		tc.ServerName = u.Hostname()
		c = tls.Client(c, tc)
	}
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Close = true
	if err := req.Write(c); err != nil {
		return 0, "", err
	}
	res, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// TestDevBehindProxyProtocol: `muster dev --proxy-protocol-from` reads
// the load balancer's PROXY header on the API listener: a workload at
// 10.9.8.7 registers through it (its token vouches for no address), the
// same header from a network not listed is refused and counted, and
// requests from elsewhere without a header are served as before.
func TestDevBehindProxyProtocol(t *testing.T) {
	t.Parallel()
	dir := devDir(t)
	// The load balancer connects from 127.0.0.2; the test's own calls,
	// from 127.0.0.1, carry no header.
	dev := startDev(t, dir, "--proxy-protocol-from", "127.0.0.2/32")
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	web := token(t, dir, "--kind", "workload", "--service", "web")
	if code, body := call(t, "PUT", dev.url+"/v1/services/web", admin, `{"owner":"payments","capabilities":["self"]}`); code != 201 {
		t.Fatalf("create web: %d %s", code, body)
	}
	reg := `{"address":"10.9.8.7","port":8080,"zone":"az1"}`
	if code, body, err := throughLB(t, "127.0.0.1", "10.9.8.7:41000", "POST", dev.url, "/v1/services/web/instances", web, reg); err == nil {
		t.Fatalf("a PROXY header from a network not listed was served: %d %s", code, body)
	}
	if code, body, err := throughLB(t, "127.0.0.2", "10.9.8.7:41000", "POST", dev.url, "/v1/services/web/instances", web, reg); err != nil || code != 201 {
		t.Fatalf("registration of 10.9.8.7 through the load balancer: %d %s %v, want 201", code, body, err)
	}
	if code, body := call(t, "GET", dev.url+"/v1/services/web/instances", admin, ""); code != 200 || strings.Count(string(body), `"address":"10.9.8.7"`) != 1 {
		t.Fatalf("instances of web: %d %s, want the one registered through the load balancer", code, body)
	}
	_, m := call(t, "GET", dev.url+"/metrics", admin, "")
	if !strings.Contains(string(m), `muster_proxy_protocol_refused_total{listener="api",reason="not_allowed"} 1`+"\n") {
		t.Fatalf("the refusal is not counted: %s", grepLines(m, "muster_proxy_protocol"))
	}
}

// TestDevBehindProxyProtocolOverTLS: with TLS on the API listener the
// PROXY header comes first, then the TLS handshake, as through an NLB
// passing TLS through: the header from a listed network proves the
// workload's address over https; from elsewhere the connection is
// refused before any TLS.
func TestDevBehindProxyProtocolOverTLS(t *testing.T) {
	t.Parallel()
	dir := devDir(t)
	ca := tlstest.NewCA(t)
	files := t.TempDir()
	certFile, keyFile := filepath.Join(files, "tls.crt"), filepath.Join(files, "tls.key")
	cert, key := ca.Leaf(t, "muster", time.Hour)
	tlstest.WriteFile(t, certFile, cert)
	tlstest.WriteFile(t, keyFile, key)
	dev := startDev(t, dir, "--proxy-protocol-from", "127.0.0.2/32", "--tls-cert", certFile, "--tls-key", keyFile)
	if !strings.HasPrefix(dev.url, "https://") {
		t.Fatalf("muster dev with TLS serves %s", dev.url)
	}
	httpsCall := httpsCaller(t, ca)
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	web := token(t, dir, "--kind", "workload", "--service", "web")
	if res, body := httpsCall("PUT", dev.url+"/v1/services/web", admin, `{"owner":"payments","capabilities":["self"]}`); res.StatusCode != 201 {
		t.Fatalf("create web: %d %s", res.StatusCode, body)
	}
	tc := &tls.Config{RootCAs: ca.Pool()}
	reg := `{"address":"10.9.8.7","port":8080,"zone":"az1"}`
	if code, body, err := throughLBTLS(t, tc, "127.0.0.1", "10.9.8.7:41000", "POST", dev.url, "/v1/services/web/instances", web, reg); err == nil {
		t.Fatalf("a PROXY header from a network not listed was served over TLS: %d %s", code, body)
	}
	if code, body, err := throughLBTLS(t, tc, "127.0.0.2", "10.9.8.7:41000", "POST", dev.url, "/v1/services/web/instances", web, reg); err != nil || code != 201 {
		t.Fatalf("registration of 10.9.8.7 through the load balancer over TLS: %d %s %v, want 201", code, body, err)
	}
	if res, body := httpsCall("GET", dev.url+"/v1/services/web/instances", admin, ""); res.StatusCode != 200 || strings.Count(body, `"address":"10.9.8.7"`) != 1 {
		t.Fatalf("instances of web: %d %s, want the one registered through the load balancer", res.StatusCode, body)
	}
}

// TestLoadEnvProxyProtocol: MUSTER_PROXY_PROTOCOL_FROM is a list of
// networks; anything else is refused at start.
func TestLoadEnvProxyProtocol(t *testing.T) {
	t.Setenv("MUSTER_PROXY_PROTOCOL_FROM", "10.0.0.0/8, 192.168.1.10")
	var c Config
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(c.ProxyProtocolFrom) != "[10.0.0.0/8 192.168.1.10/32]" {
		t.Fatalf("networks: %v", c.ProxyProtocolFrom)
	}
	t.Setenv("MUSTER_PROXY_PROTOCOL_FROM", "10.0.0.1/8")
	if err := loadEnv(&c); err == nil || !strings.Contains(err.Error(), "MUSTER_PROXY_PROTOCOL_FROM") {
		t.Fatalf("a network with host bits set: %v", err)
	}
}
