package devissuer_test

import (
	"bytes"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
)

func TestLoadOrCreateDevIssuerReusesKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := serveDevIssuer(t, dir)
	keyPath := filepath.Join(dir, "dev-issuer-key.pem")
	before, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}

	// A second load of the same directory, as `muster token` or a restarted
	// `muster dev` does, finds the same key and URL.
	d2, err := devissuer.LoadOrCreate(dir)
	if err != nil {
		t.Fatalf("second load: %v", err)
	}
	if d2.URL() != s.URL() {
		t.Errorf("URL() = %q, want the saved %q", d2.URL(), s.URL())
	}
	after, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("key file was rewritten")
	}

	// Its tokens verify against the first instance's published key.
	v, err := identity.NewVerifier([]identity.IssuerConfig{{URL: s.URL()}}, &http.Client{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := d2.Mint(devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "oscar"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(t.Context(), tok); err != nil {
		t.Fatalf("token of the reloaded issuer: %v", err)
	}

	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"dev-issuer-key.pem", "dev-issuer.json"}, names); diff != "" {
		t.Errorf("files left in dir (-want +got):\n%s", diff)
	}
}

func TestDevIssuerFileModes(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "state", "muster")
	d, err := devissuer.LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetURL("http://127.0.0.1:8080/dev/issuer"); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{
		dir:                                      0o700,
		filepath.Join(dir, "dev-issuer-key.pem"): 0o600,
		filepath.Join(dir, "dev-issuer.json"):    0o600,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %04o, want %04o", path, got, want)
		}
	}
}

func TestLoadOrCreateDevIssuerRefusesBadKeys(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		content string
		mode    os.FileMode
	}{
		{"readable by others", "", 0o644},
		{"not PEM", "hello", 0o600},
		{"wrong PEM type", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", 0o600},
		{"bad DER", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", 0o600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			keyPath := filepath.Join(dir, "dev-issuer-key.pem")
			content := []byte(tt.content)
			if tt.content == "" {
				// A valid key with a loose mode.
				if _, err := devissuer.LoadOrCreate(dir); err != nil {
					t.Fatal(err)
				}
				var err error
				if content, err = os.ReadFile(keyPath); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(keyPath, content, tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(keyPath, tt.mode); err != nil {
				t.Fatal(err)
			}
			if _, err := devissuer.LoadOrCreate(dir); err == nil {
				t.Fatal("LoadOrCreate succeeded")
			}
			got, err := os.ReadFile(keyPath)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, content) {
				t.Error("a refused key file was overwritten")
			}
		})
	}
}

func TestDevIssuerSetURL(t *testing.T) {
	t.Parallel()
	d, err := devissuer.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if d.URL() != "" {
		t.Errorf("URL() = %q before SetURL", d.URL())
	}
	for _, bad := range []string{"", "127.0.0.1:8080", "http://example.com/dev", "https://x.example/?a=b"} {
		if err := d.SetURL(bad); err == nil {
			t.Errorf("SetURL(%q) succeeded", bad)
		}
	}
	if d.URL() != "" {
		t.Errorf("URL() = %q after refused SetURL calls", d.URL())
	}
	if _, err := d.Mint(devissuer.TokenRequest{Kind: identity.KindTool, Subject: "x"}, time.Now()); err == nil {
		t.Error("Mint without a URL succeeded")
	}
	const u = "https://muster.example/dev/issuer"
	if err := d.SetURL(u); err != nil {
		t.Fatal(err)
	}
	if d.URL() != u {
		t.Errorf("URL() = %q, want %q", d.URL(), u)
	}
}

func TestDevIssuerHandler(t *testing.T) {
	t.Parallel()
	d, err := devissuer.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h := http.StripPrefix(issuerPath, d.Handler())
	get := func(method, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, issuerPath+path, nil))
		return rec
	}

	if rec := get("GET", "/.well-known/openid-configuration"); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("discovery without URL: status %d, want 503", rec.Code)
	}
	const iss = "http://127.0.0.1:9/dev/issuer"
	if err := d.SetURL(iss); err != nil {
		t.Fatal(err)
	}

	rec := get("GET", "/.well-known/openid-configuration")
	if rec.Code != http.StatusOK {
		t.Fatalf("discovery: status %d", rec.Code)
	}
	checkHeaders(t, rec)
	var doc map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{
		"issuer":                                iss,
		"jwks_uri":                              iss + "/jwks",
		"id_token_signing_alg_values_supported": []any{"RS256"},
		"response_types_supported":              []any{"code", "id_token", "id_token token"},
		"code_challenge_methods_supported":      []any{"S256"},
		"subject_types_supported":               []any{"public"},
	} {
		if diff := cmp.Diff(want, doc[k]); diff != "" {
			t.Errorf("discovery %s (-want +got):\n%s", k, diff)
		}
	}

	rec = get("GET", "/jwks")
	if rec.Code != http.StatusOK {
		t.Fatalf("jwks: status %d", rec.Code)
	}
	checkHeaders(t, rec)
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(rec.Body.Bytes(), &set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 1 {
		t.Fatalf("jwks has %d keys, want 1", len(set.Keys))
	}
	key := set.Keys[0]
	if !key.IsPublic() || key.Algorithm != "RS256" || key.Use != "sig" {
		t.Errorf("jwks key: public %v, alg %q, use %q", key.IsPublic(), key.Algorithm, key.Use)
	}
	thumb, err := key.Thumbprint(crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if want := base64.RawURLEncoding.EncodeToString(thumb); key.KeyID != want {
		t.Errorf("kid = %q, want the RFC 7638 thumbprint %q", key.KeyID, want)
	}
	if strings.Contains(rec.Body.String(), `"d"`) {
		t.Error("jwks contains a private exponent")
	}

	// HEAD is served like GET; other methods and paths are not.
	if rec := get("HEAD", "/jwks"); rec.Code != http.StatusOK {
		t.Errorf("HEAD /jwks: status %d", rec.Code)
	}
	if rec := get("POST", "/jwks"); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /jwks: status %d, want 405", rec.Code)
	}
	if rec := get("GET", "/token"); rec.Code != http.StatusNotFound {
		t.Errorf("GET /token: status %d, want 404", rec.Code)
	}
}

