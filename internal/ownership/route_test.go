package ownership_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/wait"
)

// TestEvidenceRoutes: with three replicas balanced, every replica reads
// the same route for a service: its owner first, then one standby, two
// replicas in all; so a service's evidence is kept by exactly two of the
// three (Evaluates). When the owner is killed, its shards route to every
// live replica until one takes them, and then to two again.
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
	standbys := map[string]int{}
	for i := range 300 {
		svc := fmt.Sprintf("svc-%d", i)
		_, want, ok := a.EvidenceRoute(svc)
		if !ok || len(want) != 2 || want[0] == want[1] {
			t.Fatalf("%s routes to %v (%v), want an owner and one standby", svc, want, ok)
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
		if keep != 2 {
			t.Fatalf("%s is kept by %d replicas, want 2", svc, keep)
		}
		standbys[want[1]]++
	}
	if len(standbys) != 3 {
		t.Errorf("standbys %v: want the three replicas sharing the role", standbys)
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
		if slices.Contains(to, "a") && slices.Contains(to, "b") && !slices.Contains(to, "c") && len(to) == 2 {
			_, ownsA := a.Owns(orphan)
			_, ownsB := b.Owns(orphan)
			if !ownsA && !ownsB {
				sawAll = true // between owners: every live replica
			}
			return ownsA || ownsB
		}
		return false
	})
	_, to, _ := a.EvidenceRoute(orphan)
	if _, owns := a.Owns(orphan); owns != (to[0] == "a") {
		t.Errorf("after the move %s routes to %v; a owns it: %v", orphan, to, owns)
	}
	t.Logf("between owners, %s routed to every live replica: %v", orphan, sawAll)
}
