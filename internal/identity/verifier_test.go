package identity_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
)

// wantInvalid fails t unless err wraps ErrInvalidToken with reason in its
// text and without the token.
func wantInvalid(t *testing.T, err error, tok, reason string) {
	t.Helper()
	if !errors.Is(err, identity.ErrInvalidToken) {
		t.Fatalf("err = %v, want ErrInvalidToken", err)
	}
	if errors.Is(err, identity.ErrIssuerUnavailable) {
		t.Errorf("err = %v also wraps ErrIssuerUnavailable", err)
	}
	if !strings.Contains(err.Error(), reason) {
		t.Errorf("err = %q, want reason %q", err, reason)
	}
	if tok != "" && strings.Contains(err.Error(), tok) {
		t.Errorf("error text contains the token")
	}
}

func TestVerifyKinds(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})

	tests := []struct {
		name      string
		req       devissuer.TokenRequest
		want      identity.Principal
		wantStr   string
		wantAdmin bool
	}{
		{
			name: "workload",
			req: devissuer.TokenRequest{Kind: identity.KindWorkload, Subject: "alice", Service: "web",
				Addresses: []string{"10.0.0.1", "::ffff:10.0.0.2", "2001:db8::1"}},
			want: identity.Principal{Subject: "alice", Kind: identity.KindWorkload, Service: "web",
				Addresses: []netip.Addr{
					netip.MustParseAddr("10.0.0.1"),
					netip.MustParseAddr("10.0.0.2"), // unmapped
					netip.MustParseAddr("2001:db8::1"),
				}},
			wantStr: "workload:web/alice",
		},
		{
			name:    "workload subject defaults to service",
			req:     devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"},
			want:    identity.Principal{Subject: "web", Kind: identity.KindWorkload, Service: "web"},
			wantStr: "workload:web/web",
		},
		{
			name:    "prober bound to a service",
			req:     devissuer.TokenRequest{Kind: identity.KindProber, Service: "edge-probe"},
			want:    identity.Principal{Subject: "edge-probe", Kind: identity.KindProber, Service: "edge-probe"},
			wantStr: "prober:edge-probe/edge-probe",
		},
		{
			name:    "prober without service",
			req:     devissuer.TokenRequest{Kind: identity.KindProber, Subject: "probe-eu-1"},
			want:    identity.Principal{Subject: "probe-eu-1", Kind: identity.KindProber},
			wantStr: "prober:probe-eu-1",
		},
		{
			name:      "operator admin with team",
			req:       devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "oscar", Team: "payments", Role: identity.RoleAdmin},
			want:      identity.Principal{Subject: "oscar", Kind: identity.KindOperator, Team: "payments", Role: identity.RoleAdmin},
			wantStr:   "operator:oscar",
			wantAdmin: true,
		},
		{
			name:    "operator defaults to viewer",
			req:     devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "olga"},
			want:    identity.Principal{Subject: "olga", Kind: identity.KindOperator, Role: identity.RoleViewer},
			wantStr: "operator:olga",
		},
		{
			name:    "tool defaults to viewer",
			req:     devissuer.TokenRequest{Kind: identity.KindTool, Subject: "tg-sync"},
			want:    identity.Principal{Subject: "tg-sync", Kind: identity.KindTool, Role: identity.RoleViewer},
			wantStr: "tool:tg-sync",
		},
		{
			name:      "tool admin",
			req:       devissuer.TokenRequest{Kind: identity.KindTool, Subject: "dns-sync", Role: identity.RoleAdmin, Team: "infra"},
			want:      identity.Principal{Subject: "dns-sync", Kind: identity.KindTool, Role: identity.RoleAdmin, Team: "infra"},
			wantStr:   "tool:dns-sync",
			wantAdmin: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tok := s.mint(t, tt.req, clock.Now())
			got, err := v.Verify(t.Context(), tok)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			// The only issuer is the home one; the token's expiry is the
			// default TTL's.
			tt.want.Issuer, tt.want.Home, tt.want.Expiry = s.URL(), true, clock.Now().Add(time.Hour)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
				t.Errorf("principal (-want +got):\n%s", diff)
			}
			if got.String() != tt.wantStr {
				t.Errorf("String() = %q, want %q", got.String(), tt.wantStr)
			}
			if got.IsAdmin() != tt.wantAdmin {
				t.Errorf("IsAdmin() = %v, want %v", got.IsAdmin(), tt.wantAdmin)
			}
		})
	}
}

