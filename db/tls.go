package db

import (
	"crypto/tls"
	"crypto/x509"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SetRootCAs makes every TLS configuration of cc that verifies the
// server's certificate against the system roots only because the
// connection string named no sslrootcert (sslmode verify-full or
// verify-ca) verify it against roots instead. A configuration with an
// sslrootcert (a file, or "system") keeps its own roots, and one that
// verifies nothing (sslmode require, prefer, allow) is left unverified.
// roots nil changes nothing.
//
// pgx's verify-ca checks the chain in a callback that reads the
// configuration's RootCAs when the connection is made, so setting the
// field here covers both modes.
func SetRootCAs(cc *pgconn.Config, roots *x509.CertPool) {
	if roots == nil {
		return
	}
	for _, tc := range tlsConfigs(cc) {
		if systemRootsOnly(tc) {
			tc.RootCAs = roots
		}
	}
}

// SystemRootHosts returns the hosts of databaseURL whose server
// certificate pgx would verify against the system roots because the
// connection string (or PGSSLROOTCERT) names no sslrootcert, under
// sslmode verify-full or verify-ca (from the string or PGSSLMODE); none
// for a connection string that names one or asks for no verification.
func SystemRootHosts(databaseURL string) ([]string, error) {
	cc, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, errors.New("parse database url") // pgx's error may quote the URL
	}
	var hosts []string
	if systemRootsOnly(cc.TLSConfig) {
		hosts = append(hosts, cc.Host)
	}
	for _, fb := range cc.Fallbacks {
		if systemRootsOnly(fb.TLSConfig) {
			hosts = append(hosts, fb.Host)
		}
	}
	return hosts, nil
}

// systemRootsOnly reports whether tc verifies the server (Go's own
// verification, or pgx's verify-ca callback) with no roots of its own.
func systemRootsOnly(tc *tls.Config) bool {
	return tc != nil && tc.RootCAs == nil && (!tc.InsecureSkipVerify || tc.VerifyPeerCertificate != nil)
}

func tlsConfigs(cc *pgconn.Config) []*tls.Config {
	out := []*tls.Config{cc.TLSConfig}
	for _, fb := range cc.Fallbacks {
		out = append(out, fb.TLSConfig)
	}
	return out
}
