package federation

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/tlsreload/tlstest"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// TestPeerCARotatedOnDisk: a peer served over https under CA 1 is
// followed with --peer-ca naming CA 1's bundle. The peer moves to a
// certificate from CA 2: new connections fail verification (the bundle
// on disk is still CA 1) and the copy is served as it was; once the
// bundle file holds CA 2, the follower reaches the peer again, without a
// restart, and follows its views.
func TestPeerCARotatedOnDisk(t *testing.T) {
	ca1, ca2 := tlstest.NewCA(t), tlstest.NewCA(t)
	pair := func(ca *tlstest.CA) *tls.Certificate {
		c, k := ca.Leaf(t, "peer b", time.Hour)
		kp, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return &kp
	}
	var current atomic.Pointer[tls.Certificate]
	current.Store(pair(ca1))
	peer := newFakePeer()
	peer.set(resolver.View{Service: "billing", Version: 1, Endpoints: []resolver.Endpoint{ep("00000000-0000-0000-0000-000000000001", "10.0.0.1", 80)}})
	srv := httptest.NewUnstartedServer(peer)
	srv.TLS = &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return current.Load(), nil }}
	srv.StartTLS()
	defer srv.Close()
	// By name, so the client sends SNI and the server answers from
	// GetCertificate (httptest's own certificate otherwise); the leaves
	// name localhost.
	url := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	dir := t.TempDir()
	tok, caFile := filepath.Join(dir, "b.token"), filepath.Join(dir, "b-ca.pem")
	tlstest.WriteFile(t, tok, []byte("tok"))
	tlstest.WriteFile(t, caFile, ca1.PEM)
	fed, err := New(Config{
		Region: "a", Peers: []PeerConfig{{Name: "b", URLs: []string{url}, TokenFile: tok, CAFile: caFile}},
		StaleAfter: 2 * time.Second, Discover: 50 * time.Millisecond, Tick: 20 * time.Millisecond,
		BaseBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	f := fed.Followers()[0]
	if err := f.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	agg := fed.Aggregate
	version := func() uint64 { v, _, _ := agg.View("b", "billing"); return v.View.Version }
	wait.For(t, 30*time.Second, "billing v1 followed over https under CA 1", func() bool { return version() == 1 })

	// The peer's certificate now comes from CA 2, which the bundle on
	// disk does not hold yet: no new connection verifies.
	current.Store(pair(ca2))
	peer.set(resolver.View{Service: "billing", Version: 2, Endpoints: []resolver.Endpoint{ep("00000000-0000-0000-0000-000000000002", "10.0.0.2", 80)}})
	srv.CloseClientConnections()
	wait.For(t, 30*time.Second, "a verification failure noted", func() bool {
		return strings.Contains(agg.Regions()[0].LastError, "certificate")
	})
	if v := version(); v != 1 {
		t.Fatalf("billing v%d taken from a peer whose certificate did not verify", v)
	}
	// The bundle rotated on disk (renamed into place, as a secret
	// mount swaps it): followed again without a restart.
	tmp := caFile + ".new"
	tlstest.WriteFile(t, tmp, ca2.PEM)
	if err := os.Rename(tmp, caFile); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "billing v2 followed under CA 2", func() bool { return version() == 2 })
}

// TestPeerCertificateMustNameTheHost: a certificate from the trusted CA
// that names another host is refused, by IP address as by name.
func TestPeerCertificateMustNameTheHost(t *testing.T) {
	ca := tlstest.NewCA(t)
	c, k := ca.Leaf(t, "peer b", time.Hour) // names 127.0.0.1 and localhost
	kp, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	peer := newFakePeer()
	peer.set(resolver.View{Service: "billing", Version: 1})
	srv := httptest.NewUnstartedServer(peer)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{kp}}
	srv.StartTLS()
	defer srv.Close()
	pool := func() *x509.CertPool { return ca.Pool() }
	get := func(url string) error {
		res, err := (&http.Client{Transport: peerTransport(pool), Timeout: 5 * time.Second}).Get(url)
		if err == nil {
			res.Body.Close()
		}
		return err
	}
	if err := get(srv.URL + "/v1/services"); err != nil {
		t.Fatalf("the host the certificate names, by IP: %v", err)
	}
	if err := get(strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) + "/v1/services"); err != nil {
		t.Fatalf("the host the certificate names, by name: %v", err)
	}
	// 127.0.0.2 reaches the same server (loopback) but is not named.
	if err := get(strings.Replace(srv.URL, "127.0.0.1", "127.0.0.2", 1) + "/v1/services"); err == nil || !strings.Contains(err.Error(), "127.0.0.2") {
		t.Fatalf("a host the certificate does not name: %v", err)
	}
}
