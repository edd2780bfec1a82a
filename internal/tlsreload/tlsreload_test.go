package tlsreload_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/testclock"
	"github.com/musterhq/muster/internal/tlsreload"
	"github.com/musterhq/muster/internal/tlsreload/tlstest"
)

// serve accepts TLS connections on loopback with the reloader's config
// and completes each handshake, until the test ends.
func serve(t *testing.T, r *tlsreload.Reloader) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", r.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}(c)
		}
	}()
	return ln.Addr().String()
}

func TestReloadOnChange(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	certA, keyA := ca.Leaf(t, "cert-a", time.Hour)
	tlstest.WriteFile(t, certFile, certA)
	tlstest.WriteFile(t, keyFile, keyA)

	clock := testclock.New(time.Now())
	r, err := tlsreload.New(tlsreload.Config{CertFile: certFile, KeyFile: keyFile, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := r.Register(reg); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r)
	if cn := tlstest.PeerCN(t, addr, ca.Pool()); cn != "cert-a" {
		t.Fatalf("first handshake saw %q, want cert-a", cn)
	}

	// Rotated: new files renamed over the old ones.
	certB, keyB := ca.Leaf(t, "cert-b", 2*time.Hour)
	tlstest.WriteFile(t, keyFile, keyB)
	tlstest.WriteFile(t, certFile, certB)
	// Within CheckEvery the files are not looked at again.
	if cn := tlstest.PeerCN(t, addr, ca.Pool()); cn != "cert-a" {
		t.Fatalf("handshake within a second of the last check saw %q, want cert-a still", cn)
	}
	clock.Advance(tlsreload.DefaultCheckEvery)
	if cn := tlstest.PeerCN(t, addr, ca.Pool()); cn != "cert-b" {
		t.Fatalf("handshake after the rotation saw %q, want cert-b", cn)
	}
	if got, want := r.NotAfter().Unix(), time.Now().Add(2*time.Hour).Unix(); got < want-120 || got > want {
		t.Errorf("NotAfter %d, want about %d", got, want)
	}

	// A broken pair (a key that is not the certificate's): B stays, and
	// the failure is counted once, not once per handshake.
	certC, _ := ca.Leaf(t, "cert-c", time.Hour)
	tlstest.WriteFile(t, certFile, certC)
	clock.Advance(tlsreload.DefaultCheckEvery)
	for range 2 {
		if cn := tlstest.PeerCN(t, addr, ca.Pool()); cn != "cert-b" {
			t.Fatalf("handshake after a broken rotation saw %q, want cert-b kept", cn)
		}
		clock.Advance(tlsreload.DefaultCheckEvery)
	}
	// Garbage in the certificate file: still B, a second failure.
	tlstest.WriteFile(t, certFile, []byte("not a certificate"))
	clock.Advance(tlsreload.DefaultCheckEvery)
	if cn := tlstest.PeerCN(t, addr, ca.Pool()); cn != "cert-b" {
		t.Fatalf("handshake after a garbage certificate saw %q, want cert-b kept", cn)
	}
	if n := gathered(t, reg, "muster_tls_reload_failures_total"); n != 2 {
		t.Errorf("muster_tls_reload_failures_total = %v, want 2", n)
	}
	if n, want := gathered(t, reg, "muster_tls_certificate_expiry_seconds"), float64(r.NotAfter().Unix()); n != want {
		t.Errorf("muster_tls_certificate_expiry_seconds = %v, want %v", n, want)
	}

	// Mended: the next good pair is taken.
	certD, keyD := ca.Leaf(t, "cert-d", time.Hour)
	tlstest.WriteFile(t, keyFile, keyD)
	tlstest.WriteFile(t, certFile, certD)
	clock.Advance(tlsreload.DefaultCheckEvery)
	if cn := tlstest.PeerCN(t, addr, ca.Pool()); cn != "cert-d" {
		t.Fatalf("handshake after the mended rotation saw %q, want cert-d", cn)
	}
}

func TestNewRefusesABrokenPair(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	certA, _ := ca.Leaf(t, "cert-a", time.Hour)
	_, keyB := ca.Leaf(t, "cert-b", time.Hour)
	tlstest.WriteFile(t, certFile, certA)
	tlstest.WriteFile(t, keyFile, keyB)
	for _, c := range []tlsreload.Config{
		{CertFile: certFile, KeyFile: keyFile},
		{CertFile: certFile, KeyFile: filepath.Join(dir, "missing.key")},
		{CertFile: certFile},
	} {
		if _, err := tlsreload.New(c); err == nil {
			t.Errorf("New(%+v) loaded, want an error", c)
		}
	}
}

// gathered is name's single value in reg.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("%s not gathered", name)
	return 0
}

