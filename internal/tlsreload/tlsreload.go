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

// DefaultCheckEvery is how often, at most, the files are looked at.
const DefaultCheckEvery = time.Second

// Config names the files of the pair.
type Config struct {
	// CertFile and KeyFile are the PEM certificate (chain, leaf first)
	// and its private key. Both are required.
	CertFile, KeyFile string
	// CheckEvery bounds how often the files are looked at (default
	// DefaultCheckEvery).
	CheckEvery time.Duration
	// Logger reports reloads and failed ones (default: discarded).
	Logger *slog.Logger
	// Now is the clock (default time.Now); tests pass their own.
	Now func() time.Time
}

// stamp is what tells that a file changed.
type stamp struct {
	mod  time.Time
	size int64
}

// Reloader hands out the current pair. Its methods are safe for
// concurrent use.
type Reloader struct {
	cfg      Config
	failures prometheus.Counter

	mu        sync.Mutex
	cert      *tls.Certificate
	notAfter  time.Time
	seen      [2]stamp  // the files' stamps last looked at (loaded or failed)
	checkedAt time.Time // when the files were last looked at
}

// New reads the pair, failing when it does not load: a process should not
// start without a certificate.
func New(cfg Config) (*Reloader, error) {
	if cfg.CertFile == "" || cfg.KeyFile == "" {
		return nil, errors.New("tlsreload: a certificate file and a key file are required")
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
	r := &Reloader{cfg: cfg, failures: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "muster_tls_reload_failures_total",
		Help: "Times a changed TLS certificate or key file did not load; the last good pair stays in service.",
	})}
	st, err := r.stat()
	if err != nil {
		return nil, err
	}
	cert, notAfter, err := load(cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return nil, err
	}
	r.cert, r.notAfter, r.seen, r.checkedAt = cert, notAfter, st, cfg.Now()
	return r, nil
}

// Register registers the reloader's metrics with reg.
func (r *Reloader) Register(reg prometheus.Registerer) error {
	expiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "muster_tls_certificate_expiry_seconds",
		Help: "The serving TLS certificate's notAfter, in Unix seconds.",
	}, func() float64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.checkLocked()
		return float64(r.notAfter.Unix())
	})
	return errors.Join(reg.Register(r.failures), reg.Register(expiry))
}

// GetCertificate is for tls.Config.GetCertificate: the current pair,
// reloaded first when the files changed.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checkLocked()
	return r.cert, nil
}

// GetClientCertificate is for tls.Config.GetClientCertificate: the
// current pair, reloaded first when the files changed, presented as a
// client certificate (mutual TLS) whatever the server asks for.
func (r *Reloader) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return r.GetCertificate(nil)
}

// NotAfter is the current certificate's expiry.
func (r *Reloader) NotAfter() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.notAfter
}

// ServerConfig is a server tls.Config serving the reloaded pair: TLS 1.2
// at least, Go's default cipher suites.
func (r *Reloader) ServerConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
}

// checkLocked reloads the pair when the files changed since last looked
// at, at most once per CheckEvery. r.mu is held.
func (r *Reloader) checkLocked() {
	now := r.cfg.Now()
	if now.Sub(r.checkedAt) < r.cfg.CheckEvery {
		return
	}
	r.checkedAt = now
	st, err := r.stat()
	if err != nil {
		if st != r.seen {
			r.seen = st
			r.failed(err)
		}
		return
	}
	if st == r.seen {
		return
	}
	r.seen = st
	cert, notAfter, err := load(r.cfg.CertFile, r.cfg.KeyFile)
	if err != nil {
		r.failed(err)
		return
	}
	r.cert, r.notAfter = cert, notAfter
	r.cfg.Logger.Info("TLS certificate reloaded", "cert", r.cfg.CertFile, "subject", cert.Leaf.Subject.String(), "not_after", notAfter)
}

func (r *Reloader) failed(err error) {
	r.failures.Inc()
	r.cfg.Logger.Error("TLS certificate files changed but do not load; the last good certificate stays in service",
		"cert", r.cfg.CertFile, "key", r.cfg.KeyFile, "err", err, "serving_not_after", r.notAfter)
}

// stat returns both files' stamps; a file that cannot be looked at has a
// zero stamp and makes the error.
func (r *Reloader) stat() ([2]stamp, error) {
	var st [2]stamp
	var errs []error
	for i, f := range []string{r.cfg.CertFile, r.cfg.KeyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		st[i] = stamp{mod: fi.ModTime(), size: fi.Size()}
	}
	return st, errors.Join(errs...)
}

// load reads and checks the pair. Errors name the files, never their
// contents: a key must not reach a log.
func load(certFile, keyFile string) (*tls.Certificate, time.Time, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("load TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, time.Time{}, fmt.Errorf("parse TLS certificate %s: %w", certFile, err)
		}
	}
	return &cert, cert.Leaf.NotAfter, nil
}
