package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/tlsreload"
	"github.com/musterhq/muster/internal/xds"
)

// defaultDevXDSAddr is where muster dev serves xDS unless told otherwise.
const defaultDevXDSAddr = "127.0.0.1:18000"

// xdsFlags registers --xds-addr (default 127.0.0.1:18000 under dev, off
// under serve) and the listener's TLS files.
func xdsFlags(fs *flag.FlagSet, cfg *Config, dev bool) {
	def := ""
	if dev {
		def = defaultDevXDSAddr
	}
	if v, ok := os.LookupEnv("MUSTER_XDS_ADDR"); ok {
		def, cfg.xdsExplicit = v, true
	}
	fs.StringVar(&cfg.XDSAddr, "xds-addr", def, "if set, serve xDS (ADS, state of the world and delta) for Envoy and proxyless gRPC on this address (MUSTER_XDS_ADDR); \"\" turns it off")
	fs.StringVar(&cfg.XDSTLSCert, "xds-tls-cert", "", "PEM certificate of the xDS listener (with --xds-tls-key), reloaded when the file changes; --tls-cert's own files share its reloader and --tls-client-ca; without, xDS serves --tls-cert's pair, or plaintext")
	fs.StringVar(&cfg.XDSTLSKey, "xds-tls-key", "", "PEM private key of the xDS listener")
	fs.StringVar(&cfg.XDSTLSClientCA, "xds-tls-client-ca", "", "PEM CA bundle the xDS listener's own pair (--xds-tls-cert) verifies client certificates against, if given; reloaded when the file changes (sharing --tls-cert, xDS takes --tls-client-ca)")
}

// listenXDS opens the xDS listener and returns its configuration for the
// app, or nil, nil when xDS is off. Under muster dev an address left at
// its default that is taken (another muster dev) turns xDS off with a
// warning instead of failing. Its metrics (PROXY protocol refusals, the
// certificate of a pair of its own) go to reg.
//
// xDS serves a reloaded certificate, so that a rotated pair is served on
// the next connection without a restart. With --tls-cert and no xDS
// files of its own, or xDS files that are the same as --tls-cert's (as a
// chart mounting one Secret gives), xDS serves the API's pair from the
// API's reloader (one reloader, one expiry metric) and asks for client
// certificates against --tls-client-ca, as the API does. Behind the load
// balancers of --proxy-protocol-from, it reads their PROXY headers as the
// API listener does, before TLS.
func listenXDS(cfg Config, explicit bool, ltls *listenerTLS, reg prometheus.Registerer, log *slog.Logger) (net.Listener, *xds.Config, error) {
	if cfg.XDSAddr == "" {
		return nil, nil, nil
	}
	xc := &xds.Config{Limits: cfg.XDSLimits}
	own := cfg.XDSTLSCert != "" || cfg.XDSTLSKey != ""
	if own && (cfg.XDSTLSCert == "" || cfg.XDSTLSKey == "") {
		return nil, nil, errors.New("--xds-tls-cert and --xds-tls-key go together")
	}
	if own && ltls.on() && sameFile(cfg.XDSTLSCert, cfg.TLSCert) && sameFile(cfg.XDSTLSKey, cfg.TLSKey) {
		own = false
	}
	var cas *tlsreload.ClientCAs
	switch {
	case own:
		r, err := tlsreload.New(tlsreload.Config{CertFile: cfg.XDSTLSCert, KeyFile: cfg.XDSTLSKey, Logger: log.With("component", "xds-tls")})
		if err != nil {
			return nil, nil, fmt.Errorf("xDS TLS: %w", err)
		}
		xc.TLS = r.ServerConfig()
		if ltls.on() {
			// The metrics' names are the API pair's: a second pair has
			// no series of its own. Sharing --tls-cert's files avoids it.
			log.Warn("xDS serves a certificate pair of its own: muster_tls_certificate_expiry_seconds tracks the API's only", "xds_cert", cfg.XDSTLSCert)
		} else if err := r.Register(reg); err != nil {
			return nil, nil, fmt.Errorf("xDS TLS metrics: %w", err)
		}
	case ltls.on():
		xc.TLS = ltls.server()
		cas = ltls.clientCAs
	}
	if cfg.XDSTLSClientCA != "" && !(ltls.clientCAs != nil && sameFile(cfg.XDSTLSClientCA, cfg.TLSClientCA)) {
		c, err := tlsreload.NewClientCAs(tlsreload.ClientCAConfig{File: cfg.XDSTLSClientCA, Logger: log.With("component", "xds-tls")})
		if err != nil {
			return nil, nil, fmt.Errorf("--xds-tls-client-ca: %w", err)
		}
		if ltls.clientCAs == nil {
			if err := c.Register(reg); err != nil {
				return nil, nil, fmt.Errorf("xDS client CA metrics: %w", err)
			}
		}
		cas = c
	}
	if xc.TLS != nil && cas != nil {
		cas.Apply(xc.TLS)
		if cfg.TrustDomains != nil {
			xc.ClientCertificates = certAuth{cas: cas, td: cfg.TrustDomains}
		}
	}
	ln, err := net.Listen("tcp", cfg.XDSAddr)
	if err != nil {
		if cfg.Dev && !explicit {
			log.Warn("xDS is off: its default address is taken (set --xds-addr)", "addr", cfg.XDSAddr, "err", err)
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("listen on xDS address %s: %w", cfg.XDSAddr, err)
	}
	// gRPC does the TLS handshake on the accepted connection, after the
	// PROXY header this wrapper reads, and takes the stream's peer address
	// from it: the header's source.
	pln, metrics, err := proxyProtocolOn("xds", cfg, ln, log)
	if err != nil {
		return nil, nil, errors.Join(err, ln.Close())
	}
	if metrics != nil {
		if err := reg.Register(metrics); err != nil {
			return nil, nil, errors.Join(fmt.Errorf("xDS proxy protocol metrics: %w", err), ln.Close())
		}
	}
	return pln, xc, nil
}

// sameFile says whether the paths a and b name one file: the same path,
// or two that reach it (a symbolic link, a Secret mounted twice).
func sameFile(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}
