package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/rdsca"
	"github.com/musterhq/muster/internal/tlsreload/tlstest"
)

// TestLoadEnvDatabaseIAM: with MUSTER_DB_IAM=1 muster starts only when
// DATABASE_URL verifies the server's certificate and host name
// (sslmode=verify-full), against the CA bundle it names (which must be
// there and hold only certificates) or, naming none, the RDS bundle built
// in; sslmode=require, which verifies nothing, is refused with a message
// naming the fix.
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
		{"1", base + "?sslmode=require", "add sslmode=verify-full"},                           // encrypts, verifies nothing
		{"1", base + "?sslmode=require&sslrootcert=" + bundle, "sslmode=verify-full"},         // verifies the chain, not the host name
		{"1", base + "?sslmode=verify-ca&sslrootcert=" + bundle, "sslmode=verify-full"},       // the same
		{"1", base, "sslmode=verify-full"},                                                    // no TLS asked for
		{"1", base + "?sslmode=prefer", "sslmode=verify-full"},                                // may fall back to plain text
		{"1", base + "?sslmode=verify-full", ""},                                              // the built-in RDS bundle
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

// TestDBTargetRDSRoots: where DATABASE_URL asks for verification
// (verify-full, verify-ca) but names no sslrootcert, to RDS endpoints or
// with IAM, the pools muster opens verify the server against the RDS CA
// bundle built into it, and say so in one log line naming the bundle; an
// sslrootcert (in the URL, in PGSSLROOTCERT, or "system") wins, another
// host keeps the system roots, and a mode that verifies nothing is left
// as it is. The pools are lazy: nothing is dialled. (Not parallel: the PG*
// and AWS environment.)
func TestDBTargetRDSRoots(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDSTANDINEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "stand-in-secret-not-a-real-key")
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_REGION", "eu-west-1")
	t.Setenv("PGSSLMODE", "")
	t.Setenv("PGSSLROOTCERT", "")
	ca := tlstest.NewCA(t)
	bundle := filepath.Join(t.TempDir(), "own-bundle.pem")
	tlstest.WriteFile(t, bundle, ca.PEM)
	own := x509.NewCertPool()
	own.AppendCertsFromPEM(ca.PEM)
	system, err := x509.SystemCertPool()
	if err != nil {
		t.Fatal(err)
	}
	rds := rdsca.Pool()
	const (
		writer = "muster.cluster-c1x2.eu-west-1.rds.amazonaws.com"
		china  = "muster.cluster-c1x2.cn-north-1.rds.amazonaws.com.cn"
	)
	type roots int
	const (
		builtIn roots = iota
		ownFile
		systemRoots // pgx's nil RootCAs, or sslrootcert=system
		unverified
	)
	// The chart's form: IAM, a URL without sslmode, PGSSLMODE=verify-full
	// and no PGSSLROOTCERT (database.iam.caBundle left out).
	t.Setenv("PGSSLMODE", "verify-full")
	chartTarget, err := newDBTarget(context.Background(), Config{DBIAM: true}, "postgres://muster_app@"+writer+":5432/muster")
	if err != nil {
		t.Fatal(err)
	}
	if chartTarget.roots == nil || !chartTarget.roots.Equal(rds) {
		t.Error("IAM with PGSSLMODE=verify-full and no sslrootcert: the built-in RDS bundle is not used")
	}
	t.Setenv("PGSSLMODE", "")

	// A region whose CAs the bundle lacks is refused at start, naming it
	// and the fix; with a bundle of one's own it is fine.
	for _, u := range []string{
		"postgres://muster@" + china + "/muster?sslmode=verify-full",
		"postgres://muster_app@muster.cluster-c1x2.ca-west-1.rds.amazonaws.com/muster?sslmode=verify-ca",
	} {
		_, err := newDBTarget(context.Background(), Config{}, u)
		if err == nil || !strings.Contains(err.Error(), "holds no CA of") || !strings.Contains(err.Error(), "sslrootcert") {
			t.Errorf("%s: %v, want a refusal naming the region and sslrootcert", u, err)
		}
		if _, err := newDBTarget(context.Background(), Config{}, u+"&sslrootcert="+bundle); err != nil {
			t.Errorf("%s with its own bundle: %v", u, err)
		}
	}
	for _, tc := range []struct {
		iam      bool
		url, env string // env: PGSSLROOTCERT
		want     roots
	}{
		{true, "postgres://muster_app@" + writer + "/muster?sslmode=verify-full", "", builtIn},
		{true, "postgres://muster_app@db.internal.example/muster?sslmode=verify-full", "", builtIn}, // IAM is RDS's
		{false, "postgres://muster@" + writer + "/muster?sslmode=verify-full", "", builtIn},
		{false, "postgres://muster@" + strings.ToUpper(writer) + ".:5432/muster?sslmode=verify-ca", "", builtIn},
		{false, "postgres://muster@db.internal.example/muster?sslmode=verify-full", "", systemRoots},
		{false, "postgres://muster@" + writer + ",db.internal.example/muster?sslmode=verify-full", "", systemRoots}, // not all RDS
		{false, "postgres://muster@rds.amazonaws.com.evil.example/muster?sslmode=verify-full", "", systemRoots},
		{false, "postgres://muster@" + writer + "/muster?sslmode=require", "", unverified},
		{true, "postgres://muster_app@" + writer + "/muster?sslmode=verify-full&sslrootcert=" + bundle, "", ownFile},
		{false, "postgres://muster@" + writer + "/muster?sslmode=verify-ca&sslrootcert=" + bundle, "", ownFile},
		{true, "postgres://muster_app@" + writer + "/muster?sslmode=verify-full", bundle, ownFile},
		{false, "postgres://muster@" + writer + "/muster?sslmode=verify-full&sslrootcert=system", "", systemRoots},
	} {
		t.Setenv("PGSSLROOTCERT", tc.env)
		target, err := newDBTarget(context.Background(), Config{DBIAM: tc.iam}, tc.url)
		if err != nil {
			t.Fatalf("iam %t %s: %v", tc.iam, tc.url, err)
		}
		var logged bytes.Buffer
		target.logRoots(slog.New(slog.NewTextHandler(&logged, nil)))
		pool, err := target.open(context.Background(), db.PoolConfig{Lazy: true})
		if err != nil {
			t.Fatalf("iam %t %s: %v", tc.iam, tc.url, err)
		}
		tlsCfg := pool.Config().ConnConfig.TLSConfig
		pool.Close()
		var got roots
		switch {
		case tlsCfg == nil:
			t.Fatalf("iam %t %s: no TLS", tc.iam, tc.url)
		case tlsCfg.RootCAs == nil || tlsCfg.RootCAs.Equal(system):
			got = systemRoots
			if tlsCfg.InsecureSkipVerify && tlsCfg.VerifyPeerCertificate == nil {
				got = unverified
			}
		case tlsCfg.RootCAs.Equal(rds):
			got = builtIn
		case tlsCfg.RootCAs.Equal(own):
			got = ownFile
		default:
			t.Fatalf("iam %t %s: roots of unknown origin", tc.iam, tc.url)
		}
		if got != tc.want {
			t.Errorf("iam %t %s (PGSSLROOTCERT %q): roots %d, want %d (0 built-in, 1 own file, 2 system, 3 unverified)", tc.iam, tc.url, tc.env, got, tc.want)
		}
		info := rdsca.Info()
		wantLog := fmt.Sprintf("bundle=%s certificates=%d", info.Package, info.Certs)
		if n := strings.Count(logged.String(), "\n"); (got == builtIn) != (n == 1 && strings.Contains(logged.String(), wantLog)) {
			t.Errorf("iam %t %s: logged %q; want one line naming %q exactly when the built-in bundle is used", tc.iam, tc.url, logged.String(), wantLog)
		}
	}
}
