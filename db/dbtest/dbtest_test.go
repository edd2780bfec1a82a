package dbtest_test

import (
	"context"
	"testing"

	"github.com/musterhq/muster/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestDatabasesAreIsolated(t *testing.T) {
	ctx := context.Background()
	a, b := dbtest.New(t), dbtest.New(t)
	if _, err := a.Exec(ctx, `INSERT INTO services (name, owner, capabilities, created_at, updated_at)
		VALUES ('web', 'team-a', '{probe}', now(), now())`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM services").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("second database sees %d services written to the first", n)
	}
	if err := a.QueryRow(ctx, "SELECT count(*) FROM services").Scan(&n); err != nil || n != 1 {
		t.Fatalf("first database: n=%d err=%v", n, err)
	}
}
