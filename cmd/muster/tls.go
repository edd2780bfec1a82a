package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/tlsreload"
)

// tlsFlags registers --tls-cert, --tls-key and --tls-ca; the
// environment fills what the flags leave empty (loadTLSEnv).
func tlsFlags(fs *flag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate (chain) every listener serves over TLS, with --tls-key; reloaded when the file changes (MUSTER_TLS_CERT)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of --tls-cert (MUSTER_TLS_KEY)")
	fs.StringVar(&cfg.TLSCA, "tls-ca", "", "PEM CA bundle muster trusts for its own calls to https peers (relay, forwarding, the UI's issuer); default the system roots (MUSTER_TLS_CA)")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "PEM CA bundle client certificates are verified against (mutual TLS, optional for clients): the API listener, and xDS when it shares --tls-cert, ask for one; reloaded when the file changes (MUSTER_TLS_CLIENT_CA)")
	fs.StringVar(&cfg.SPIFFEFile, "spiffe", "", "YAML file mapping SPIFFE trust domains' IDs to workloads, so a client certificate proves a workload without a token; needs --tls-client-ca (MUSTER_SPIFFE; docs/production.md)")
}

// loadTLSEnv fills the TLS files the flags left empty.
func loadTLSEnv(c *Config) {
	c.TLSCert = cmpOr(c.TLSCert, os.Getenv("MUSTER_TLS_CERT"))
	c.TLSKey = cmpOr(c.TLSKey, os.Getenv("MUSTER_TLS_KEY"))
	c.TLSCA = cmpOr(c.TLSCA, os.Getenv("MUSTER_TLS_CA"))
	c.TLSClientCA = cmpOr(c.TLSClientCA, os.Getenv("MUSTER_TLS_CLIENT_CA"))
	c.SPIFFEFile = cmpOr(c.SPIFFEFile, os.Getenv("MUSTER_SPIFFE"))
}

// validateTLS checks that the certificate and key come together.
func (c *Config) validateTLS() error {
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("--tls-cert (MUSTER_TLS_CERT) and --tls-key (MUSTER_TLS_KEY) go together: give both to serve TLS, or neither")
	}
	if c.TLSClientCA != "" && c.TLSCert == "" {
		return errors.New("--tls-client-ca (MUSTER_TLS_CLIENT_CA) verifies client certificates on a TLS listener: it needs --tls-cert and --tls-key")
	}
	if c.SPIFFEFile != "" && c.TLSClientCA == "" && c.XDSTLSClientCA == "" {
		return errors.New("--spiffe (MUSTER_SPIFFE) maps verified client certificates to workloads: it needs --tls-client-ca (or --xds-tls-client-ca), the CA bundle they are verified against")
	}
	if c.XDSTLSClientCA != "" && c.XDSTLSCert == "" {
		return errors.New("--xds-tls-client-ca verifies client certificates on xDS's own TLS pair: it needs --xds-tls-cert and --xds-tls-key (with the shared --tls-cert, use --tls-client-ca)")
	}
	if c.TLSCert != "" && c.UIInsecureCookie {
		return errors.New("MUSTER_UI_INSECURE_COOKIE is for plain http; with --tls-cert the session cookie is Secure")
	}
	return nil
}

// listenerTLS is the TLS every listener serves (nil: plain) and the
// client TLS for muster's own calls to its peers.
type listenerTLS struct {
	reloader *tlsreload.Reloader // nil: the listeners are plain
	client   *tls.Config         // nil: Go's defaults (the system roots)
	// issuer is the client TLS of the UI's calls to its OIDC issuer: the
	// system roots and the CA bundle both, since the bundle is the
	// region's private CA (peers) while the issuer is as often a public
	// one (nil: Go's defaults).
	issuer *tls.Config
	// clientCAs, when set, verify the client certificates the API
	// listener (and xDS sharing the pair) asks for; nil: none asked.
	clientCAs *tlsreload.ClientCAs
}

