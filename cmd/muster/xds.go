package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"

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
	fs.StringVar(&cfg.XDSTLSCert, "xds-tls-cert", "", "PEM certificate of the xDS listener (with --xds-tls-key); without, xDS is plaintext")
	fs.StringVar(&cfg.XDSTLSKey, "xds-tls-key", "", "PEM private key of the xDS listener")
	fs.StringVar(&cfg.XDSTLSClientCA, "xds-tls-client-ca", "", "PEM CA bundle the xDS listener's own pair (--xds-tls-cert) verifies client certificates against, if given; reloaded when the file changes (sharing --tls-cert, xDS takes --tls-client-ca)")
}

// listenXDS opens the xDS listener and returns its configuration for the
// app, or nil, nil when xDS is off. Under muster dev an address left at
// its default that is taken (another muster dev) turns xDS off with a
// warning instead of failing.
//
// With --tls-cert (ltls on) and no xDS files of its own, xDS serves the
// same reloaded certificate as the other listeners.
func listenXDS(cfg Config, explicit bool, ltls *listenerTLS, log *slog.Logger) (net.Listener, *xds.Config, error) {
	if cfg.XDSAddr == "" {
		return nil, nil, nil
	}
	xc := &xds.Config{Limits: cfg.XDSLimits}
	if cfg.XDSTLSCert != "" || cfg.XDSTLSKey != "" {
		if cfg.XDSTLSCert == "" || cfg.XDSTLSKey == "" {
			return nil, nil, errors.New("--xds-tls-cert and --xds-tls-key go together")
		}
		cert, err := tls.LoadX509KeyPair(cfg.XDSTLSCert, cfg.XDSTLSKey)
		if err != nil {
			return nil, nil, fmt.Errorf("xDS TLS: %w", err)
		}
		xc.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if cfg.XDSTLSClientCA != "" {
			cas, err := tlsreload.NewClientCAs(tlsreload.ClientCAConfig{File: cfg.XDSTLSClientCA, Logger: log.With("component", "xds-tls")})
			if err != nil {
				return nil, nil, fmt.Errorf("--xds-tls-client-ca: %w", err)
			}
			cas.Apply(xc.TLS)
			if cfg.TrustDomains != nil {
				xc.ClientCertificates = certAuth{cas: cas, td: cfg.TrustDomains}
			}
		}
	} else if ltls.on() {
		xc.TLS = ltls.apiServer()
		if ltls.clientCAs != nil && cfg.TrustDomains != nil {
			xc.ClientCertificates = certAuth{cas: ltls.clientCAs, td: cfg.TrustDomains}
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
	return ln, xc, nil
}
