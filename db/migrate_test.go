package db_test

import (
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/migrations"
)

// TestMigrationsDownAndUp walks every migration down and up again on a
// migrated database, so a down migration that no longer matches its up
// (or fails on a dependency) is caught here, not in an incident. Versions
// are read from the file names, so a gap in the numbering (migrations
// written on parallel branches) is walked correctly.
func TestMigrationsDownAndUp(t *testing.T) {
	t.Parallel()
	ups, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil || len(ups) == 0 {
		t.Fatalf("migrations: %v %v", ups, err)
	}
	versions := []int{0}
	for _, f := range ups {
		n, err := strconv.Atoi(f[:strings.IndexByte(f, '_')])
		if err != nil {
			t.Fatalf("migration %s: %v", f, err)
		}
		versions = append(versions, n)
	}
	slices.Sort(versions)
	mg, err := db.NewMigrator(dbtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	for i := len(versions) - 2; i >= 0; i-- {
		want := versions[i]
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
