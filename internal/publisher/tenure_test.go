package publisher_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/publisher"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/tenure"
	"github.com/musterhq/muster/internal/testclock"
)

// TestPublishesOnlyWithinARecordedTenure: with the region's key, a
// publisher signs every view, and records its epoch as a sealed tenure
// of each shard it holds when it takes the epoch. A service it owns (Owns
// says so) whose shard it did not hold then (a gain the manager has not
// told yet) waits, unpublished; once the gain is told, the adoption
// takes an epoch recorded for that shard and the service is published
// under it, signed, and the tenure book names this replica.
func TestPublishesOnlyWithinARecordedTenure(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key := audit.NewKeySigner(priv)
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	in := &input{}
	in.set("web", endpoints(3, eligibility.Eligible))
	var o owner
	o.set("web", true) // as Owns says the moment a gain is made
	r := newRig(t, pool, clk, in, func(c *publisher.Config) {
		c.Owns, c.Services = o.owns, func() []string { return []string{"web"} }
		c.Signer, c.Replica = key, "r1"
		c.ShardOf = func(s string) (int, bool) { return ownership.ShardOf(s, 64), true }
	})
	if err := r.Prepare(ctx); err != nil { // holds no shard yet
		t.Fatal(err)
	}
	r.ServicesChanged([]string{"web"})
	r.RunOnce()
	clk.Advance(1100 * time.Millisecond)
	r.RunOnce()
	if _, ok := r.View("web"); ok {
		t.Fatal("web was published under an epoch with no tenure of its shard")
	}

	// The lease is taken (as the ownership manager does) and the gain told.
	shard := ownership.ShardOf("web", 64)
	if _, err := pool.Exec(ctx, `UPDATE shard_leases SET owner = 'r1', epoch = epoch + 1, acquired_at = clock_timestamp(),
		renewed_at = clock_timestamp(), expires_at = clock_timestamp() + interval '1 minute' WHERE shard = $1`, shard); err != nil {
		t.Fatal(err)
	}
	r.OwnershipChanged([]int{shard}, nil)
	if err := r.Prepare(ctx); err != nil { // the adoption
		t.Fatal(err)
	}
	v := r.publish(t, "web")
	f, ok := r.hub.View("web")
	if !ok || f.Version != v.Version {
		t.Fatalf("hub holds %+v, want web v%d", f, v.Version)
	}
	var wire assembler.View
	if err := json.Unmarshal(f.JSON, &wire); err != nil {
		t.Fatal(err)
	}
	keys := seal.Keys{}.With(key)
	sig, err := assembler.VerifyView(keys, &wire)
	if err != nil || sig.Replica != "r1" {
		t.Fatalf("published view's signature: %+v, %v", sig, err)
	}
	book := tenure.NewBook(pool, func() seal.Keys { return keys }, time.Second)
	owner, err := book.Owner(ctx, shard, v.Version>>assembler.CounterBits)
	if err != nil || owner != "r1" {
		t.Fatalf("tenure of shard %d under web's epoch: %q, %v; want r1", shard, owner, err)
	}
	if _, err := book.Owner(ctx, (shard+1)%64, v.Version>>assembler.CounterBits); err == nil {
		t.Fatal("a tenure was recorded for a shard r1 does not hold")
	}
	// A book that does not trust the key believes no tenure.
	other := tenure.NewBook(pool, func() seal.Keys { return seal.Keys{"someone": priv.Public().(ed25519.PublicKey)[:0]} }, time.Second)
	if _, err := other.Owner(ctx, shard, v.Version>>assembler.CounterBits); err == nil {
		t.Fatal("a tenure was believed under a key its seal is not by")
	}
}