func TestVerifyRefusesTimes(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})
	req := devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"}

	tests := []struct {
		name    string
		minted  time.Time
		ttl     time.Duration
		wantErr string // "" for success
	}{
		{"expired", clock.Now().Add(-2 * time.Hour), time.Hour, "token expired"},
		{"expired a second ago", clock.Now().Add(-time.Hour - time.Second), time.Hour, "token expired"},
		{"expires now", clock.Now().Add(-time.Hour), time.Hour, ""},
		// go-oidc allows 5 minutes of clock skew on nbf.
		{"not yet valid", clock.Now().Add(time.Hour), time.Hour, "token not yet valid"},
		{"within skew", clock.Now().Add(4 * time.Minute), time.Hour, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := req
			r.TTL = tt.ttl
			tok := s.mint(t, r, tt.minted)
			_, err := v.Verify(t.Context(), tok)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				return
			}
			wantInvalid(t, err, tok, tt.wantErr)
		})
	}
}

func TestVerifyWrongAudience(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL(), Audience: "other"})
	tok := s.mint(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"}, clock.Now())
	_, err := v.Verify(t.Context(), tok)
	wantInvalid(t, err, tok, "wrong audience")
}

func TestVerifyForeignKey(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})

	// Another dev issuer (its own directory, so its own key) claiming the
	// same URL: its tokens route to s but must not verify with s's key.
	impostor, err := devissuer.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := impostor.SetURL(s.URL()); err != nil {
		t.Fatal(err)
	}
	tok, err := impostor.Mint(devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "mallory", Role: identity.RoleAdmin}, clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Verify(t.Context(), tok)
	wantInvalid(t, err, tok, "bad signature")
}

func TestVerifyTampered(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})
	tok := s.mint(t, devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "olga", Role: identity.RoleViewer}, clock.Now())
	if _, err := v.Verify(t.Context(), tok); err != nil {
		t.Fatalf("untampered token: %v", err)
	}

	// Promote the viewer to admin, keeping header and signature.
	parts := strings.Split(tok, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	claims["muster_role"] = "admin"
	payload, err = json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	parts[1] = base64.RawURLEncoding.EncodeToString(payload)
	tampered := strings.Join(parts, ".")

	_, err = v.Verify(t.Context(), tampered)
	wantInvalid(t, err, tampered, "bad signature")

	// Flipping one bit of the signature is caught too.
	sig := []byte(parts[2])
	sig[3] ^= 1
	parts[1] = strings.Split(tok, ".")[1]
	parts[2] = string(sig)
	_, err = v.Verify(t.Context(), strings.Join(parts, "."))
	if !errors.Is(err, identity.ErrInvalidToken) {
		t.Errorf("flipped signature: err = %v, want ErrInvalidToken", err)
	}
}

