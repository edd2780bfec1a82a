package db_test

import (
	"context"
	"errors"
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

// TestEpochsStartAboveBlockVersions: migration 000008 replaces the block
// sequence view_versions with ownership epochs (version = epoch<<32 |
// counter). The first epoch's versions are above every version a block
// handed out, and rolling back brings view_versions back above every
// epoch's versions: versions never go back across the change, either way.
func TestEpochsStartAboveBlockVersions(t *testing.T) {
	t.Parallel()
	u := dbtest.URL(t)
	ctx := context.Background()
	pool, err := db.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mg, err := db.NewMigrator(u)
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	to := func(below uint) {
		t.Helper()
		for {
			v, _, err := mg.Version()
			if err != nil {
				t.Fatal(err)
			}
			if v < below {
				return
			}
			if err := mg.Down(); err != nil {
				t.Fatal(err)
			}
		}
	}
	to(8)
	// An old server that used blocks past 2^32 (5 billion versions).
	var block int64
	if err := pool.QueryRow(ctx, "SELECT setval('view_versions', 5000000000)").Scan(&block); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT nextval('view_versions')").Scan(&block); err != nil {
		t.Fatal(err)
	}
	lastOld := uint64(block) + 999 // the end of the block it was handed
	if err := mg.Up(); err != nil {
		t.Fatal(err)
	}
	pool.Reset() // connections may have cached the dropped sequence
	epoch, err := db.New(pool).PublisherEpochNext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first := uint64(epoch) << 32; first <= lastOld {
		t.Fatalf("first epoch %d starts at version %d, not above the old %d", epoch, first, lastOld)
	}
	if epoch != 2 {
		t.Fatalf("epoch %d, want 2 (the first above 5,000,000,999 >> 32)", epoch)
	}

	// Rolled back: blocks start above the epoch's versions.
	to(8)
	pool.Reset()
	if err := pool.QueryRow(ctx, "SELECT nextval('view_versions')").Scan(&block); err != nil {
		t.Fatal(err)
	}
	if uint64(block) < uint64(epoch+1)<<32 {
		t.Fatalf("after a rollback a block starts at %d, inside epoch %d", block, epoch)
	}
	if err := mg.Up(); err != nil {
		t.Fatal(err)
	}
}

// TestAReleaseTakesANewerCleanSchema: during a rolling upgrade the newer
// release migrates first, and a replica of the older one that restarts
// meets a schema above its last migration. Clean, Up leaves it as it is
// and says so (ErrSchemaAhead, with both versions), so the caller can go
// on: migrations are additive, and the older release's queries work on
// it (shown here by one on the widened table). Dirty (a migration that
// failed half-way), it is refused as before, whatever the version.
func TestAReleaseTakesANewerCleanSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := dbtest.URL(t)
	pool, err := db.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mg, err := db.NewMigrator(u)
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	known, _, err := mg.Version()
	if err != nil {
		t.Fatal(err)
	}
	// What the next release's migration would do: add a column with a
	// default, and record its version.
	if _, err := pool.Exec(ctx, `ALTER TABLE services ADD COLUMN next_release_note text NOT NULL DEFAULT ''`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE schema_migrations SET version = $1, dirty = false`, known+1); err != nil {
		t.Fatal(err)
	}
	err = mg.Up()
	var ahead *db.AheadError
	if !errors.Is(err, db.ErrSchemaAhead) || !errors.As(err, &ahead) || ahead.Database != known+1 || ahead.Known != known {
		t.Fatalf("Up on a schema one version ahead: %v, want an AheadError at %d over %d", err, known+1, known)
	}
	if v, dirty, err := mg.Version(); err != nil || dirty || v != known+1 {
		t.Fatalf("after Up: version %d dirty %v err %v, want %d untouched", v, dirty, err, known+1)
	}
	if _, err := db.New(pool).ServiceList(ctx, db.ServiceListParams{Lim: 10}); err != nil {
		t.Fatalf("this release's query on the widened table: %v", err)
	}
	if err := db.Migrate(u); !errors.Is(err, db.ErrSchemaAhead) {
		t.Fatalf("Migrate on a schema ahead: %v, want ErrSchemaAhead", err)
	}

	// A failed migration of the newer release: refused.
	if _, err := pool.Exec(ctx, `UPDATE schema_migrations SET dirty = true`); err != nil {
		t.Fatal(err)
	}
	err = mg.Up()
	if err == nil || errors.Is(err, db.ErrSchemaAhead) || !strings.Contains(err.Error(), "dirty") {
		t.Fatalf("Up on a dirty schema ahead: %v, want a refusal for the dirty schema", err)
	}
}

// TestCheckSaysWhereTheSchemaStands: Check, for a replica that must not
// migrate, tells a schema at this release's last migration (nil) from one
// behind it, one ahead of it and a dirty one, and changes none of them.
func TestCheckSaysWhereTheSchemaStands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := dbtest.URL(t)
	pool, err := db.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mg, err := db.NewMigrator(u)
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	last, err := db.LatestMigration()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		version uint
		dirty   bool
		check   func(error) bool
	}{
		{last, false, func(err error) bool { return err == nil }},
		{last - 1, false, func(err error) bool {
			var b *db.BehindError
			return errors.Is(err, db.ErrSchemaBehind) && errors.As(err, &b) && b.Database == last-1 && b.Known == last &&
				strings.Contains(err.Error(), "muster migrate up")
		}},
		{last + 1, false, func(err error) bool { return errors.Is(err, db.ErrSchemaAhead) && !errors.Is(err, db.ErrSchemaBehind) }},
		{last, true, func(err error) bool {
			var d *db.DirtyError
			return errors.As(err, &d) && d.Version == last && !errors.Is(err, db.ErrSchemaBehind)
		}},
		{last - 1, true, func(err error) bool { var d *db.DirtyError; return errors.As(err, &d) && d.Version == last-1 }},
	} {
		if _, err := pool.Exec(ctx, `UPDATE schema_migrations SET version = $1, dirty = $2`, tc.version, tc.dirty); err != nil {
			t.Fatal(err)
		}
		if err := mg.Check(); !tc.check(err) {
			t.Errorf("Check at version %d dirty %v: %v", tc.version, tc.dirty, err)
		}
		if v, dirty, err := mg.Version(); err != nil || v != tc.version || dirty != tc.dirty {
			t.Errorf("after Check: version %d dirty %v (%v), want %d %v untouched", v, dirty, err, tc.version, tc.dirty)
		}
	}
}
