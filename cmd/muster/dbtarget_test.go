package main

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/tlsreload/tlstest"
)

// TestLoadEnvDatabaseIAM: with MUSTER_DB_IAM=1 muster starts only when
// DATABASE_URL verifies the server's certificate and host name
// (sslmode=verify-full) against a CA bundle that is there and holds only
// certificates; sslmode=require, which verifies nothing, is refused with a
// message naming the fix.
func TestLoadEnvDatabaseIAM(t *testing.T) {
	t.Setenv("PGSSLMODE", "") // the URL alone decides, until the end
	t.Setenv("PGSSLROOTCERT", "")
	dir := t.TempDir()
	bundle := filepath.Join(dir, "global-bundle.pem")
	ca1, ca2 := tlstest.NewCA(t), tlstest.NewCA(t)
	tlstest.WriteFile(t, bundle, append(slices.Clone(ca1.PEM), ca2.PEM...)) // a bundle: several CAs, as RDS ships it
	notPEM := filepath.Join(dir, "bundle.der")
	tlstest.WriteFile(t, notPEM, []byte("not a certificate"))
	withKey := filepath.Join(dir, "with-key.pem")
	_, keyPEM := ca1.Leaf(t, "db", time.Hour)
	tlstest.WriteFile(t, withKey, append(slices.Clone(ca1.PEM), keyPEM...))
	const base = "postgres://muster@w.cluster-x.eu-west-1.rds.amazonaws.com:5432/muster"
	for _, tc := range []struct {
		iam, url string
		want     string // "" ok, else a fragment of the refusal
	}{
		{"1", base + "?sslmode=verify-full&sslrootcert=" + bundle, ""},
		{"1", base + "?sslmode=require", "sslmode=verify-full&sslrootcert="},                  // encrypts, verifies nothing
		{"1", base + "?sslmode=require&sslrootcert=" + bundle, "sslmode=verify-full"},         // verifies the chain, not the host name
		{"1", base + "?sslmode=verify-ca&sslrootcert=" + bundle, "sslmode=verify-full"},       // the same
		{"1", base, "sslmode=verify-full"},                                                    // no TLS asked for
		{"1", base + "?sslmode=prefer", "sslmode=verify-full"},                                // may fall back to plain text
		{"1", base + "?sslmode=verify-full", "RDS CA bundle"},                                 // no bundle named
		{"1", base + "?sslmode=verify-full&sslrootcert=system", "not among the system roots"}, // the RDS CAs are not there
		{"1", base + "?sslmode=verify-full&sslrootcert=" + filepath.Join(dir, "missing.pem"), "no such file"},
		{"1", base + "?sslmode=verify-full&sslrootcert=" + notPEM, "no PEM certificate"},
		{"1", base + "?sslmode=verify-full&sslrootcert=" + withKey, "want only CERTIFICATE blocks"},
		{"1", "postgres://writer:5432/muster?sslmode=verify-full&sslrootcert=" + bundle, "no user"},
		{"1", "host=writer user=muster sslmode=verify-full", "postgres:// URL"},
		{"yes", base + "?sslmode=verify-full&sslrootcert=" + bundle, "want 1 or 0"},
		{"0", "postgres://muster@writer:5432/muster", ""},
	} {
		t.Setenv("MUSTER_DB_IAM", tc.iam)
		t.Setenv("DATABASE_URL", tc.url)
		c := Config{Addr: ":0", Region: "local"}
		err := loadEnv(&c)
		if err == nil {
			err = c.validateIAM()
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("MUSTER_DB_IAM=%s DATABASE_URL=%s: %v, want it accepted", tc.iam, tc.url, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("MUSTER_DB_IAM=%s DATABASE_URL=%s: %v, want a refusal naming %q", tc.iam, tc.url, err, tc.want)
		}
	}

	// The PG* environment counts as pgx counts it: under the URL's own.
	t.Setenv("MUSTER_DB_IAM", "1")
	t.Setenv("PGSSLMODE", "verify-full")
	t.Setenv("PGSSLROOTCERT", bundle)
	for url, ok := range map[string]bool{base: true, base + "?sslmode=require": false} {
		t.Setenv("DATABASE_URL", url)
		c := Config{Addr: ":0", Region: "local"}
		err := loadEnv(&c)
		if err == nil {
			err = c.validateIAM()
		}
		if (err == nil) != ok {
			t.Errorf("PGSSLMODE=verify-full, DATABASE_URL=%s: %v, want ok %t", url, err, ok)
		}
	}
}

// TestDBTargetSignsIAMTokens: serve's target adds target_session_attrs and
// signs tokens with aws-sdk-go-v2's rds/auth for the URL's user, host and
// the region in the RDS host name. Signing is local; the credentials are
// made-up values, and no AWS endpoint is called.
func TestDBTargetSignsIAMTokens(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDSTANDINEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "stand-in-secret-not-a-real-key")
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_REGION", "")
	const host = "muster.cluster-c1x2.eu-west-1.rds.amazonaws.com"
	cfg := Config{DBIAM: true}
	target, err := newDBTarget(context.Background(), cfg, "postgres://muster_app@"+host+":5432/muster?sslmode=verify-full")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(target.url, "target_session_attrs=read-write") {
		t.Errorf("url %s lacks target_session_attrs=read-write", target.url)
	}
	if target.iam == nil {
		t.Fatal("no IAM tokens")
	}
	tok, err := target.iam.Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{host + ":5432?", "Action=connect", "DBUser=muster_app", "X-Amz-Expires=900", "%2Feu-west-1%2Frds-db%2Faws4_request"} {
		if !strings.Contains(tok, want) {
			t.Errorf("the token lacks %q", want)
		}
	}
	again, err := target.iam.Token(context.Background())
	if err != nil || again != tok {
		t.Error("a second connection within the refresh age got another token")
	}

	// A URL that says target_session_attrs keeps it; dev adds nothing.
	for _, tc := range []struct {
		dev       bool
		url, want string
	}{
		{false, "postgres://u@h/muster?target_session_attrs=any", "postgres://u@h/muster?target_session_attrs=any"},
		{true, "postgres://u@h/muster", "postgres://u@h/muster"},
	} {
		target, err := newDBTarget(context.Background(), Config{Dev: tc.dev}, tc.url)
		if err != nil || target.url != tc.want || target.iam != nil {
			t.Errorf("dev %t %s: %+v, %v; want %s without IAM", tc.dev, tc.url, target, err, tc.want)
		}
	}
}
