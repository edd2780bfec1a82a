package db_test

import (
	"testing"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestVersionsIncreaseAcrossRestarts: a second allocator on the same
// database (a restarted server, or a second one) never hands out a version
// at or below one already handed out.
func TestVersionsIncreaseAcrossRestarts(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	var last uint64
	take := func(v *db.VersionBlocks, n int) {
		t.Helper()
		first, err := v.Next(n)
		if err != nil {
			t.Fatal(err)
		}
		if first <= last {
			t.Fatalf("version %d after %d", first, last)
		}
		last = first + uint64(n) - 1
	}
	a := db.NewVersionBlocks(pool)
	for range 1500 {
		take(a, 1) // crosses a block boundary
	}
	take(a, 700)
	b := db.NewVersionBlocks(pool) // "after a restart"
	take(b, 1)
	take(a, 999) // the first allocator's next block is above b's
	if _, err := a.Next(0); err == nil {
		t.Fatal("Next(0) accepted")
	}
	if _, err := a.Next(db.VersionBlockSize + 1); err == nil {
		t.Fatal("a request larger than a block accepted")
	}
}