func TestVerifyUnknownIssuer(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	// The configured issuer does not exist; contacting it would fail with
	// ErrIssuerUnavailable instead of ErrUnknownIssuer.
	v := newVerifier(t, clock, identity.IssuerConfig{URL: "https://issuer.invalid"})
	tok := s.mint(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"}, clock.Now())

	_, err := v.Verify(t.Context(), tok)
	if !errors.Is(err, identity.ErrUnknownIssuer) {
		t.Fatalf("err = %v, want ErrUnknownIssuer", err)
	}
	wantInvalid(t, err, tok, "unknown issuer")
	if n := s.discoveries.Load(); n != 0 {
		t.Errorf("token's issuer was contacted %d times", n)
	}
}

func TestVerifyMalformed(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})

	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	payload := b64(`{"iss":"` + s.URL() + `","sub":"x","aud":"muster","exp":9999999999,"muster_kind":"tool"}`)
	good := s.mint(t, devissuer.TokenRequest{Kind: identity.KindTool, Subject: "x"}, clock.Now())
	goodParts := strings.Split(good, ".")

	tests := []struct {
		name   string
		raw    string
		reason string
	}{
		{"one word", "garbage", "malformed token"},
		{"three empty parts", "..", "malformed token"},
		{"two parts", goodParts[0] + "." + goodParts[1], "malformed token"},
		{"four parts", good + ".x", "malformed token"},
		{"not base64", "a$b.c$d.e$f", "malformed token"},
		{"JWE shape", "a.b.c.d.e", "malformed token"},
		{"alg none", b64(`{"alg":"none"}`) + "." + payload + ".", "malformed token"},
		{"HS256", b64(`{"alg":"HS256","typ":"JWT"}`) + "." + payload + "." + b64("mac"), "malformed token"},
		{"payload not JSON", goodParts[0] + "." + b64("not json") + "." + goodParts[2], "malformed token"},
		{"iss not a string", goodParts[0] + "." + b64(`{"iss":42}`) + "." + goodParts[2], "malformed token"},
		{"no iss", goodParts[0] + "." + b64(`{"sub":"x"}`) + "." + goodParts[2], "missing issuer"},
		{"too large", goodParts[0] + "." + strings.Repeat("A", 17<<10) + "." + goodParts[2], "token too large"},
		{"surrounding space", " " + good, "malformed token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := v.Verify(t.Context(), tt.raw)
			wantInvalid(t, err, tt.raw, tt.reason)
		})
	}

	t.Run("empty", func(t *testing.T) {
		t.Parallel()
		_, err := v.Verify(t.Context(), "")
		if !errors.Is(err, identity.ErrNoToken) {
			t.Errorf("err = %v, want ErrNoToken", err)
		}
	})

	t.Cleanup(func() {
		// Everything above is refused before routing: the issuer is never
		// contacted.
		if n := s.discoveries.Load(); n != 0 {
			t.Errorf("malformed tokens caused %d discoveries", n)
		}
	})
}