// handshake completes a TLS handshake with addr presenting cert (none
// when nil) and reads, so that a TLS 1.3 server's refusal of the client
// certificate, which arrives after the client's Finished, is seen.
func handshake(t *testing.T, addr string, roots *x509.CertPool, cert *tls.Certificate) error {
	t.Helper()
	cfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if errors.Is(err, io.EOF) {
		return nil // the server closed after a good handshake
	}
	return err
}

func TestClientCAsVerifyAndReload(t *testing.T) {
	t.Parallel()
	serverCA, clientA, clientB := tlstest.NewCA(t), tlstest.NewCA(t), tlstest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "clients.pem")
	cert, key := serverCA.Leaf(t, "server", time.Hour)
	tlstest.WriteFile(t, certFile, cert)
	tlstest.WriteFile(t, keyFile, key)
	tlstest.WriteFile(t, caFile, clientA.PEM)
	r, err := tlsreload.New(tlsreload.Config{CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	clock := testclock.New(time.Now())
	cas, err := tlsreload.NewClientCAs(tlsreload.ClientCAConfig{File: caFile, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := cas.Register(reg); err != nil {
		t.Fatal(err)
	}
	cfg := r.ServerConfig()
	cas.Apply(cfg)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}(c)
		}
	}()
	addr := ln.Addr().String()
	a := clientA.ClientCert(t, "spiffe://prod.example.org/ns/shop/sa/web")
	b := clientB.ClientCert(t, "spiffe://prod.example.org/ns/shop/sa/web")

	if err := handshake(t, addr, serverCA.Pool(), nil); err != nil {
		t.Errorf("no client certificate: %v, want the handshake to complete (a bearer token may follow)", err)
	}
	if err := handshake(t, addr, serverCA.Pool(), &a); err != nil {
		t.Errorf("a certificate of the bundle's CA: %v", err)
	}
	if err := handshake(t, addr, serverCA.Pool(), &b); err == nil {
		t.Error("a certificate of another CA completed the handshake")
	}

	// Rotated to B's CA: B is taken and A refused on new handshakes.
	tlstest.WriteFile(t, caFile, clientB.PEM)
	clock.Advance(tlsreload.DefaultCheckEvery)
	if err := handshake(t, addr, serverCA.Pool(), &b); err != nil {
		t.Errorf("after the rotation, B's certificate: %v", err)
	}
	if err := handshake(t, addr, serverCA.Pool(), &a); err == nil {
		t.Error("after the rotation, A's certificate still completed the handshake")
	}
	// A bundle that no longer loads keeps B's, and is counted once.
	tlstest.WriteFile(t, caFile, []byte("not a certificate"))
	clock.Advance(tlsreload.DefaultCheckEvery)
	if err := handshake(t, addr, serverCA.Pool(), &b); err != nil {
		t.Errorf("after a broken rotation, B's certificate: %v", err)
	}
	clock.Advance(tlsreload.DefaultCheckEvery)
	_ = cas.Pool()
	if n := gathered(t, reg, "muster_tls_client_ca_reload_failures_total"); n != 1 {
		t.Errorf("muster_tls_client_ca_reload_failures_total = %v, want 1", n)
	}
	// A server certificate of a CA outside the bundle is no client's.
	if _, err := cas.Verify([]*x509.Certificate{mustParse(t, cert)}); err == nil {
		t.Error("Verify took a server certificate of another CA")
	}
}

func TestNewClientCAsRefusesWhatIsNotABundle(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	tlstest.WriteFile(t, bad, []byte("nope"))
	for _, f := range []string{"", bad, filepath.Join(dir, "missing.pem")} {
		if _, err := tlsreload.NewClientCAs(tlsreload.ClientCAConfig{File: f}); err == nil {
			t.Errorf("NewClientCAs(%q) loaded, want an error", f)
		}
	}
}

func mustParse(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(certPEM)
	x, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return x
}
