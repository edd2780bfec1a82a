package devissuer

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/zitadel/oidc/v3/pkg/op"

	"github.com/musterhq/muster/internal/identity"
)

const (
	devKeyFile    = "dev-issuer-key.pem"
	devConfigFile = "dev-issuer.json"
	devKeyBits    = 2048
	// devCacheControl lets clients cache the documents briefly; the dev key
	// only changes when its file is deleted, and go-oidc refetches keys on an
	// unknown kid regardless.
	devCacheControl = "public, max-age=300"

	defaultTokenTTL = time.Hour
	maxTokenTTL     = 24 * time.Hour
)

// Issuer is the OIDC issuer built into `muster dev`. It signs tokens with
// an RSA key kept on disk and publishes the public key through the
// standard discovery documents, so its tokens go through the same
// identity.Verifier as those of production issuers. It is safe for
// concurrent use.
type Issuer struct {
	dir string
	key *rsa.PrivateKey
	kid string

	provider *op.Provider
	storage  *devStorage

	mu  sync.RWMutex
	url string
}

// LoadOrCreate returns the dev issuer whose state lives in dir,
// creating dir (mode 0700) and an RSA-2048 key in dir/dev-issuer-key.pem
// (mode 0600) if they do not exist. An existing key is reused, so tokens
// survive restarts; a key file readable by group or others is refused. The
// issuer URL is loaded from dir/dev-issuer.json if SetURL saved one.
func LoadOrCreate(dir string) (*Issuer, error) {
	if dir == "" {
		return nil, errors.New("load dev issuer: empty directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("load dev issuer: %w", err)
	}
	keyPath := filepath.Join(dir, devKeyFile)
	key, err := loadDevKey(keyPath)
	if errors.Is(err, fs.ErrNotExist) {
		key, err = createDevKey(dir, keyPath)
	}
	if err != nil {
		return nil, fmt.Errorf("load dev issuer: %w", err)
	}

	pub := jose.JSONWebKey{Key: &key.PublicKey}
	thumb, err := pub.Thumbprint(crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("load dev issuer: key thumbprint: %w", err)
	}
	d := &Issuer{dir: dir, key: key, kid: base64.RawURLEncoding.EncodeToString(thumb)}
	if d.url, err = loadDevURL(filepath.Join(dir, devConfigFile)); err != nil {
		return nil, fmt.Errorf("load dev issuer: %w", err)
	}
	if err := d.newProvider(); err != nil {
		return nil, fmt.Errorf("load dev issuer: %w", err)
	}
	return d, nil
}

func loadDevKey(path string) (*rsa.PrivateKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("key file %s has mode %04o, want 0600 (chmod 600 it)", path, perm)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("key file %s: no PEM block (delete it to generate a new key)", path)
	}
	var parsed any
	switch block.Type {
	case "PRIVATE KEY":
		parsed, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		parsed, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("key file %s: unexpected PEM block %q", path, block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	key, ok := parsed.(*rsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("key file %s: not an RSA key", path)
	}
	if key.N.BitLen() < devKeyBits {
		return nil, fmt.Errorf("key file %s: RSA key of %d bits, want at least %d", path, key.N.BitLen(), devKeyBits)
	}
	return key, nil
}

// createDevKey writes a new key to path without ever exposing a partial
// file: it is written to a temporary file and hard-linked into place, and
// the link fails if another process created the key first, in which case
// that key wins and is loaded.
func createDevKey(dir, path string) (*rsa.PrivateKey, error) {
	key, err := rsa.GenerateKey(rand.Reader, devKeyBits)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	tmp, err := writeTemp(dir, ".dev-issuer-key-*", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if err != nil {
		return nil, fmt.Errorf("write key: %w", err)
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return loadDevKey(path)
		}
		return nil, fmt.Errorf("write key: %w", err)
	}
	return key, nil
}

// writeTemp writes data to a new mode 0600 file in dir and returns its name.
func writeTemp(dir, pattern string, data []byte) (name string, err error) {
	f, err := os.CreateTemp(dir, pattern) // CreateTemp uses mode 0600
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return f.Name(), nil
}

// devConfig is the content of dev-issuer.json.
type devConfig struct {
	Issuer string `json:"issuer"`
}

func loadDevURL(path string) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var c devConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if err := identity.ValidateIssuerURL(c.Issuer); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return c.Issuer, nil
}

// SetURL sets the issuer URL, e.g. "http://127.0.0.1:8080/dev/issuer", and
// saves it to dir/dev-issuer.json so that `muster token`, a separate process,
// mints tokens for the same issuer. The URL must be one identity.NewVerifier accepts:
// https, or http on a loopback host.
func (d *Issuer) SetURL(url string) error {
	if err := identity.ValidateIssuerURL(url); err != nil {
		return fmt.Errorf("set dev issuer URL: %w", err)
	}
	data, err := json.Marshal(devConfig{Issuer: url})
	if err != nil {
		return fmt.Errorf("set dev issuer URL: %w", err)
	}
	tmp, err := writeTemp(d.dir, ".dev-issuer-*.json", append(data, '\n'))
	if err != nil {
		return fmt.Errorf("set dev issuer URL: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, devConfigFile)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("set dev issuer URL: %w", err)
	}
	d.mu.Lock()
	d.url = url
	d.mu.Unlock()
	return nil
}

// PublicKey is the issuer's public key: every process on one data folder
// signs with it, so a verifier given it trusts them all without
// discovery (identity.IssuerConfig.Keys and LoopbackPath).
func (d *Issuer) PublicKey() crypto.PublicKey { return &d.key.PublicKey }

// URL returns the issuer URL: the last one set, else the one saved in
// dir/dev-issuer.json when the issuer was loaded, else "".
func (d *Issuer) URL() string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.url
}

// Handler serves the issuer as an OpenID Provider built on zitadel/oidc's op
// package. Mount it with http.StripPrefix at the path of the issuer URL. It
// serves the public documents, GET /.well-known/openid-configuration and
// GET /jwks (discovery answers 503 while no URL is set), the authorization
// code flow with PKCE (/authorize, /authorize/callback, POST /oauth/token,
// /userinfo), and /login, the dev sign-in page where a development user is
// picked (Users). Clients are registered with RegisterClient.
func (d *Issuer) Handler() http.Handler {
	mux := http.NewServeMux()
	public := func(w http.ResponseWriter, r *http.Request) {
		if d.URL() == "" {
			http.Error(w, "dev issuer URL not set", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Cache-Control", devCacheControl)
		d.provider.ServeHTTP(w, r)
	}
	mux.HandleFunc("GET /.well-known/openid-configuration", public)
	mux.HandleFunc("GET /jwks", public)
	mux.HandleFunc("GET /login", d.serveLogin)
	mux.Handle("POST /login", http.NewCrossOriginProtection().Handler(http.HandlerFunc(d.login)))
	for _, p := range []string{"/authorize", "/authorize/callback", "/oauth/token", "/userinfo"} {
		mux.Handle(p, d.provider)
	}
	return mux
}

// RegisterClient registers (or replaces) an OAuth client of the issuer,
// e.g. the web UI of `muster dev`.
func (d *Issuer) RegisterClient(c Client) error {
	if c.ID == "" || c.Secret == "" || len(c.RedirectURIs) == 0 {
		return errors.New("register dev client: ID, Secret and RedirectURIs are required")
	}
	d.storage.registerClient(c)
	return nil
}

// newProvider builds the OpenID Provider over the issuer's storage. Its
// issuer is read on every request, since the URL is only known once the
// server listens.
func (d *Issuer) newProvider() error {
	var cryptoKey [32]byte
	if _, err := rand.Read(cryptoKey[:]); err != nil {
		return fmt.Errorf("token encryption key: %w", err)
	}
	d.storage = newDevStorage(d)
	cfg := &op.Config{
		CryptoKey:      cryptoKey,
		CodeMethodS256: true,
		SupportedClaims: append(slices.Clone(op.DefaultSupportedClaims),
			identity.ClaimKind, identity.ClaimService, identity.ClaimTeam, identity.ClaimRole, identity.ClaimAddresses),
	}
	issuer := func(bool) (op.IssuerFromRequest, error) {
		return func(*http.Request) string { return d.URL() }, nil
	}
	p, err := op.NewProvider(cfg, d.storage, issuer,
		op.WithAllowInsecure(), // http on loopback only: SetURL enforces it
		op.WithCustomKeysEndpoint(op.NewEndpoint("jwks")),
	)
	if err != nil {
		return fmt.Errorf("new OpenID provider: %w", err)
	}
	d.provider = p
	return nil
}

var loginPage = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in · muster dev issuer</title>
<style>
body{font:16px/1.5 system-ui,sans-serif;max-width:28rem;margin:4rem auto;padding:0 1rem;color:#1b1f24}
h1{font-size:1.3rem}form{margin:.5rem 0}button{width:100%;padding:.7rem;font:inherit;text-align:left;border:1px solid #8a94a0;border-radius:6px;background:#f6f8fa;cursor:pointer}
button:hover,button:focus{background:#e7edf3}.role{float:right;color:#4a5360}.err{color:#a40e26}
</style></head><body>
<h1>muster dev issuer: sign in</h1>
<p>Development users only. Pick who you are; the sign-in completes the same OpenID Connect code flow a production issuer uses.</p>
{{if .Error}}<p class="err" role="alert">{{.Error}}</p>{{end}}
{{range .Users}}<form method="post" action="login">
<input type="hidden" name="id" value="{{$.ID}}"><input type="hidden" name="user" value="{{.Subject}}">
<button type="submit" id="user-{{.Subject}}">{{.Subject}}<span class="role">{{.Role}}{{if .Team}} · team {{.Team}}{{end}}</span></button>
</form>{{end}}
</body></html>
`))

type loginData struct {
	ID    string
	Error string
	Users []User
}

func (d *Issuer) serveLogin(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	data := loginData{ID: id, Users: Users()}
	status := http.StatusOK
	if _, err := d.storage.AuthRequestByID(r.Context(), id); err != nil {
		data.Error, data.Users, status = "This sign-in has expired or is unknown; go back to the application and start again.", nil, http.StatusBadRequest
	}
	renderLogin(w, status, data)
}

func (d *Issuer) login(w http.ResponseWriter, r *http.Request) {
	id, user := r.PostFormValue("id"), r.PostFormValue("user")
	if err := d.storage.signIn(id, user); err != nil {
		renderLogin(w, http.StatusBadRequest, loginData{ID: id, Error: err.Error()})
		return
	}
	http.Redirect(w, r, d.URL()+"/authorize/callback?id="+url.QueryEscape(id), http.StatusFound)
}

func renderLogin(w http.ResponseWriter, status int, data loginData) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	w.WriteHeader(status)
	_ = loginPage.Execute(w, data) // the client may be gone
}

// TokenRequest describes a token for Issuer.Mint. Fields mean what the
// identity.Principal fields of the same name mean.
type TokenRequest struct {
	// Kind is required.
	Kind identity.Kind
	// Subject defaults to Service for workloads and probers; operators and
	// tools must name one, since it becomes the audit actor.
	Subject string
	// Service is required for workloads, optional for probers.
	Service string
	// Team is for operators and tools.
	Team string
	// Role is for operators and tools; identity.RoleViewer when empty.
	Role identity.Role
	// Addresses are IP addresses the token vouches for.
	Addresses []string
	// TTL is the token's lifetime: 1 h when zero, at most 24 h.
	TTL time.Duration
}

// Mint returns a token for req, valid from now for req.TTL, signed RS256
// with the issuer's key and addressed to the audience "muster". req is
// checked by the same rules identity.Verifier applies, so Mint never issues a token
// that Verify would refuse for its claims. The URL must be set.
func (d *Issuer) Mint(req TokenRequest, now time.Time) (string, error) {
	iss := d.URL()
	if iss == "" {
		return "", errors.New("mint token: dev issuer URL not set")
	}
	if now.IsZero() {
		return "", errors.New("mint token: zero time")
	}
	ttl := req.TTL
	switch {
	case ttl == 0:
		ttl = defaultTokenTTL
	case ttl < 0:
		return "", fmt.Errorf("mint token: negative TTL %s", ttl)
	case ttl > maxTokenTTL:
		return "", fmt.Errorf("mint token: TTL %s exceeds the maximum of %s", ttl, maxTokenTTL)
	}
	sub := req.Subject
	if sub == "" && (req.Kind == identity.KindWorkload || req.Kind == identity.KindProber) {
		sub = req.Service
	}
	p, err := identity.NewPrincipal(iss, sub, identity.Claims{
		Kind:      string(req.Kind),
		Service:   req.Service,
		Team:      req.Team,
		Role:      string(req.Role),
		Addresses: req.Addresses,
	})
	if err != nil {
		return "", fmt.Errorf("mint token: %w", err)
	}

	// The claims are written from the validated principal, so the token
	// states the defaults (a tool's viewer role) and canonical addresses.
	addrs := make([]string, len(p.Addresses))
	for i, a := range p.Addresses {
		addrs[i] = a.String()
	}
	custom := map[string]any{identity.ClaimKind: p.Kind}
	for name, v := range map[string]string{identity.ClaimService: p.Service, identity.ClaimTeam: p.Team, identity.ClaimRole: string(p.Role)} {
		if v != "" {
			custom[name] = v
		}
	}
	if len(addrs) > 0 {
		custom[identity.ClaimAddresses] = addrs
	}

	signer, err := jose.NewSigner(jose.SigningKey{
		Algorithm: jose.RS256,
		Key:       jose.JSONWebKey{Key: d.key, KeyID: d.kid, Algorithm: string(jose.RS256)},
	}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return "", fmt.Errorf("mint token: new signer: %w", err)
	}
	std := jwt.Claims{
		Issuer:    iss,
		Subject:   p.Subject,
		Audience:  jwt.Audience{identity.DefaultAudience},
		IssuedAt:  jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now),
		Expiry:    jwt.NewNumericDate(now.Add(ttl)),
	}
	tok, err := jwt.Signed(signer).Claims(std).Claims(custom).Serialize()
	if err != nil {
		return "", fmt.Errorf("mint token: sign: %w", err)
	}
	return tok, nil
}
