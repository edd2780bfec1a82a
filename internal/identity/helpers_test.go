package identity_test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
)

const issuerPath = "/dev/issuer"

// fakeClock is a settable clock shared by a Verifier and its test.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	// Whole seconds, as in tokens, so boundaries are exact.
	return &fakeClock{now: time.Now().Truncate(time.Second)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// devServer is a devissuer.Issuer served on a loopback httptest server, with knobs
// to break its endpoints and counters of the requests it saw.
type devServer struct {
	issuer *devissuer.Issuer
	srv    *httptest.Server
	key    *rsa.PrivateKey // only set by newDevServerWithKey

	failDiscovery atomic.Bool
	failJWKS      atomic.Bool
	discoveries   atomic.Int32
	jwksFetches   atomic.Int32

	// holdDiscovery, when set before the first request, makes discovery
	// requests announce themselves on arrived and wait for release.
	holdDiscovery     bool
	discoveryArrived  chan struct{}
	discoveryReleased chan struct{}
}

// hold makes the next discovery request block until release is called.
func (s *devServer) hold() (arrived <-chan struct{}, release func()) {
	s.holdDiscovery = true
	s.discoveryArrived = make(chan struct{}, 1)
	s.discoveryReleased = make(chan struct{})
	return s.discoveryArrived, func() { close(s.discoveryReleased) }
}

func (s *devServer) URL() string { return s.srv.URL + issuerPath }

func newDevServer(t testing.TB) *devServer {
	t.Helper()
	return serveDevIssuer(t, t.TempDir(), nil)
}

// newDevServerWithKey writes its own key into the issuer's directory before
// loading it, so the test can sign tokens the issuer's Mint would refuse.
func newDevServerWithKey(t testing.TB) *devServer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "dev-issuer-key.pem"), pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	return serveDevIssuer(t, dir, key)
}

func serveDevIssuer(t testing.TB, dir string, key *rsa.PrivateKey) *devServer {
	t.Helper()
	d, err := devissuer.LoadOrCreate(dir)
	if err != nil {
		t.Fatalf("devissuer.LoadOrCreate: %v", err)
	}
	s := &devServer{issuer: d, key: key}
	h := http.StripPrefix(issuerPath, d.Handler())
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case issuerPath + "/.well-known/openid-configuration":
			s.discoveries.Add(1)
			if s.holdDiscovery {
				select {
				case s.discoveryArrived <- struct{}{}:
				default:
				}
				<-s.discoveryReleased
			}
			if s.failDiscovery.Load() {
				http.Error(w, "down", http.StatusInternalServerError)
				return
			}
		case issuerPath + "/jwks":
			s.jwksFetches.Add(1)
			if s.failJWKS.Load() {
				http.Error(w, "down", http.StatusInternalServerError)
				return
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	if err := d.SetURL(s.URL()); err != nil {
		t.Fatalf("SetURL: %v", err)
	}
	return s
}

// mint mints req at now or fails the test.
func (s *devServer) mint(t testing.TB, req devissuer.TokenRequest, now time.Time) string {
	t.Helper()
	tok, err := s.issuer.Mint(req, now)
	if err != nil {
		t.Fatalf("Mint(%+v): %v", req, err)
	}
	return tok
}

// sign signs arbitrary claims with the server's own key (newDevServerWithKey).
func (s *devServer) sign(t testing.TB, claims map[string]any) string {
	t.Helper()
	if s.key == nil {
		t.Fatal("sign needs newDevServerWithKey")
	}
	thumb, err := (&jose.JSONWebKey{Key: &s.key.PublicKey}).Thumbprint(crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{
		Algorithm: jose.RS256,
		Key:       jose.JSONWebKey{Key: s.key, KeyID: base64.RawURLEncoding.EncodeToString(thumb)},
	}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// baseClaims are valid registered claims for s at now, without muster's.
func (s *devServer) baseClaims(now time.Time) map[string]any {
	return map[string]any{
		"iss": s.URL(),
		"sub": "alice",
		"aud": []string{"muster"},
		"iat": now.Unix(),
		"nbf": now.Unix(),
		"exp": now.Add(time.Hour).Unix(),
	}
}

// newVerifier returns a Verifier for the given issuers on clock.
func newVerifier(t testing.TB, clock *fakeClock, issuers ...identity.IssuerConfig) *identity.Verifier {
	t.Helper()
	v, err := identity.NewVerifierWithClock(issuers, &http.Client{Timeout: 10 * time.Second}, clock.Now)
	if err != nil {
		t.Fatalf("NewVerifier: %v", err)
	}
	return v
}

// forgeToken signs claims RS256 with key under key ID kid: a token muster
// must refuse, whose key the issuer never published (or, with the
// issuer's own kid, whose signature is not the issuer's).
func forgeToken(t testing.TB, key *rsa.PrivateKey, kid string, claims map[string]any) string {
	t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	claims["muster_kind"] = "operator"
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