// TestVerifyClaims signs claims that Mint would refuse to check that Verify
// refuses them too.
func TestVerifyClaims(t *testing.T) {
	t.Parallel()
	s := newDevServerWithKey(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})

	tests := []struct {
		name    string
		edit    func(c map[string]any)
		wantErr string // "" for success
	}{
		{"valid workload", func(c map[string]any) { c["muster_kind"] = "workload"; c["muster_service"] = "web" }, ""},
		{"audience as a list with others", func(c map[string]any) {
			c["aud"] = []string{"kubernetes", "muster"}
			c["muster_kind"] = "tool"
		}, ""},
		{"audience as a string", func(c map[string]any) { c["aud"] = "muster"; c["muster_kind"] = "tool" }, ""},
		{"unknown claims are ignored", func(c map[string]any) {
			c["muster_kind"] = "tool"
			c["kubernetes.io"] = map[string]any{"namespace": "x"}
		}, ""},
		{"missing kind", func(c map[string]any) {}, "missing kind"},
		{"empty kind", func(c map[string]any) { c["muster_kind"] = "" }, "missing kind"},
		{"kind spelled in another case", func(c map[string]any) { c["Muster_Kind"] = "tool" }, "missing kind"},
		{"unknown kind", func(c map[string]any) { c["muster_kind"] = "root" }, `unknown kind "root"`},
		{"uppercase kind", func(c map[string]any) { c["muster_kind"] = "Workload" }, `unknown kind "Workload"`},
		{"kind not a string", func(c map[string]any) { c["muster_kind"] = 7 }, "claim muster_kind has the wrong type"},
		{"long kind is truncated", func(c map[string]any) { c["muster_kind"] = strings.Repeat("k", 500) }, `unknown kind "kkkk`},
		{"control characters are quoted", func(c map[string]any) { c["muster_kind"] = "x\nlevel=ERROR" }, `unknown kind "x\nlevel=ERROR"`},
		{"missing subject", func(c map[string]any) { delete(c, "sub"); c["muster_kind"] = "tool" }, "missing subject"},
		{"subject with control character", func(c map[string]any) { c["sub"] = "a\x00b"; c["muster_kind"] = "tool" }, "invalid subject"},
		{"workload without service", func(c map[string]any) { c["muster_kind"] = "workload" }, "workload without service"},
		{"bad service name", func(c map[string]any) { c["muster_kind"] = "workload"; c["muster_service"] = "Web_1" }, `invalid service name "Web_1"`},
		{"service with slash", func(c map[string]any) { c["muster_kind"] = "prober"; c["muster_service"] = "a/b" }, `invalid service name "a/b"`},
		{"role on workload", func(c map[string]any) {
			c["muster_kind"] = "workload"
			c["muster_service"] = "web"
			c["muster_role"] = "admin"
		}, "role not allowed for kind workload"},
		{"team on prober", func(c map[string]any) { c["muster_kind"] = "prober"; c["muster_team"] = "x" }, "team not allowed for kind prober"},
		{"service on operator", func(c map[string]any) { c["muster_kind"] = "operator"; c["muster_service"] = "web" }, "service not allowed for kind operator"},
		{"bad role", func(c map[string]any) { c["muster_kind"] = "operator"; c["muster_role"] = "root" }, `unknown role "root"`},
		{"role not a string", func(c map[string]any) { c["muster_kind"] = "operator"; c["muster_role"] = true }, "claim muster_role has the wrong type"},
		{"bad address", func(c map[string]any) { c["muster_kind"] = "tool"; c["muster_addresses"] = []string{"10.0.0.300"} }, `bad address "10.0.0.300"`},
		{"address with zone", func(c map[string]any) { c["muster_kind"] = "tool"; c["muster_addresses"] = []string{"fe80::1%eth0"} }, `bad address "fe80::1%eth0"`},
		{"address with port", func(c map[string]any) { c["muster_kind"] = "tool"; c["muster_addresses"] = []string{"10.0.0.1:80"} }, `bad address "10.0.0.1:80"`},
		{"addresses not a list", func(c map[string]any) { c["muster_kind"] = "tool"; c["muster_addresses"] = "10.0.0.1" }, "claim muster_addresses has the wrong type"},
		{"too many addresses", func(c map[string]any) {
			c["muster_kind"] = "tool"
			c["muster_addresses"] = strings.Split(strings.Repeat("10.0.0.1,", 33), ",")[:33]
		}, "too many addresses"},
		{"no expiry", func(c map[string]any) { delete(c, "exp"); c["muster_kind"] = "tool" }, "token expired"},
		{"audience missing", func(c map[string]any) { delete(c, "aud"); c["muster_kind"] = "tool" }, "wrong audience"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := s.baseClaims(clock.Now())
			tt.edit(c)
			tok := s.sign(t, c)
			_, err := v.Verify(t.Context(), tok)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				return
			}
			wantInvalid(t, err, tok, tt.wantErr)
			if len(err.Error()) > 120 {
				t.Errorf("error text is %d bytes long: %q", len(err.Error()), err)
			}
		})
	}
}

// TestDiscoveryRetry checks that a failed discovery is retried, but not
// before the retry interval, and that success is cached.
func TestDiscoveryRetry(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})
	tok := s.mint(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"}, clock.Now())

	verify := func(wantOK bool, wantDiscoveries int32) {
		t.Helper()
		_, err := v.Verify(t.Context(), tok)
		switch {
		case wantOK && err != nil:
			t.Fatalf("Verify: %v", err)
		case !wantOK && !errors.Is(err, identity.ErrIssuerUnavailable):
			t.Fatalf("Verify: err = %v, want ErrIssuerUnavailable", err)
		case !wantOK && errors.Is(err, identity.ErrInvalidToken):
			t.Fatalf("Verify: err = %v blames the token for the issuer", err)
		case err != nil && strings.Contains(err.Error(), tok):
			t.Fatalf("error text contains the token")
		}
		if n := s.discoveries.Load(); n != wantDiscoveries {
			t.Fatalf("discoveries = %d, want %d", n, wantDiscoveries)
		}
	}

	s.failDiscovery.Store(true)
	verify(false, 1)
	verify(false, 1) // within the interval: the last error, no request

	s.failDiscovery.Store(false)
	clock.Advance(4 * time.Second)
	verify(false, 1) // the issuer is back, but the interval has not passed

	clock.Advance(time.Second)
	verify(true, 2) // retried
	verify(true, 2) // cached

	s.failDiscovery.Store(true)
	clock.Advance(time.Hour)
	tok = s.mint(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"}, clock.Now())
	verify(true, 2) // success is never rediscovered
}

// TestDiscoveryConcurrent checks that concurrent first calls share one
// discovery.
func TestDiscoveryConcurrent(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})
	tok := s.mint(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"}, clock.Now())

	arrived, release := s.hold()
	const callers = 16
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			_, err := v.Verify(t.Context(), tok)
			errs <- err
		})
	}
	<-arrived
	release()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Verify: %v", err)
		}
	}
	if n := s.discoveries.Load(); n != 1 {
		t.Errorf("discoveries = %d, want 1", n)
	}
}

