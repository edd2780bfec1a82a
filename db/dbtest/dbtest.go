// Package dbtest gives each test a fresh, migrated PostgreSQL database.
//
// The first call in a test binary starts a private cluster through the same
// launcher `muster dev` uses, migrates one template database, and every test
// then gets its own clone (CREATE DATABASE … TEMPLATE), which takes
// milliseconds. Tests never share mutable database state. Set
// MUSTER_TEST_DATABASE_URL to a superuser URL of an existing server to use it
// instead of starting a cluster.
package dbtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
)

var (
	template string
	mu       sync.Mutex
	started  bool
	startErr error
	cluster  *db.Cluster
	tmpDir   string
	adminURL string
	counter  atomic.Int64
)

// Main runs the package's tests and stops the cluster afterwards. Call it
// from TestMain: func TestMain(m *testing.M) { dbtest.Main(m) }. after
// runs once the tests are done, before the process exits.
func Main(m *testing.M, after ...func()) {
	code := m.Run()
	for _, f := range after {
		f()
	}
	mu.Lock()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "dbtest:", err)
		}
		os.RemoveAll(tmpDir)
	}
	mu.Unlock()
	os.Exit(code)
}

// URL returns the connection URL of a fresh, migrated database that lives
// for the rest of the test binary.
func URL(t testing.TB) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if !started {
		started = true
		startErr = start()
	}
	if startErr != nil {
		t.Fatalf("dbtest: %v", startErr)
	}
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), counter.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := openAdmin(ctx)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, template)); err != nil {
		t.Fatalf("dbtest: clone template: %v", err)
	}
	return withDatabase(adminURL, name)
}

// New returns a pool on a fresh, migrated database, closed when t ends.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := db.Open(ctx, u)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func start() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if u := os.Getenv("MUSTER_TEST_DATABASE_URL"); u != "" {
		adminURL = u
	} else {
		dir, err := os.MkdirTemp("", "muster-test-")
		if err != nil {
			return err
		}
		// The cluster may run as the postgres user, who must be able to
		// reach its folder.
		if err := os.Chmod(dir, 0o755); err != nil {
			return err
		}
		tmpDir = dir
		c, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir, Fast: true})
		if err != nil {
			return err
		}
		cluster = c
		adminURL = c.URL("postgres")
	}
	admin, err := openAdmin(ctx)
	if err != nil {
		return err
	}
	defer admin.Close()
	tmpl := fmt.Sprintf("muster_template_%d", os.Getpid())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+tmpl); err != nil {
		return fmt.Errorf("create template: %w", err)
	}
	if err := db.Migrate(withDatabase(adminURL, tmpl)); err != nil {
		return err
	}
	template = tmpl
	return nil
}

func withDatabase(raw, name string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.Path = "/" + name
	return u.String()
}

// openAdmin opens a pool on the server's admin database. CREATE DATABASE
// may wait on a busy machine well past the I/O backstop meant for muster's
// own queries, so it gets a minute.
func openAdmin(ctx context.Context) (*pgxpool.Pool, error) {
	return db.OpenPool(ctx, db.PoolConfig{URL: adminURL, IOTimeout: time.Minute})
}
