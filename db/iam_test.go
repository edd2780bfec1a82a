package db_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/testclock"
)

// iamRole is the role the IAM tests log in as: the only one whose
// password the test cluster checks.
const iamRole = "muster_iam"

// passwordCluster starts a private cluster that checks iamRole's password
// (scram-sha-256 over the Unix socket; every other role is still
// trusted) and returns an admin pool and the URL that logs in as iamRole
// without a password.
func passwordCluster(t *testing.T) (pc *dbtest.Cluster, admin *pgxpool.Pool, roleURL string) {
	t.Helper()
	ctx := context.Background()
	pc = dbtest.NewCluster(t)
	admin, err := db.OpenPool(ctx, db.PoolConfig{URL: pc.URL(), MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if _, err := admin.Exec(ctx, "CREATE ROLE "+iamRole+" LOGIN SUPERUSER PASSWORD NULL"); err != nil {
		t.Fatal(err)
	}
	// pg_hba.conf takes the first line that matches: this one, above the
	// cluster's "trust" lines, makes the server check iamRole's password.
	hba := filepath.Join(pc.DataDir(), "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("local all %s scram-sha-256\n", iamRole)
	if err := os.WriteFile(hba, append([]byte(line), old...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(pc.URL())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("user", iamRole)
	u.RawQuery = q.Encode()
	return pc, admin, u.String()
}

// standInSigner stands in for AWS's token signer and Aurora's check of
// it, which cannot run here: every token it signs becomes the role's only
// valid password on the real server (so a connection presenting any older
// token is refused, a stricter rule than Aurora's, which accepts a token
// for its whole lifetime), and expire makes the server refuse the current
// one too, as Aurora does once a token is 15 minutes old.
type standInSigner struct {
	admin *pgxpool.Pool
	clock *testclock.Clock

	mu     sync.Mutex
	calls  int
	signed []time.Time
}

func (s *standInSigner) SignToken(ctx context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	tok := fmt.Sprintf("stand-in-token-%d-%d", s.calls, s.clock.Now().Unix())
	// The token is made of letters, digits and dashes: safe inside quotes.
	if _, err := s.admin.Exec(ctx, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", iamRole, tok)); err != nil {
		return "", err
	}
	s.signed = append(s.signed, s.clock.Now())
	return tok, nil
}

func (s *standInSigner) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// expire makes the server refuse the last token signed.
func (s *standInSigner) expire(t *testing.T) {
	t.Helper()
	if _, err := s.admin.Exec(context.Background(), "ALTER ROLE "+iamRole+" PASSWORD NULL"); err != nil {
		t.Fatal(err)
	}
}

// TestIAMTokensRefreshBeforeExpiry: a pool authenticating with IAM tokens
// against a server that checks the password signs one token for all its
// connections, signs a new one once the cached token is 10 minutes old
// (the next connection presents it, or the server would refuse it), and
// never presents a token past its 15-minute lifetime.
func TestIAMTokensRefreshBeforeExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, admin, roleURL := passwordCluster(t)
	clock := testclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	signer := &standInSigner{admin: admin, clock: clock}

	// The server checks the password: none, or a wrong one, is refused.
	if p, err := db.OpenPool(ctx, db.PoolConfig{URL: roleURL}); err == nil {
		p.Close()
		t.Fatal("a connection without a password was accepted")
	}

	tokens, err := db.NewIAMTokens(signer, clock.Now, 0)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := db.OpenPool(ctx, db.PoolConfig{URL: roleURL, IAM: tokens, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := db.MigrateIAM(roleURL, tokens); err != nil {
		t.Fatalf("migrate with IAM tokens: %v", err)
	}

	// connectAll drops the pool's connections and opens 4 new ones at
	// once, each presenting the cached token (or a fresh one).
	connectAll := func(when string) {
		t.Helper()
		pool.Reset()
		var conns []*pgxpool.Conn
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				c, err := pool.Acquire(ctx)
				if err != nil {
					errs <- err
					return
				}
				if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
					errs <- err
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("%s: connect: %v", when, err)
		}
		for _, c := range conns {
			c.Release()
		}
	}

	connectAll("at first")
	if n := signer.Calls(); n != 1 {
		t.Fatalf("at first: %d tokens signed for the pool's first connections and the migration, want 1", n)
	}
	clock.Advance(9*time.Minute + 59*time.Second)
	connectAll("a token 9m59s old")
	if n := signer.Calls(); n != 1 {
		t.Fatalf("a token 9m59s old was signed again: %d tokens", n)
	}
	clock.Advance(2 * time.Second)
	connectAll("a token 10m01s old")
	if n := signer.Calls(); n != 2 {
		t.Fatalf("a token 10m01s old: %d tokens signed, want a new one (2)", n)
	}

	// Nothing connects for 16 minutes: the cached token is past its life,
	// and the server refuses it. The next connections sign a new one.
	clock.Advance(16 * time.Minute)
	signer.expire(t)
	connectAll("after 16 idle minutes")
	if n := signer.Calls(); n != 3 {
		t.Fatalf("after 16 idle minutes: %d tokens signed, want 3", n)
	}
	for i, at := range signer.signed[1:] {
		if gap := at.Sub(signer.signed[i]); gap < db.DefaultIAMRefresh {
			t.Errorf("token %d signed %s after the one before, below the refresh age", i+2, gap)
		}
	}
}

// TestIAMSigningFailureIsUnavailable: a signer that cannot sign (no AWS
// credentials) makes connections fail as unavailable, so writes answer
// 503 instead of 500; the error does not carry a token.
func TestIAMSigningFailureIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, _, roleURL := passwordCluster(t)
	tokens, err := db.NewIAMTokens(failingSigner{}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := db.OpenPool(ctx, db.PoolConfig{URL: roleURL, IAM: tokens, Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, "SELECT 1")
	if err == nil || !db.IsUnavailable(err) {
		t.Fatalf("query without a token: %v, want an unavailable error", err)
	}
}

// failingSigner stands in for a signer without AWS credentials.
type failingSigner struct{}

func (failingSigner) SignToken(context.Context) (string, error) {
	return "", fmt.Errorf("stand-in signer: no credentials")
}

func TestRegionFromHost(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]string{
		"muster.cluster-c1x2y3.eu-west-1.rds.amazonaws.com":     "eu-west-1",
		"muster.cluster-c1x2y3.cn-north-1.rds.amazonaws.com.cn": "cn-north-1",
		"db.internal.example.com":                               "",
		"/tmp/sock":                                             "",
	} {
		if got := db.RegionFromHost(host); got != want {
			t.Errorf("RegionFromHost(%q) = %q, want %q", host, got, want)
		}
	}
}
