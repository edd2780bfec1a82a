package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/cli"
)

// TestMigrateForceAndStatus drives `muster migrate` on real PostgreSQL
// as an operator meets a dirty schema: status and up say it is dirty and
// name `muster migrate force VERSION`; force refuses a version that is no
// migration and changes nothing; force to a known one clears it, with a
// log line saying from what, to what, on which database and by whom (and
// no password); up then has nothing to do. A schema dirty at a migration
// this release knows and runs in one transaction (a replica killed while
// migrating) is repaired by up itself. (Not parallel: the commands read
// DATABASE_URL.)
func TestMigrateForceAndStatus(t *testing.T) {
	ctx := context.Background()
	u := dbtest.URL(t)
	t.Setenv("DATABASE_URL", u)
	t.Setenv("MUSTER_DB_IAM", "")
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	last, err := db.LatestMigration()
	if err != nil {
		t.Fatal(err)
	}
	version := func() (v uint, dirty bool) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT version, dirty FROM schema_migrations`).Scan(&v, &dirty); err != nil {
			t.Fatal(err)
		}
		return v, dirty
	}

	out, _, err := runCmd(t, "migrate", "status")
	if err != nil || out != fmt.Sprintf("schema version %d\nthis release's last migration is %d: up to date\n", last, last) {
		t.Fatalf("status on a migrated database: %q %v", out, err)
	}

	// A newer release's migration failed half-way: not ours to repair.
	if _, err := conn.Exec(ctx, `UPDATE schema_migrations SET version = $1, dirty = true`, last+1); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCmd(t, "migrate", "status")
	if err != nil || !strings.Contains(out, fmt.Sprintf("schema version %d (dirty", last+1)) || !strings.Contains(out, "muster migrate force VERSION") ||
		!strings.Contains(out, "a newer release migrated") {
		t.Fatalf("status on a dirty schema: %q %v", out, err)
	}
	_, _, err = runCmd(t, "migrate", "up")
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("dirty at version %d", last+1)) || !strings.Contains(err.Error(), "muster migrate force VERSION") {
		t.Fatalf("up on a dirty schema: %v, want the refusal naming the force command", err)
	}

	for _, tc := range []struct {
		args []string
		want error
	}{
		{[]string{"force", fmt.Sprint(last + 1)}, db.ErrUnknownVersion},
		{[]string{"force", "999999"}, db.ErrUnknownVersion},
		{[]string{"force", "-3"}, cli.ErrUsage},
		{[]string{"force", "latest"}, cli.ErrUsage},
		{[]string{"force"}, cli.ErrUsage},
		{[]string{"force", fmt.Sprint(last), "extra"}, cli.ErrUsage},
	} {
		_, errOut, err := runCmd(t, append([]string{"migrate"}, tc.args...)...)
		if !errors.Is(err, tc.want) {
			t.Errorf("migrate %v: %v (%s), want %v", tc.args, err, errOut, tc.want)
		}
		if v, dirty := version(); v != last+1 || !dirty {
			t.Fatalf("migrate %v changed the version to %d dirty %v", tc.args, v, dirty)
		}
	}

	out, errOut, err := runCmd(t, "migrate", "force", fmt.Sprint(last))
	if err != nil || out != fmt.Sprintf("schema version %d\n", last) {
		t.Fatalf("force %d: %q %q %v", last, out, errOut, err)
	}
	for _, want := range []string{"muster migrate force", fmt.Sprintf("from=%d", last+1), "from_dirty=true", fmt.Sprintf("to=%d", last), "database=postgres://", "by="} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the force's log line lacks %q:\n%s", want, errOut)
		}
	}
	if v, dirty := version(); v != last || dirty {
		t.Fatalf("after force: version %d dirty %v", v, dirty)
	}
	if out, _, err := runCmd(t, "migrate", "up"); err != nil || out != fmt.Sprintf("schema version %d\n", last) {
		t.Fatalf("up after force: %q %v", out, err)
	}

	// A replica killed during the last migration: its transaction is
	// gone, the version says dirty. Up runs it again, and says so.
	if _, _, err := runCmd(t, "migrate", "down"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE schema_migrations SET version = $1, dirty = true`, last); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = runCmd(t, "migrate", "up")
	if err != nil || out != fmt.Sprintf("schema version %d\n", last) || !strings.Contains(errOut, fmt.Sprintf("run again\" migration=%d", last)) {
		t.Fatalf("up on a schema a killed migration left dirty: %q %q %v", out, errOut, err)
	}
	if v, dirty := version(); v != last || dirty {
		t.Fatalf("after the repair: version %d dirty %v", v, dirty)
	}
}
