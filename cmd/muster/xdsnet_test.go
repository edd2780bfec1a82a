package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/musterhq/muster/internal/tlsreload/tlstest"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds"
)

// throughLBDialer dials from the local address local and opens the
// connection with a PROXY v2 header for a client at src, as an NLB
// passing TLS through does; gRPC's TLS handshake follows it.
func throughLBDialer(local, src string) grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		h := proxyproto.HeaderProxyFromAddrs(2, net.TCPAddrFromAddrPort(netip.MustParseAddrPort(src)), c.RemoteAddr())
		if _, err := h.WriteTo(c); err != nil {
			_ = c.Close()
			return nil, err
		}
		return c, nil
	})
}

// TestXDSBehindTheLoadBalancer: muster dev as the chart runs it behind
// an NLB (--proxy-protocol-from, one TLS pair given to both --tls-cert
// and --xds-tls-cert, --tls-client-ca, --spiffe). Over real gRPC on
// loopback, through a PROXY v2 sender at 127.0.0.2:
//   - web's SPIFFE certificate, no token, gets web's endpoints, and so
//     does web's token without a certificate;
//   - an unmapped certificate is refused and audited under the header's
//     source address, not the balancer's;
//   - the same header from 127.0.0.1 (not listed) is refused and counted
//     under listener="xds"; 127.0.0.1 without a header is served;
//   - the pair rotated on disk is served by a new xDS connection, and
//     the one expiry metric follows it.
func TestXDSBehindTheLoadBalancer(t *testing.T) {
	t.Parallel()
	dir := devDir(t)
	xaddr := freeAddr(t)
	serverCA, clientCA := tlstest.NewCA(t), tlstest.NewCA(t)
	files := t.TempDir()
	certFile, keyFile := filepath.Join(files, "tls.crt"), filepath.Join(files, "tls.key")
	clientCAFile, spiffeFile := filepath.Join(files, "clients.pem"), filepath.Join(files, "spiffe.yaml")
	cert, key := serverCA.Leaf(t, "muster-a", time.Hour)
	tlstest.WriteFile(t, certFile, cert)
	tlstest.WriteFile(t, keyFile, key)
	tlstest.WriteFile(t, clientCAFile, clientCA.PEM)
	tlstest.WriteFile(t, spiffeFile, []byte("trust_domains:\n  - trust_domain: prod.example.org\n    path: /ns/{namespace}/sa/{service}\n"))
	dev := startDev(t, dir, "--proxy-protocol-from", "127.0.0.2/32",
		"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", clientCAFile, "--spiffe", spiffeFile,
		"--xds-addr", xaddr, "--xds-tls-cert", certFile, "--xds-tls-key", keyFile)
	httpsCall := httpsCaller(t, serverCA)
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	if res, body := httpsCall("PUT", dev.url+"/v1/services/web", admin, `{"owner":"payments","capabilities":[]}`); res.StatusCode != 201 {
		t.Fatalf("create web: %d %s", res.StatusCode, body)
	}
	if res, body := httpsCall("POST", dev.url+"/v1/services/web/instances", admin, `{"address":"127.0.0.1","port":9000,"zone":"az1"}`); res.StatusCode != 201 {
		t.Fatalf("register web: %d %s", res.StatusCode, body)
	}

	webCert := clientCA.ClientCert(t, "spiffe://prod.example.org/ns/shop/sa/web")
	if r, err := xdsFirst(t, xaddr, serverCA, &webCert, "", throughLBDialer("127.0.0.2", "10.9.8.7:41000")); err != nil || len(r.GetResources()) != 1 {
		t.Fatalf("xDS through the balancer with web's certificate: %v (%d resources), want web's endpoints", err, len(r.GetResources()))
	}
	webTok := token(t, dir, "--kind", "workload", "--service", "web")
	if r, err := xdsFirst(t, xaddr, serverCA, nil, webTok, throughLBDialer("127.0.0.2", "10.9.8.7:41001")); err != nil || len(r.GetResources()) != 1 {
		t.Fatalf("xDS through the balancer with web's token: %v (%d resources), want web's endpoints", err, len(r.GetResources()))
	}

	// The stream's address is the header's: the refusal of an unmapped
	// certificate is audited under 10.9.8.8.
	stagingCert := clientCA.ClientCert(t, "spiffe://staging.example.org/ns/shop/sa/web")
	if _, err := xdsFirst(t, xaddr, serverCA, &stagingCert, "", throughLBDialer("127.0.0.2", "10.9.8.8:41000")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("xDS through the balancer with an unmapped certificate: %v, want Unauthenticated", err)
	}
	var actors []string
	wait.For(t, 30*time.Second, "the xDS refusal audited under the header's source address", func() bool {
		res, body := httpsCall("GET", dev.url+"/v1/audit?outcome=refused&action=auth.refuse&limit=50", admin, "")
		var page struct {
			Items []struct {
				Actor string `json:"actor"`
			} `json:"items"`
		}
		if res.StatusCode != 200 || json.Unmarshal([]byte(body), &page) != nil {
			t.Fatalf("audit: %d %s", res.StatusCode, body)
		}
		actors = actors[:0]
		for _, it := range page.Items {
			actors = append(actors, it.Actor)
		}
		return len(actors) > 0
	})
	if strings.Join(actors, ",") != "source:10.9.8.8" {
		t.Fatalf("refusals audited under %v, want only source:10.9.8.8 (the header's source)", actors)
	}

	// A header from a network not listed: refused before TLS, counted.
	if _, err := xdsFirst(t, xaddr, serverCA, &webCert, "", throughLBDialer("127.0.0.1", "10.9.8.7:41002")); status.Code(err) != codes.Unavailable {
		t.Fatalf("xDS with a PROXY header from 127.0.0.1: %v, want the connection refused (Unavailable)", err)
	}
	if _, err := xdsFirst(t, xaddr, serverCA, &webCert, ""); err != nil {
		t.Fatalf("xDS from 127.0.0.1 without a header: %v, want served", err)
	}
	res, m := httpsCall("GET", dev.url+"/metrics", admin, "")
	// At least one: the refused client may have redialled once before
	// it was closed.
	if res.StatusCode != 200 || !regexp.MustCompile(`\nmuster_proxy_protocol_refused_total\{listener="xds",reason="not_allowed"\} [1-9]\n`).MatchString(m) ||
		!strings.Contains(m, `muster_proxy_protocol_refused_total{listener="api",reason="not_allowed"} 0`+"\n") {
		t.Fatalf("the xDS refusal is not counted as xDS's: %s", grepLines([]byte(m), "muster_proxy_protocol"))
	}

	// Rotation: a new connection to xDS is served the new pair, and the
	// expiry metric (one series: one reloader) is the new notAfter.
	if cn := tlstest.PeerCN(t, xaddr, serverCA.Pool()); cn != "muster-a" {
		t.Fatalf("xDS serves %q before the rotation, want muster-a", cn)
	}
	cert, key = serverCA.Leaf(t, "muster-b", 3*time.Hour)
	tlstest.WriteFile(t, certFile, cert)
	tlstest.WriteFile(t, keyFile, key)
	rotated := time.Now()
	wait.For(t, 30*time.Second, "a new xDS connection served the rotated certificate", func() bool {
		return tlstest.PeerCN(t, xaddr, serverCA.Pool()) == "muster-b"
	})
	t.Logf("xDS served the rotated pair %s after it was written", time.Since(rotated).Round(10*time.Millisecond))
	if r, err := xdsFirst(t, xaddr, serverCA, &webCert, "", throughLBDialer("127.0.0.2", "10.9.8.7:41003")); err != nil || len(r.GetResources()) != 1 {
		t.Fatalf("xDS through the balancer after the rotation: %v", err)
	}
	_, m = httpsCall("GET", dev.url+"/metrics", admin, "")
	var expiry []float64
	for _, l := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(l, "muster_tls_certificate_expiry_seconds "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			expiry = append(expiry, f)
		}
	}
	// The leaf's notAfter is 3 h from its issue, give or take the test's
	// own run: more than 2 h from now means the new pair's.
	if len(expiry) != 1 || time.Until(time.Unix(int64(expiry[0]), 0)) < 2*time.Hour {
		t.Fatalf("muster_tls_certificate_expiry_seconds %v, want one series at the rotated certificate's notAfter (~3 h on)", expiry)
	}
}