// TestDiscoveryCallerGivesUp checks that a caller whose context ends stops
// waiting without failing the discovery for others.
func TestDiscoveryCallerGivesUp(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})
	tok := s.mint(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"}, clock.Now())

	arrived, release := s.hold()
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := v.Verify(ctx, tok)
		errc <- err
	}()
	<-arrived
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	release()

	if _, err := v.Verify(t.Context(), tok); err != nil {
		t.Fatalf("Verify after the impatient caller: %v", err)
	}
	if n := s.discoveries.Load(); n != 1 {
		t.Errorf("discoveries = %d, want 1", n)
	}
}

// TestKeysUnavailable checks that a key set that cannot be fetched is the
// issuer's failure, not the token's.
func TestKeysUnavailable(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})
	tok := s.mint(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"}, clock.Now())

	s.failJWKS.Store(true)
	_, err := v.Verify(t.Context(), tok)
	if !errors.Is(err, identity.ErrIssuerUnavailable) || errors.Is(err, identity.ErrInvalidToken) {
		t.Fatalf("err = %v, want ErrIssuerUnavailable only", err)
	}

	// The key set is not asked again within a second of a failed fetch:
	// the same answer, no fetch.
	s.failJWKS.Store(false)
	fetches := s.jwksFetches.Load()
	if _, err := v.Verify(t.Context(), tok); !errors.Is(err, identity.ErrIssuerUnavailable) {
		t.Fatalf("Verify within 1 s of the failed fetch: err = %v, want ErrIssuerUnavailable", err)
	}
	if got := s.jwksFetches.Load(); got != fetches {
		t.Fatalf("key set fetched %d more times within 1 s of a failed fetch, want none", got-fetches)
	}
	// A failure is retried after a second, not the 10 s an unknown key
	// ID waits: holding no key, muster refuses every token until a fetch
	// succeeds, and leases must be renewable again soon.
	clock.Advance(time.Second)
	if _, err := v.Verify(t.Context(), tok); err != nil {
		t.Fatalf("Verify a second after the failed fetch, the issuer back: %v", err)
	}
}

