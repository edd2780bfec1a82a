package tenure_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/tenure"
	"github.com/musterhq/muster/internal/testclock"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Record writes a sealed tenure for each shard the replica holds, and only
// those; the book believes them, and a "none" it read is looked up again
// once NoneFor has passed, so a tenure recorded after a first look is
// found.
func TestRecordAndLookUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key := audit.NewKeySigner(priv)
	keys := seal.Keys{}.With(key)
	hold := func(shard int) {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE shard_leases SET owner = 'r1', epoch = epoch + 1, acquired_at = clock_timestamp(),
			renewed_at = clock_timestamp(), expires_at = clock_timestamp() + interval '1 minute' WHERE shard = $1`, shard); err != nil {
			t.Fatal(err)
		}
	}
	hold(3)
	shards, err := tenure.Record(ctx, pool, key, "r1", 7)
	if err != nil || len(shards) != 1 || shards[0] != 3 {
		t.Fatalf("Record: %v, %v; want shard 3", shards, err)
	}
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	book := tenure.NewBook(pool, func() seal.Keys { return keys }, time.Second)
	book.Now = clk.Now
	if owner, err := book.Owner(ctx, 3, 7); err != nil || owner != "r1" {
		t.Fatalf("shard 3 under epoch 7: %q, %v", owner, err)
	}
	if _, err := book.Owner(ctx, 4, 7); !errors.Is(err, tenure.ErrNone) {
		t.Fatalf("shard 4 under epoch 7: %v, want ErrNone", err)
	}
	hold(4)
	if _, err := tenure.Record(ctx, pool, key, "r1", 7); err != nil { // a retry under the same epoch
		t.Fatal(err)
	}
	if _, err := book.Owner(ctx, 4, 7); !errors.Is(err, tenure.ErrNone) {
		t.Fatalf("shard 4 within NoneFor of its first look: %v, want ErrNone remembered", err)
	}
	clk.Advance(tenure.NoneFor + time.Second)
	if owner, err := book.Owner(ctx, 4, 7); err != nil || owner != "r1" {
		t.Fatalf("shard 4 after NoneFor: %q, %v; want r1", owner, err)
	}

	// The database away: not "none", an error the caller tells apart.
	pool.Close()
	if _, err := book.Owner(ctx, 5, 7); err == nil || errors.Is(err, tenure.ErrNone) || errors.Is(err, tenure.ErrUnreadable) {
		t.Fatalf("lookup with the database closed: %v, want a read error", err)
	}
	// For UnreadableFor after that, an unknown tenure is answered at once
	// (the relay must not wait a timeout per record), still not as none;
	// a tenure already found is still found.
	if _, err := book.Owner(ctx, 6, 7); !errors.Is(err, tenure.ErrUnreadable) || errors.Is(err, tenure.ErrNone) {
		t.Fatalf("lookup just after a failed one: %v, want ErrUnreadable without trying", err)
	}
	if owner, err := book.Owner(ctx, 3, 7); err != nil || owner != "r1" {
		t.Fatalf("a known tenure while the database is away: %q, %v", owner, err)
	}
	clk.Advance(tenure.UnreadableFor)
	if _, err := book.Owner(ctx, 6, 7); err == nil || errors.Is(err, tenure.ErrUnreadable) || errors.Is(err, tenure.ErrNone) {
		t.Fatalf("lookup once UnreadableFor has passed: %v, want a fresh read error", err)
	}
}
