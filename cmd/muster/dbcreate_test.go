package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
)

// databaseUserSQL is the SQL block of docs/production.md's "The database
// user", one statement a line.
func databaseUserSQL(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/production.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "### The database user")
	if i < 0 {
		t.Fatal(`docs/production.md has no "### The database user"`)
	}
	rest := doc[i:]
	start := strings.Index(rest, "```sql\n")
	if start < 0 {
		t.Fatal(`no sql block under "The database user"`)
	}
	rest = rest[start+len("```sql\n"):]
	rest = rest[:strings.Index(rest, "```")]
	var stmts []string
	for line := range strings.Lines(rest) {
		if s := strings.TrimSpace(line); s != "" {
			stmts = append(stmts, strings.TrimSuffix(s, ";"))
		}
	}
	return stmts
}

// TestDatabaseCreationAsRDSMaster runs docs/production.md's database
// creation, as written, as the RDS master user is: a role with CREATEROLE
// and CREATEDB and no superuser. The statement the docs used to give alone
// (CREATE DATABASE … OWNER muster_app) fails for it; the documented
// sequence works, leaves the master no member of muster_app, and
// muster_app, owning the database, can run every migration.
func TestDatabaseCreationAsRDSMaster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminURL := dbtest.URL(t)
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	// Names of this test's own: roles are the cluster's, shared with
	// every test running beside it.
	var sfx string
	if err := admin.QueryRow(ctx, "SELECT current_database()").Scan(&sfx); err != nil {
		t.Fatal(err)
	}
	master, app, dbName := "master_"+sfx, "app_"+sfx, "muster_"+sfx
	rename := strings.NewReplacer("muster_app", app, "DATABASE muster ", "DATABASE "+dbName+" ")
	for _, s := range []string{
		"DO $$ BEGIN CREATE ROLE rds_iam; EXCEPTION WHEN duplicate_object THEN NULL; END $$", // RDS's role, standing in
		"CREATE ROLE " + master + " LOGIN CREATEROLE CREATEDB",
	} {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		admin, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer admin.Close(ctx)
		for _, s := range []string{"DROP DATABASE IF EXISTS " + dbName + " WITH (FORCE)", "DROP ROLE IF EXISTS " + app, "DROP ROLE IF EXISTS " + master} {
			if _, err := admin.Exec(ctx, s); err != nil {
				t.Errorf("cleanup: %s: %v", s, err)
			}
		}
	})
	as := func(role, database string) *pgx.Conn {
		t.Helper()
		u, err := url.Parse(adminURL)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.User(role)
		u.Path = "/" + database
		q := u.Query()
		q.Del("user")
		u.RawQuery = q.Encode()
		c, err := pgx.Connect(ctx, u.String())
		if err != nil {
			t.Fatalf("connect as %s: %v", role, err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	m := as(master, sfx)

	// What the docs used to say: refused to the master user.
	if _, err := m.Exec(ctx, "CREATE USER "+app); err != nil {
		t.Fatal(err)
	}
	_, err = m.Exec(ctx, "CREATE DATABASE "+dbName+" OWNER "+app)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("must be member of role %q", app)) {
		t.Fatalf("CREATE DATABASE … OWNER without the membership: %v, want PostgreSQL's refusal", err)
	}
	if _, err := m.Exec(ctx, "DROP USER "+app); err != nil {
		t.Fatal(err)
	}

	stmts := databaseUserSQL(t)
	if len(stmts) < 3 {
		t.Fatalf("the documented SQL: %q", stmts)
	}
	for _, s := range stmts {
		if _, err := m.Exec(ctx, rename.Replace(s)); err != nil {
			t.Fatalf("as the master user: %s: %v", rename.Replace(s), err)
		}
	}
	var owner string
	var member, iam bool
	if err := admin.QueryRow(ctx, `SELECT pg_get_userbyid(datdba), pg_has_role($2, $3, 'MEMBER'), pg_has_role($3, 'rds_iam', 'MEMBER')
		FROM pg_database WHERE datname = $1`, dbName, master, app).Scan(&owner, &member, &iam); err != nil {
		t.Fatal(err)
	}
	if owner != app || member || !iam {
		t.Fatalf("database owner %s (want %s), master still a member %v, app in rds_iam %v", owner, app, member, iam)
	}

	// muster_app migrates its database: every migration, as the replicas
	// run them at start.
	as(app, dbName) // it can log in
	u, _ := url.Parse(adminURL)
	u.User, u.Path = url.User(app), "/"+dbName
	q := u.Query()
	q.Del("user")
	u.RawQuery = q.Encode()
	if err := db.Migrate(u.String()); err != nil {
		t.Fatalf("migrate as %s: %v", app, err)
	}
}
