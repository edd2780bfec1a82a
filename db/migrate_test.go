package db_test

import (
	"io/fs"
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
	mg, err := db.NewMigrator(dbtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	for want := len(ups) - 1; want >= 0; want-- {
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
	if v, dirty, err := mg.Version(); err != nil || dirty || int(v) != len(ups) {
		t.Fatalf("after up: version %d dirty %v err %v", v, dirty, err)
	}
}
