package ownership_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/wait"
)

// TestEvidenceRoutes: with three replicas balanced (no move under way),
// every replica reads the same route for a service: its owner alone; so
// a service's evidence is kept by exactly one of the three (Evaluates).
// When the owner is killed, its shards route to every live replica until
// one takes them, and then to the new owner alone.
func TestEvidenceRoutes(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	a, b, c := newReplica(t, pool, "a"), newReplica(t, pool, "b"), newReplica(t, pool, "c")
	rs := []replica{a, b, c}
	wait.For(t, patience, "three replicas balanced", func() bool {
		rounds(t, a, b, c)
		return balanced(t, pool, a, b, c)
	})
	rounds(t, a, b, c) // every reading after the last move
	owners := map[string]int{}
	for i := range 300 {
		svc := fmt.Sprintf("svc-%d", i)
		_, want, ok := a.EvidenceRoute(svc)
		if !ok || len(want) != 1 {
			t.Fatalf("%s routes to %v (%v), want its owner alone", svc, want, ok)
		}
		keep := 0
		for _, r := range rs {
			if _, got, _ := r.EvidenceRoute(svc); !slices.Equal(got, want) {
				t.Fatalf("%s routes to %v at %s, %v at a", svc, got, r.ID(), want)
			}
			if _, owns := r.Owns(svc); owns != (r.ID() == want[0]) {
				t.Fatalf("%s: %s owns it: %v; the route's owner is %s", svc, r.ID(), owns, want[0])
			}
			if r.Evaluates(svc) {
				keep++
			}
		}
		if keep != 1 {
			t.Fatalf("%s is kept by %d replicas, want 1", svc, keep)
		}
		owners[want[0]]++
	}
	if len(owners) != 3 {
		t.Errorf("owners %v: want the three replicas sharing the services", owners)
	}

	// c is killed: no more rounds.
	var orphan string
	for i := 0; orphan == ""; i++ {
		if svc := fmt.Sprintf("svc-%d", i); func() bool { _, ok := c.Owns(svc); return ok }() {
			orphan = svc
		}
	}
	sawAll := false
	wait.For(t, patience, "c's shards taken by a survivor", func() bool {
		rounds(t, a, b)
		_, to, _ := a.EvidenceRoute(orphan)
		_, ownsA := a.Owns(orphan)
		_, ownsB := b.Owns(orphan)
		if slices.Equal(to, []string{"a", "b"}) && !ownsA && !ownsB {
			sawAll = true // between owners: every live replica
		}
		return (ownsA || ownsB) && len(to) == 1
	})
	_, to, _ := a.EvidenceRoute(orphan)
	if _, owns := a.Owns(orphan); owns != (to[0] == "a") {
		t.Errorf("after the move %s routes to %v; a owns it: %v", orphan, to, owns)
	}
	t.Logf("between owners, %s routed to every live replica: %v", orphan, sawAll)
}