func checkHeaders(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	if cc := rec.Header().Get("Cache-Control"); !strings.Contains(cc, "max-age=") {
		t.Errorf("Cache-Control = %q", cc)
	}
}

func TestMint(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	now := time.Unix(1_800_000_000, 0)
	set := fetchKeys(t, s)

	tests := []struct {
		name    string
		ttl     time.Duration
		wantTTL time.Duration
	}{
		{"default TTL", 0, time.Hour},
		{"short TTL", 5 * time.Minute, 5 * time.Minute},
		{"maximum TTL", 24 * time.Hour, 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			raw, err := s.issuer.Mint(devissuer.TokenRequest{Kind: identity.KindTool, Subject: "tg-sync", TTL: tt.ttl}, now)
			if err != nil {
				t.Fatal(err)
			}
			tok, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.RS256})
			if err != nil {
				t.Fatal(err)
			}
			h := tok.Headers[0]
			if h.KeyID != set.Keys[0].KeyID || h.Algorithm != "RS256" || h.ExtraHeaders["typ"] != "JWT" {
				t.Errorf("header: kid %q alg %q typ %v", h.KeyID, h.Algorithm, h.ExtraHeaders["typ"])
			}
			var std jwt.Claims
			custom := map[string]any{}
			if err := tok.Claims(set.Keys[0].Key, &std, &custom); err != nil {
				t.Fatalf("claims with the published key: %v", err)
			}
			if err := std.Validate(jwt.Expected{
				Issuer: s.URL(), Subject: "tg-sync", AnyAudience: jwt.Audience{"muster"}, Time: now,
			}); err != nil {
				t.Errorf("standard claims: %v", err)
			}
			if got := std.Expiry.Time().Sub(std.IssuedAt.Time()); got != tt.wantTTL {
				t.Errorf("exp - iat = %s, want %s", got, tt.wantTTL)
			}
			if !std.NotBefore.Time().Equal(now) || !std.IssuedAt.Time().Equal(now) {
				t.Errorf("nbf %v iat %v, want %v", std.NotBefore.Time(), std.IssuedAt.Time(), now)
			}
			// Defaults are written out, not left to the verifier.
			if custom["muster_kind"] != "tool" || custom["muster_role"] != "viewer" {
				t.Errorf("custom claims %v", custom)
			}
		})
	}
}

func fetchKeys(t *testing.T, s *devServer) jose.JSONWebKeySet {
	t.Helper()
	resp, err := s.srv.Client().Get(s.URL() + "/jwks")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(resp.Body).Decode(&set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 1 {
		t.Fatalf("%d keys", len(set.Keys))
	}
	return set
}

func TestMintRefuses(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	now := time.Now()
	tests := []struct {
		name    string
		req     devissuer.TokenRequest
		now     time.Time
		wantErr string
	}{
		{"no kind", devissuer.TokenRequest{Subject: "x"}, now, "missing kind"},
		{"unknown kind", devissuer.TokenRequest{Kind: "root", Subject: "x"}, now, `unknown kind "root"`},
		{"workload without service", devissuer.TokenRequest{Kind: identity.KindWorkload, Subject: "x"}, now, "workload without service"},
		{"prober without service or subject", devissuer.TokenRequest{Kind: identity.KindProber}, now, "missing subject"},
		{"operator without subject", devissuer.TokenRequest{Kind: identity.KindOperator}, now, "missing subject"},
		{"tool without subject", devissuer.TokenRequest{Kind: identity.KindTool, Role: identity.RoleAdmin}, now, "missing subject"},
		{"bad service", devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "-web"}, now, "invalid service name"},
		{"bad role", devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "o", Role: "root"}, now, `unknown role "root"`},
		{"role on workload", devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", Role: identity.RoleAdmin}, now, "role not allowed"},
		{"bad address", devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: []string{"web.local"}}, now, "bad address"},
		{"TTL too long", devissuer.TokenRequest{Kind: identity.KindTool, Subject: "x", TTL: 25 * time.Hour}, now, "exceeds the maximum"},
		{"negative TTL", devissuer.TokenRequest{Kind: identity.KindTool, Subject: "x", TTL: -time.Second}, now, "negative TTL"},
		{"zero time", devissuer.TokenRequest{Kind: identity.KindTool, Subject: "x"}, time.Time{}, "zero time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tok, err := s.issuer.Mint(tt.req, tt.now)
			if err == nil {
				t.Fatalf("Mint succeeded: %s", tok)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %q, want %q", err, tt.wantErr)
			}
		})
	}
}
