package resolver_test

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/tlsreload/tlstest"
	"github.com/musterhq/muster/resolver"
)

// TestClientPresentsClientCertificate: with GetClientCertificate and no
// Token, the resolver's watch requests present the certificate to an
// https muster that requires one, and send no Authorization header.
func TestClientPresentsClientCertificate(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	const id = "spiffe://prod.example.org/ns/shop/sa/web"
	cert := ca.ClientCert(t, id)
	var seen atomic.Value // the SPIFFE ID muster saw
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if pc := r.TLS.PeerCertificates; len(pc) > 0 && len(pc[0].URIs) == 1 && r.Header.Get("Authorization") == "" {
			seen.Store(pc[0].URIs[0].String())
		}
		startSSE(w)
		send(w, "view", 1, view("api", 1, 2))
		hang(r)
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs

	c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}, RootCAs: roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
		BaseBackoff:          time.Millisecond, MaxBackoff: 10 * time.Millisecond}, nil)
	eventually(t, "a view of api over mutual TLS", func() bool { return version(c, "api") == 1 })
	if got, _ := seen.Load().(string); got != id {
		t.Errorf("muster saw client certificate %q without a token, want %q", got, id)
	}
}