// TestListenXDSPairs: the pair xDS serves, and whose expiry is measured.
// --xds-tls-cert/--xds-tls-key naming --tls-cert's files (here through a
// symbolic link) serve the API's reloader and its client CAs, one expiry
// series; a pair of xDS's own is reloaded too, its expiry measured when
// the API is plain, and it collides with nothing when the API serves TLS.
func TestListenXDSPairs(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	write := func(name, cn string, life time.Duration) (string, string) {
		c, k := ca.Leaf(t, cn, life)
		cf, kf := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		tlstest.WriteFile(t, cf, c)
		tlstest.WriteFile(t, kf, k)
		return cf, kf
	}
	apiCert, apiKey := write("api", "api-1", time.Hour)
	xdsCert, xdsKey := write("xds", "xds-1", time.Hour)
	link := filepath.Join(dir, "linked.crt")
	if err := os.Symlink(apiCert, link); err != nil {
		t.Fatal(err)
	}
	clientCA := filepath.Join(dir, "clients.pem")
	tlstest.WriteFile(t, clientCA, tlstest.NewCA(t).PEM)
	served := func(tc *tls.Config) string {
		c, err := tc.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.Subject.CommonName
	}
	expiries := func(reg *prometheus.Registry) int {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "muster_tls_certificate_expiry_seconds" {
				return len(mf.GetMetric())
			}
		}
		return 0
	}
	open := func(cfg Config) (*xds.Config, *prometheus.Registry) {
		t.Helper()
		cfg.XDSAddr = "127.0.0.1:0"
		ltls, err := setupTLS(cfg, log)
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		if err := ltls.register(reg); err != nil {
			t.Fatal(err)
		}
		ln, xc, err := listenXDS(cfg, true, ltls, reg, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		return xc, reg
	}

	t.Run("shared", func(t *testing.T) {
		xc, reg := open(Config{TLSCert: apiCert, TLSKey: apiKey, TLSClientCA: clientCA, XDSTLSCert: link, XDSTLSKey: apiKey})
		if xc.TLS.ClientAuth != tls.RequestClientCert {
			t.Errorf("xDS sharing the pair asks for client certificates: %v, want RequestClientCert", xc.TLS.ClientAuth)
		}
		if n := expiries(reg); n != 1 {
			t.Errorf("%d expiry series, want 1", n)
		}
		if cn := served(xc.TLS); cn != "api-1" {
			t.Fatalf("xDS serves %s, want api-1", cn)
		}
		write("api", "api-2", time.Hour)
		wait.For(t, 10*time.Second, "xDS serving the rotated API pair", func() bool { return served(xc.TLS) == "api-2" })
	})
	t.Run("own, API plain", func(t *testing.T) {
		xc, reg := open(Config{XDSTLSCert: xdsCert, XDSTLSKey: xdsKey})
		if n := expiries(reg); n != 1 {
			t.Errorf("%d expiry series, want xDS's own", n)
		}
		if cn := served(xc.TLS); cn != "xds-1" {
			t.Fatalf("xDS serves %s, want xds-1", cn)
		}
		write("xds", "xds-2", time.Hour)
		wait.For(t, 10*time.Second, "xDS serving its rotated pair", func() bool { return served(xc.TLS) == "xds-2" })
	})
	t.Run("own, API TLS", func(t *testing.T) {
		xc, reg := open(Config{TLSCert: apiCert, TLSKey: apiKey, XDSTLSCert: xdsCert, XDSTLSKey: xdsKey})
		if n := expiries(reg); n != 1 {
			t.Errorf("%d expiry series, want the API's", n)
		}
		if cn := served(xc.TLS); !strings.HasPrefix(cn, "xds-") {
			t.Fatalf("xDS serves %s, want its own pair", cn)
		}
	})
}
