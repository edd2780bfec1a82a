package ownership

import (
	"slices"
	"testing"

	"github.com/musterhq/muster/db"
)

// TestRoutesFromOneReading: from one reading of the replicas and the
// leases, a held shard routes to its owner alone, and to the replica it
// is offered to besides while a move is under way (so the new owner
// takes it with current windows); a shard that is free, or held by a
// replica no longer live, routes to every live replica; an offer to a
// replica no longer live adds nothing.
func TestRoutesFromOneReading(t *testing.T) {
	m := &Manager{cfg: Config{ID: "a"}}
	str := func(s string) *string { return &s }
	replicas := []db.Replica{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	rows := []db.ShardLeaseListRow{
		{Shard: 0, Owner: str("b"), Held: true},
		{Shard: 1, Owner: str("b"), Held: true, OfferedTo: str("c")},
		{Shard: 2, Owner: str("gone"), Held: true},
		{Shard: 3, Held: false},
		{Shard: 4, Owner: str("a"), Held: true, OfferedTo: str("gone")},
		{Shard: 5, Owner: str("c"), Held: true, OfferedTo: str("c")},
	}
	m.noteRoutes(replicas, rows)
	for shard, want := range [][]string{{"b"}, {"b", "c"}, {"a", "b", "c"}, {"a", "b", "c"}, {"a"}, {"c"}} {
		if got, ok := m.ShardRoute(shard); !ok || !slices.Equal(got, want) {
			t.Errorf("shard %d routes to %v (%v), want %v", shard, got, ok, want)
		}
	}
	if _, ok := m.ShardRoute(6); ok {
		t.Errorf("shard 6, beyond the reading, has a route")
	}
}