// setupTLS loads the certificate pair and the CA bundle. A pair that does
// not load stops the start: muster must not come up plain by mistake.
func setupTLS(cfg Config, log *slog.Logger) (*listenerTLS, error) {
	lt := &listenerTLS{}
	if cfg.TLSCert != "" {
		r, err := tlsreload.New(tlsreload.Config{CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey, Logger: log.With("component", "tls")})
		if err != nil {
			return nil, err
		}
		lt.reloader = r
		log.Info("serving TLS on every listener", "cert", cfg.TLSCert, "not_after", r.NotAfter().Format(time.RFC3339))
	}
	if cfg.TLSCA != "" {
		pool, err := caPool(cfg.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		lt.client = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		roots, err := x509.SystemCertPool()
		if err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		pem, err := os.ReadFile(cfg.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		roots.AppendCertsFromPEM(pem)
		lt.issuer = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	if cfg.TLSClientCA != "" {
		cas, err := tlsreload.NewClientCAs(tlsreload.ClientCAConfig{File: cfg.TLSClientCA, Logger: log.With("component", "tls")})
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		lt.clientCAs = cas
		log.Info("asking API clients for certificates (mutual TLS)", "client_ca", cfg.TLSClientCA, "spiffe", cfg.SPIFFEFile)
	}
	return lt, nil
}

// apiServer is server with the client CA bundle applied: the API
// listener's, and xDS's when it shares the pair.
func (lt *listenerTLS) apiServer() *tls.Config {
	c := lt.server()
	if c != nil && lt.clientCAs != nil {
		lt.clientCAs.Apply(c)
	}
	return c
}

// certAuth authenticates a client certificate chain: verified against
// the client CA bundle as it is now (the handshake did, against the
// bundle as it was then), then mapped by its SPIFFE ID.
type certAuth struct {
	cas *tlsreload.ClientCAs
	td  *identity.TrustDomains
}

// Principal is for server.ClientCertificates.
func (c certAuth) Principal(chain []*x509.Certificate) (identity.Principal, error) {
	if _, err := c.cas.Verify(chain); err != nil {
		return identity.Principal{}, fmt.Errorf("%s: %w", err.Error(), identity.ErrCertificateUnmapped)
	}
	return c.td.Principal(chain[0])
}

// on says whether the listeners serve TLS.
func (lt *listenerTLS) on() bool { return lt != nil && lt.reloader != nil }

// scheme is the API's URL scheme.
func (lt *listenerTLS) scheme() string {
	if lt.on() {
		return "https"
	}
	return "http"
}

// server is a fresh server configuration (nil when plain): each listener
// gets its own, since net/http and gRPC adjust theirs.
func (lt *listenerTLS) server() *tls.Config {
	if !lt.on() {
		return nil
	}
	return lt.reloader.ServerConfig()
}

// wrap makes ln a TLS listener when TLS is on. It wraps the accepted
// connections last, so that whatever reads the connection's first bytes
// before TLS (a PROXY protocol header) wraps ln before this does.
func (lt *listenerTLS) wrap(ln net.Listener) net.Listener {
	if !lt.on() {
		return ln
	}
	return tls.NewListener(ln, lt.apiServer())
}

// register adds the reloader's metrics to reg.
func (lt *listenerTLS) register(reg prometheus.Registerer) error {
	if !lt.on() {
		return nil
	}
	if lt.clientCAs != nil {
		if err := lt.clientCAs.Register(reg); err != nil {
			return err
		}
	}
	return lt.reloader.Register(reg)
}

// clientTLS is the client configuration for peers (nil: Go's defaults).
func (lt *listenerTLS) clientTLS() *tls.Config {
	if lt == nil || lt.client == nil {
		return nil
	}
	return lt.client.Clone()
}

// withTLS hands the listeners' TLS to the app: the reloader's metrics,
// the CA bundle for the relay and the forwarding, the bundle beside the
// system roots for the UI's calls to its issuer, HSTS on the UI, and, with a client CA bundle and trust domains
// (td), client certificates as workload identities.
func withTLS(acfg *app.Config, ltls *listenerTLS, td *identity.TrustDomains) error {
	if err := ltls.register(acfg.Metrics); err != nil {
		return err
	}
	acfg.Relay.TLS, acfg.Forward.TLS = ltls.clientTLS(), ltls.clientTLS()
	if ltls.clientCAs != nil && td != nil {
		acfg.Server.ClientCertificates = certAuth{cas: ltls.clientCAs, td: td}
	}
	if acfg.UI != nil {
		acfg.UI.HSTS = ltls.on()
		if ltls != nil && ltls.issuer != nil {
			t := http.DefaultTransport.(*http.Transport).Clone()
			t.TLSClientConfig = ltls.issuer.Clone()
			acfg.UI.HTTPClient = &http.Client{Timeout: 10 * time.Second, Transport: t}
		}
	}
	return nil
}

// caPool reads a PEM CA bundle for the resolver commands' --ca; nil (the
// system roots) when file is empty.
func caPool(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", file)
	}
	return pool, nil
}

// clientCertificate loads a client certificate pair for the resolver
// commands' --cert and --key (nil, nil when neither is given), reloaded
// when the files change: a SPIFFE SVID lives an hour, tgsync runs for
// months.
func clientCertificate(certFile, keyFile string) (func(*tls.CertificateRequestInfo) (*tls.Certificate, error), error) {
	if certFile == "" && keyFile == "" {
		return nil, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("--cert and --key go together: give both to present a client certificate, or neither")
	}
	r, err := tlsreload.New(tlsreload.Config{CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	return r.GetClientCertificate, nil
}