// TestUnknownKeyIDsFetchOncePer10s checks that tokens naming key IDs the
// issuer never published cost at most one key-set fetch per 10 s, and that
// a token whose key ID is known but whose signature is wrong costs none.
func TestUnknownKeyIDsFetchOncePer10s(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL()})
	good := s.mint(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"}, clock.Now())
	if _, err := v.Verify(t.Context(), good); err != nil {
		t.Fatal(err)
	}
	if got := s.jwksFetches.Load(); got != 1 {
		t.Fatalf("%d key set fetches for the first token, want 1", got)
	}

	forge := func() string {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		return forgeToken(t, key, rand.Text(), s.baseClaims(clock.Now()))
	}
	const n = 20
	for i := range n {
		_, err := v.Verify(t.Context(), forge())
		if !errors.Is(err, identity.ErrInvalidToken) {
			t.Fatalf("forged token %d: err = %v, want ErrInvalidToken", i, err)
		}
		clock.Advance(time.Second / 4) // 5 s in all
	}
	// The first forged token came within 10 s of the first fetch: none.
	if got := s.jwksFetches.Load(); got != 1 {
		t.Fatalf("%d forged tokens with unknown key IDs within 10 s caused %d key set fetches, want 0", n, got-1)
	}
	clock.Advance(5 * time.Second)
	for range n {
		_, _ = v.Verify(t.Context(), forge())
	}
	if got := s.jwksFetches.Load(); got != 2 {
		t.Fatalf("%d forged tokens 10 s after the last fetch caused %d fetches, want 1", n, got-1)
	}

	// A known key ID with a signature of another key: no fetch either.
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(10 * time.Second)
	kid := strings.Split(good, ".")[0]
	hdr, _ := base64.RawURLEncoding.DecodeString(kid)
	var h struct {
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(hdr, &h); err != nil || h.Kid == "" {
		t.Fatalf("dev token header %s has no kid: %v", hdr, err)
	}
	_, err = v.Verify(t.Context(), forgeToken(t, key, h.Kid, s.baseClaims(clock.Now())))
	wantInvalid(t, err, "", "bad signature")
	if got := s.jwksFetches.Load(); got != 2 {
		t.Fatalf("a known key ID with a wrong signature caused %d fetches, want 0", got-2)
	}
	// The real key still verifies without a fetch.
	if _, err := v.Verify(t.Context(), good); err != nil {
		t.Fatal(err)
	}
	if got := s.jwksFetches.Load(); got != 2 {
		t.Fatalf("a good token caused %d fetches, want 0", got-2)
	}
}

func TestNewVerifier(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		issuers []identity.IssuerConfig
		wantErr bool
	}{
		{"https", []identity.IssuerConfig{{URL: "https://oidc.eks.eu-west-1.amazonaws.com/id/ABC"}}, false},
		{"http on 127.0.0.1", []identity.IssuerConfig{{URL: "http://127.0.0.1:8080/dev/issuer"}}, false},
		{"http on localhost", []identity.IssuerConfig{{URL: "http://localhost:8080"}}, false},
		{"http on ::1", []identity.IssuerConfig{{URL: "http://[::1]:8080/x"}}, false},
		{"two issuers", []identity.IssuerConfig{{URL: "https://a.example"}, {URL: "https://b.example", Audience: "sts.amazonaws.com"}}, false},
		{"none", nil, true},
		{"empty URL", []identity.IssuerConfig{{}}, true},
		{"relative", []identity.IssuerConfig{{URL: "/dev/issuer"}}, true},
		{"http elsewhere", []identity.IssuerConfig{{URL: "http://issuer.example.com"}}, true},
		{"other scheme", []identity.IssuerConfig{{URL: "ftp://issuer.example.com"}}, true},
		{"query", []identity.IssuerConfig{{URL: "https://issuer.example.com?x=1"}}, true},
		{"fragment", []identity.IssuerConfig{{URL: "https://issuer.example.com#x"}}, true},
		// '#' separates a non-home issuer from the rest of a principal's name.
		{"empty fragment", []identity.IssuerConfig{{URL: "https://issuer.example.com/id#"}}, true},
		{"user info", []identity.IssuerConfig{{URL: "https://u:p@issuer.example.com"}}, true},
		{"unparsable", []identity.IssuerConfig{{URL: "https://[::1"}}, true},
		{"duplicate", []identity.IssuerConfig{{URL: "https://a.example"}, {URL: "https://a.example"}}, true},
		{"audience with space", []identity.IssuerConfig{{URL: "https://a.example", Audience: " muster"}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v, err := identity.NewVerifier(tt.issuers, nil)
			if (err != nil) != tt.wantErr {
				t.Fatalf("NewVerifier: err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && v == nil {
				t.Fatal("NewVerifier returned nil and no error")
			}
		})
	}
}

// FuzzVerify feeds arbitrary strings to Verify: it must not panic, must
// return either a valid principal or a classified error, and must never echo
// the token.
func FuzzVerify(f *testing.F) {
	s := newDevServerWithKey(f)
	clock := newFakeClock()
	v := newVerifier(f, clock, identity.IssuerConfig{URL: s.URL()})

	good := s.mint(f, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: []string{"10.0.0.1"}}, clock.Now())
	c := s.baseClaims(clock.Now())
	c["muster_kind"] = "operator"
	c["muster_addresses"] = []any{"::1", 3}
	odd := s.sign(f, c)
	for _, seed := range []string{
		"", ".", "..", "a.b.c", good, good + "x", odd, strings.ToUpper(good),
		good[:len(good)/2], strings.Replace(good, ".", "..", 1),
		"eyJhbGciOiJub25lIn0.eyJpc3MiOiJ4In0.",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		p, err := v.Verify(t.Context(), raw)
		if err == nil {
			if _, kerr := identity.ParseKind(string(p.Kind)); kerr != nil || p.Subject == "" {
				t.Fatalf("accepted token gave principal %+v", p)
			}
			return
		}
		if !errors.Is(err, identity.ErrNoToken) && !errors.Is(err, identity.ErrInvalidToken) &&
			!errors.Is(err, identity.ErrIssuerUnavailable) {
			t.Fatalf("unclassified error %v", err)
		}
		if len(raw) >= 40 && strings.Contains(err.Error(), raw) {
			t.Fatalf("error text contains the token")
		}
	})
}

