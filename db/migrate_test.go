package db_test

import (
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/migrations"
)

// TestMigrationsDownAndUp walks every migration down and up again on a
// migrated database, so a down migration that no longer matches its up
// (or fails on a dependency) is caught here, not in an incident.
func TestMigrationsDownAndUp(t *testing.T) {
	t.Parallel()
	ups, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil || len(ups) == 0 {
		t.Fatalf("migrations: %v %v", ups, err)
	}
	// Versions need not be consecutive (branches take numbers ahead of
	// each other), so the expected version after each step is the
	// previous file's number, not a count.
	versions := make([]int, len(ups))
	for i, name := range ups {
		v, err := strconv.Atoi(name[:strings.IndexByte(name, '_')])
		if err != nil {
			t.Fatalf("migration %s: %v", name, err)
		}
		versions[i] = v
	}
	sort.Ints(versions)
	mg, err := db.NewMigrator(dbtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	for i := len(versions) - 1; i >= 0; i-- {
		want := 0
		if i > 0 {
			want = versions[i-1]
		}
		if err := mg.Down(); err != nil {
			t.Fatalf("down to %d: %v", want, err)
		}
		if v, dirty, err := mg.Version(); err != nil || dirty || int(v) != want {
			t.Fatalf("after down: version %d dirty %v err %v, want %d", v, dirty, err, want)
		}
	}
	if err := mg.Up(); err != nil {
		t.Fatal(err)
	}
	if v, dirty, err := mg.Version(); err != nil || dirty || int(v) != versions[len(versions)-1] {
		t.Fatalf("after up: version %d dirty %v err %v", v, dirty, err)
	}
}
