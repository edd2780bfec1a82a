package server_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/wait"
)

// TestWriterFailover (issue 28): PostgreSQL turned read-only under muster
// (an Aurora writer demoted: default_transaction_read_only reloaded into
// every session, then every session terminated), with the pools on a
// target_session_attrs=read-write URL as muster serve opens them. A write
// answers 503 database-unavailable with Retry-After, views are served from
// memory, and once the server is writable again writes succeed and every
// pooled connection is read-write.
func TestWriterFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pc := dbtest.NewCluster(t)
	rw, err := db.WithReadWrite(pc.URL())
	if err != nil {
		t.Fatal(err)
	}
	s, instance := outageStackOn(t, rw)
	oscar := s.Token(t, oscarReq)
	u, err := url.Parse(pc.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/postgres" // the test's own statements, outside the terminated database
	admin, err := db.OpenPool(ctx, db.PoolConfig{URL: u.String(), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	exec := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	exec("ALTER SYSTEM SET default_transaction_read_only = on")
	exec("SELECT pg_reload_conf()")
	// Sessions take the reload in their own time: writes succeed until
	// theirs has; the first one refused must be a 503 (it met 25006).
	var (
		r    apptest.Response
		took time.Duration
	)
	wait.For(t, 10*time.Second, "a write refused by the demoted writer", func() bool {
		r, took = timedWrite(t, s, oscar, `{"min_healthy_fraction":0.3}`)
		return r.Status != http.StatusOK
	})
	wantDatabaseUnavailable(t, "a write on the demoted writer", r, took, 2*time.Second)
	servesFromMemory(t, s, instance)
	exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'muster'")
	r, took = timedWrite(t, s, oscar, `{"min_healthy_fraction":0.3}`)
	wantDatabaseUnavailable(t, "a write with every session cut", r, took, 2*time.Second)

	exec("ALTER SYSTEM RESET default_transaction_read_only")
	exec("SELECT pg_reload_conf()")
	recovers(t, s, oscar)
	for _, c := range s.Pool.AcquireAllIdle(ctx) {
		var ro string
		if err := c.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro); err != nil || ro != "off" {
			t.Errorf("a pooled connection after the failover: transaction_read_only %q, %v", ro, err)
		}
		c.Release()
	}
}
