package main

import (
	"context"
	"strings"
	"testing"
)

func TestLoadEnvDatabaseIAM(t *testing.T) {
	for _, tc := range []struct {
		iam, url string
		ok       bool
	}{
		{"1", "postgres://muster@w.cluster-x.eu-west-1.rds.amazonaws.com:5432/muster?sslmode=verify-full&sslrootcert=/ca.pem", true},
		{"1", "postgres://muster@writer:5432/muster?sslmode=require", true},
		{"1", "postgres://muster@writer:5432/muster", false},                   // no TLS asked for
		{"1", "postgres://muster@writer:5432/muster?sslmode=prefer", false},    // may fall back to plain text
		{"1", "postgres://writer:5432/muster?sslmode=require", false},          // no user
		{"1", "host=writer user=muster sslmode=require", false},                // not a URL
		{"yes", "postgres://muster@writer:5432/muster?sslmode=require", false}, // not 1 or 0
		{"0", "postgres://muster@writer:5432/muster", true},
	} {
		t.Setenv("MUSTER_DB_IAM", tc.iam)
		t.Setenv("DATABASE_URL", tc.url)
		c := Config{Addr: ":0", Region: "local"}
		err := loadEnv(&c)
		if err == nil {
			err = c.validateIAM()
		}
		if (err == nil) != tc.ok {
			t.Errorf("MUSTER_DB_IAM=%s DATABASE_URL=%s: %v, want ok %t", tc.iam, tc.url, err, tc.ok)
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
