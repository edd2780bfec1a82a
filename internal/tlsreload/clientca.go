package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ClientCAConfig names the CA bundle client certificates are verified
// against (mutual TLS).
type ClientCAConfig struct {
	// File is a PEM bundle of one or more CA certificates. Required.
	File string
	// CheckEvery bounds how often the file is looked at (default
	// DefaultCheckEvery).
	CheckEvery time.Duration
	// Logger reports reloads and failed ones (default: discarded).
	Logger *slog.Logger
	// Now is the clock (default time.Now); tests pass their own.
	Now func() time.Time
}

// ClientCAs verifies client certificates against a CA bundle read from a
// file and reloaded, as the serving pair is, when the file changes. A
// bundle that no longer loads keeps the last good one in service. Its
// methods are safe for concurrent use.
type ClientCAs struct {
	cfg      ClientCAConfig
	failures prometheus.Counter

	mu        sync.Mutex
	pool      *x509.CertPool
	seen      stamp
	checkedAt time.Time
}

// NewClientCAs reads the bundle, failing when it holds no certificate: a
// process told to verify clients should not start without a CA.
func NewClientCAs(cfg ClientCAConfig) (*ClientCAs, error) {
	if cfg.File == "" {
		return nil, errors.New("tlsreload: a client CA file is required")
	}
	if cfg.CheckEvery <= 0 {
		cfg.CheckEvery = DefaultCheckEvery
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &ClientCAs{cfg: cfg, failures: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "muster_tls_client_ca_reload_failures_total",
		Help: "Times a changed client CA bundle did not load; the last good bundle stays in service.",
	})}
	st, err := statFile(cfg.File)
	if err != nil {
		return nil, fmt.Errorf("client CA bundle: %w", err)
	}
	pool, err := loadPool(cfg.File)
	if err != nil {
		return nil, err
	}
	c.pool, c.seen, c.checkedAt = pool, st, cfg.Now()
	return c, nil
}

// Register registers the bundle's reload-failure counter with reg.
func (c *ClientCAs) Register(reg prometheus.Registerer) error {
	return reg.Register(c.failures)
}

// Pool is the current bundle, reloaded first when the file changed.
func (c *ClientCAs) Pool() *x509.CertPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checkLocked()
	return c.pool
}

// Verify checks a client's chain (leaf first, as a handshake hands it
// over) against the current bundle, for client authentication, and
// returns the verified chains.
func (c *ClientCAs) Verify(certs []*x509.Certificate) ([][]*x509.Certificate, error) {
	if len(certs) == 0 {
		return nil, errors.New("no client certificate")
	}
	inter := x509.NewCertPool()
	for _, ic := range certs[1:] {
		inter.AddCert(ic)
	}
	chains, err := certs[0].Verify(x509.VerifyOptions{Roots: c.Pool(), Intermediates: inter,
		CurrentTime: c.cfg.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	return chains, nil
}

// Apply makes cfg ask clients for a certificate and verify one that is
// given against the current bundle: tls.VerifyClientCertIfGiven, but
// with a bundle that may change between handshakes. A client without a
// certificate still connects (it may present a bearer token); a
// certificate that does not verify fails the handshake.
//
// It sets ClientAuth and VerifyConnection, which tls.Config.Clone keeps,
// so net/http's and gRPC's copies of cfg verify alike; a per-handshake
// config (GetConfigForClient) would have to repeat what they add. It
// leaves ClientCAs unset, so the certificate request names no acceptable
// CAs: a list fixed at start would go stale at a rotation, and Go's (and
// others') clients send no certificate whose issuer is not on the list.
// VerifyConnection runs on resumed sessions too, so a resumption is
// checked against the bundle as it is then.
func (c *ClientCAs) Apply(cfg *tls.Config) {
	cfg.ClientAuth = tls.RequestClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return nil
		}
		_, err := c.Verify(cs.PeerCertificates)
		return err
	}
}

// checkLocked reloads the bundle when the file changed since last looked
// at, at most once per CheckEvery. c.mu is held.
func (c *ClientCAs) checkLocked() {
	now := c.cfg.Now()
	if now.Sub(c.checkedAt) < c.cfg.CheckEvery {
		return
	}
	c.checkedAt = now
	st, err := statFile(c.cfg.File)
	if st == c.seen {
		return
	}
	c.seen = st
	if err == nil {
		var pool *x509.CertPool
		if pool, err = loadPool(c.cfg.File); err == nil {
			c.pool = pool
			c.cfg.Logger.Info("client CA bundle reloaded", "file", c.cfg.File)
			return
		}
	}
	c.failures.Inc()
	c.cfg.Logger.Error("client CA bundle changed but does not load; the last good bundle stays in service", "file", c.cfg.File, "err", err)
}

// statFile is one file's stamp (zero, with the error, when it cannot be
// looked at).
func statFile(name string) (stamp, error) {
	fi, err := os.Stat(name)
	if err != nil {
		return stamp{}, err
	}
	return stamp{mod: fi.ModTime(), size: fi.Size()}, nil
}

// loadPool reads a PEM CA bundle.
func loadPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("client CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("client CA bundle %s holds no PEM certificate", file)
	}
	return pool, nil
}
