package apptest

import (
	"testing"

	"github.com/musterhq/muster/internal/ownership"
)

// Member writes a live, sealed row of table replicas for replica id at
// address in the stack's region, as that replica's heartbeat would (one
// round of an ownership manager that is never ready, so it is dealt
// nothing): the stack's replica believes it, follows it and forwards
// evidence to it from its next ownership round. The row lives for a
// lease TTL (7 s); call again to keep it live.
func (s *Stack) Member(t testing.TB, id, address string) {
	t.Helper()
	m, err := ownership.New(ownership.Config{Pool: s.Pool, ID: id, Address: address, Region: "local",
		Sealer: SealKey(), Ready: func() bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// MemberOwning writes replica id's live, sealed row as Member does, for
// a replica that is ready, and runs its ownership rounds and the stack's
// until it holds every shard: with the stack's own ownership worker held
// and never ready, the stack hands id what it holds, so every service's
// evidence routes to id.
func (s *Stack) MemberOwning(t testing.TB, id, address string) {
	t.Helper()
	m, err := ownership.New(ownership.Config{Pool: s.Pool, ID: id, Address: address, Region: "local",
		Sealer: SealKey(), Ready: func() bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if err := m.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := s.App.Ownership.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
		if len(m.Owned()) == 64 {
			return
		}
	}
	t.Fatalf("replica %s holds %d shards after 20 rounds, want 64", id, len(m.Owned()))
}
