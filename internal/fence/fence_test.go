package fence_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/ownership"
)

// manager answers as an ownership manager would: it owns "mine" under
// epoch 9, another replica owns "theirs", and the database holds
// whatever tenures are in held (shard -> epoch).
type manager struct {
	held map[int]uint64
}

func (m *manager) Owns(key string) (uint64, bool) { return 9, key == "mine" }
func (m *manager) OwnedElsewhere(key string) bool { return key == "theirs" }
func (m *manager) Shards() int                    { return 64 }
func (m *manager) Fence(_ context.Context, _ *db.Queries, shard int, epoch uint64) error {
	if m.held[shard] != epoch {
		return fmt.Errorf("fence shard %d at epoch %d: %w", shard, epoch, ownership.ErrNotOwner)
	}
	return nil
}

// TestTokensNameTheTenureOfTheDecision: a token carries the shard and the
// epoch held when it was claimed; Check passes while the database holds
// that tenure and fails with the fence's error (not another) once it
// moved, even if this replica holds the shard again under a new epoch.
// ClaimUnlessOwned gives an unfenced token where no owner is known and
// nothing where another replica owns; a nil Fence claims all, unfenced.
func TestTokensNameTheTenureOfTheDecision(t *testing.T) {
	ctx := context.Background()
	shard := ownership.ShardOf("mine", 64)
	m := &manager{held: map[int]uint64{shard: 9}}
	f, err := fence.New(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, ok := f.Claim("mine")
	if !ok || !tok.Fenced() || tok.String() != fmt.Sprintf("shard %d epoch 9", shard) {
		t.Fatalf("Claim(mine) = %v, %v", tok, ok)
	}
	if err := f.Check(ctx, nil, tok); err != nil {
		t.Fatalf("check while held: %v", err)
	}
	m.held[shard] = 10 // lost and taken again: a new tenure
	if err := f.Check(ctx, nil, tok); !fence.IsNotOwner(err) {
		t.Fatalf("check of the old tenure: %v, want the fence's refusal", err)
	}
	if _, ok := f.Claim("theirs"); ok {
		t.Fatal("claimed a key this replica does not own")
	}
	if _, ok := f.ClaimUnlessOwned("theirs"); ok {
		t.Fatal("ClaimUnlessOwned writes what another replica owns")
	}
	nobody, ok := f.ClaimUnlessOwned("nobody")
	if !ok || nobody.Fenced() || f.Check(ctx, nil, nobody) != nil {
		t.Fatalf("ClaimUnlessOwned(nobody) = %v, %v; want an unfenced token that passes", nobody, ok)
	}
	var none *fence.Fence
	if tok, ok := none.Claim("anything"); !ok || tok.Fenced() || none.Check(ctx, nil, tok) != nil {
		t.Fatal("a nil Fence must claim every key, unfenced")
	}
	none.Dropped("x", 1) // no panic
}

// reading is a manager that also says whether another replica holds a
// shard now (by the database, in the writer's transaction).
type reading struct {
	manager
	other map[int]bool
}

func (r *reading) HeldByAnother(_ context.Context, _ *db.Queries, shard int) (bool, error) {
	return r.other[shard], nil
}

// TestRecordsOfAnEndedTenureStandUnlessAnotherHolds: a batch of records
// (CheckAll) decided under a tenure that ended passes when no other
// replica holds the shard now (the lease lapsed through a database
// outage, or this replica took it back), and is left out when another
// does; a single action (Check) is refused either way.
func TestRecordsOfAnEndedTenureStandUnlessAnotherHolds(t *testing.T) {
	ctx := context.Background()
	shard := ownership.ShardOf("mine", 64)
	r := &reading{manager: manager{held: map[int]uint64{shard: 9}}, other: map[int]bool{}}
	f, err := fence.New(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := f.Claim("mine")
	r.held[shard] = 10 // lapsed and retaken by this replica
	ended, err := f.CheckAll(ctx, nil, []fence.Token{tok})
	if err != nil || ended[tok] {
		t.Fatalf("records of an ended tenure nobody else holds: ended %v, err %v; want written", ended, err)
	}
	if err := f.Check(ctx, nil, tok); !fence.IsNotOwner(err) {
		t.Fatalf("an action of the ended tenure: %v, want refused", err)
	}
	r.other[shard] = true // another replica took it
	if ended, err := f.CheckAll(ctx, nil, []fence.Token{tok}); err != nil || !ended[tok] {
		t.Fatalf("records of a tenure another replica took over: ended %v, err %v; want left out", ended, err)
	}
}