// TestLoopbackFamily (issue 27): every `muster dev` process on one data
// folder signs with the folder's key under its own loopback address. A
// verifier given the key and the path trusts all of them, with no
// discovery (the process that minted may be gone), as home principals;
// it refuses another key, another path and a non-loopback host. https
// is one of the family (a dev process serving TLS, issue 28): the key,
// not the scheme, is what is trusted.
func TestLoopbackFamily(t *testing.T) {
	t.Parallel()
	s := newDevServerWithKey(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: s.URL(), Keys: []crypto.PublicKey{&s.key.PublicKey}, LoopbackPath: issuerPath})
	claims := func(iss string) map[string]any {
		c := s.baseClaims(clock.Now())
		c["iss"] = iss
		c[identity.ClaimKind] = "operator"
		c[identity.ClaimRole] = "admin"
		return c
	}
	for _, iss := range []string{s.URL(), "http://127.0.0.1:1/dev/issuer", "http://localhost:65000/dev/issuer", "http://[::1]:8080/dev/issuer", "https://127.0.0.1:8080/dev/issuer"} {
		tok := s.sign(t, claims(iss))
		p, err := v.Verify(t.Context(), tok)
		if err != nil || !p.Home || p.String() != "operator:alice" {
			t.Errorf("iss %s: %+v %v; want the home principal operator:alice", iss, p, err)
		}
	}
	if n := s.discoveries.Load() + s.jwksFetches.Load(); n != 0 {
		t.Errorf("%d discovery or key fetches; a verifier given the key needs none", n)
	}
	for _, iss := range []string{"http://10.0.0.1:8080/dev/issuer", "http://127.0.0.1:8080/other", "ftp://127.0.0.1:8080/dev/issuer",
		"http://127.0.0.1/dev/issuer", "http://u@127.0.0.1:8080/dev/issuer", "http://127.0.0.1:8080/dev/issuer?x=1"} {
		tok := s.sign(t, claims(iss))
		if _, err := v.Verify(t.Context(), tok); !errors.Is(err, identity.ErrUnknownIssuer) {
			t.Errorf("iss %s: %v, want unknown issuer", iss, err)
		}
	}
	// Another data folder's key under a loopback URL: bad signature.
	other := newDevServer(t)
	if err := other.issuer.SetURL("http://127.0.0.1:2/dev/issuer"); err != nil {
		t.Fatal(err)
	}
	tok := other.mint(t, devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "mallory", Role: identity.RoleAdmin}, clock.Now())
	_, err := v.Verify(t.Context(), tok)
	wantInvalid(t, err, tok, "bad signature")
	if _, err := identity.NewVerifier([]identity.IssuerConfig{{URL: s.URL(), LoopbackPath: issuerPath}}, nil); err == nil {
		t.Error("a loopback path without keys was accepted")
	}
}
