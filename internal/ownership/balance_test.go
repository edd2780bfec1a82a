package ownership_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/musterhq/muster/internal/ownership"
)

// layout returns shards leases: the first held[0].n shards owned by
// held[0].owner, the next by held[1].owner, and so on; the rest free.
func layout(shards int, held ...holding) []ownership.Lease {
	out := make([]ownership.Lease, shards)
	s := 0
	for _, h := range held {
		for range h.n {
			out[s].Owner = h.owner
			s++
		}
	}
	for i := range out {
		out[i].Shard = i
	}
	return out
}

type holding struct {
	owner string
	n     int
}

func TestTargets(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		live   []string
		shards int
		want   map[string]int
	}{
		{nil, 64, map[string]int{}},
		{[]string{"a"}, 64, map[string]int{"a": 64}},
		{[]string{"b", "a"}, 64, map[string]int{"a": 32, "b": 32}},
		{[]string{"c", "b", "a"}, 64, map[string]int{"a": 22, "b": 21, "c": 21}},
		{[]string{"a", "a", "b"}, 3, map[string]int{"a": 2, "b": 1}},
		{[]string{"a", "b", "c", "d", "e", "f", "g"}, 64, map[string]int{"a": 10, "b": 9, "c": 9, "d": 9, "e": 9, "f": 9, "g": 9}},
		{[]string{"a", "b", "c"}, 2, map[string]int{"a": 1, "b": 1, "c": 0}},
	} {
		if diff := cmp.Diff(c.want, ownership.Targets(c.live, c.shards)); diff != "" {
			t.Errorf("Targets(%v, %d) (-want +got):\n%s", c.live, c.shards, diff)
		}
	}
}

// TestBalance: what each replica plans from one reading of the region.
// want is, per replica, how many shards it takes and releases; the takes
// of all replicas must be disjoint, free shards only, and the releases
// their own.
func TestBalance(t *testing.T) {
	t.Parallel()
	type tr struct{ take, release int }
	for _, c := range []struct {
		name   string
		live   []string
		leases []ownership.Lease
		want   map[string]tr
	}{
		{"one replica starts", []string{"a"}, layout(64), map[string]tr{"a": {64, 0}}},
		{"one replica not yet in the live list", nil, layout(64), map[string]tr{"a": {64, 0}}},
		{"two replicas start together", []string{"a", "b"}, layout(64), map[string]tr{"a": {32, 0}, "b": {32, 0}}},
		{"three replicas start together", []string{"a", "b", "c"}, layout(64), map[string]tr{"a": {22, 0}, "b": {21, 0}, "c": {21, 0}}},
		{"three balanced", []string{"a", "b", "c"}, layout(64, holding{"a", 22}, holding{"b", 21}, holding{"c", 21}),
			map[string]tr{"a": {}, "b": {}, "c": {}}},
		{"a second replica joins the first", []string{"a", "b"}, layout(64, holding{"a", 64}),
			map[string]tr{"a": {0, 32}, "b": {}}},
		{"the joiner takes what was released", []string{"a", "b"}, layout(64, holding{"a", 32}),
			map[string]tr{"a": {}, "b": {32, 0}}},
		{"a third replica joins two", []string{"a", "b", "c"}, layout(64, holding{"a", 32}, holding{"b", 32}),
			map[string]tr{"a": {0, 10}, "b": {0, 11}, "c": {}}},
		{"a replica left, its leases expired", []string{"a", "b"}, layout(64, holding{"a", 22}, holding{"b", 21}),
			map[string]tr{"a": {10, 0}, "b": {11, 0}}},
		{"a replica left, its leases not yet expired", []string{"a", "b"}, layout(64, holding{"a", 22}, holding{"b", 21}, holding{"c", 21}),
			map[string]tr{"a": {}, "b": {}}},
		{"a replacement joins before the dead one's leases expire", []string{"a", "b", "d"}, layout(64, holding{"a", 22}, holding{"b", 21}, holding{"c", 21}),
			map[string]tr{"a": {}, "b": {}, "d": {}}},
		{"the dead one's leases expire under a replacement", []string{"a", "b", "d"}, layout(64, holding{"a", 22}, holding{"b", 21}),
			map[string]tr{"a": {}, "b": {}, "d": {21, 0}}},
		{"over target releases and takes nothing though shards are free", []string{"a", "b"}, layout(64, holding{"a", 40}),
			map[string]tr{"a": {0, 8}, "b": {24, 0}}},
		{"more replicas than shards", []string{"a", "b", "c"}, layout(2), map[string]tr{"a": {1, 0}, "b": {1, 0}, "c": {}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := map[string]tr{}
			taken := map[int]string{}
			for me := range c.want {
				p := ownership.Balance(me, c.live, c.leases)
				got[me] = tr{len(p.Take), len(p.Release)}
				checkPlan(t, me, c.leases, p)
				for _, s := range p.Take {
					if other, ok := taken[s]; ok {
						t.Errorf("%s and %s both plan to take shard %d", other, me, s)
					}
					taken[s] = me
				}
			}
			if diff := cmp.Diff(c.want, got, cmp.AllowUnexported(tr{})); diff != "" {
				t.Errorf("plans (-want +got):\n%s", diff)
			}
		})
	}
}

// checkPlan: a plan takes only free shards and releases only its own,
// never both in one round, each listed once in order.
func checkPlan(t errorer, me string, leases []ownership.Lease, p ownership.Plan) {
	t.Helper()
	if len(p.Take) > 0 && len(p.Release) > 0 {
		t.Errorf("%s plans to take %v and release %v in one round", me, p.Take, p.Release)
	}
	for _, s := range p.Take {
		if leases[s].Owner != "" {
			t.Errorf("%s plans to take shard %d, held by %q", me, s, leases[s].Owner)
		}
	}
	for _, s := range p.Release {
		if leases[s].Owner != me {
			t.Errorf("%s plans to release shard %d, held by %q", me, s, leases[s].Owner)
		}
	}
	if !slices.IsSorted(p.Take) || !slices.IsSorted(p.Release) || len(slices.Compact(slices.Clone(p.Take))) != len(p.Take) {
		t.Errorf("%s: plan not sorted or repeats a shard: %+v", me, p)
	}
}

// errorer is what checkPlan needs of a *testing.T or a *rapid.T.
type errorer interface {
	Helper()
	Errorf(format string, args ...any)
}

// region is the simulated shard table: shard → owner ("" free).
type region []string

// round lets every live replica, in turn, read the region and carry out
// its plan, as RunOnce does; it returns how many shards changed owner.
func (r region) round(t *testing.T, live []string) (moves int) {
	t.Helper()
	for _, me := range live {
		leases := make([]ownership.Lease, len(r))
		for s, o := range r {
			leases[s] = ownership.Lease{Shard: s, Owner: o}
		}
		p := ownership.Balance(me, live, leases)
		checkPlan(t, me, leases, p)
		for _, s := range p.Release {
			r[s] = ""
		}
		for _, s := range p.Take {
			r[s] = me
			moves++
		}
	}
	return moves
}

func (r region) counts() map[string]int {
	out := map[string]int{}
	for _, o := range r {
		if o != "" {
			out[o]++
		}
	}
	return out
}

// settle runs rounds until the region is at its targets, failing after
// three (the excess is released in one round and taken in the next).
func (r region) settle(t *testing.T, live []string) (moves int) {
	t.Helper()
	for i := 0; i < 3; i++ {
		moves += r.round(t, live)
		if maps.Equal(r.counts(), ownership.Targets(live, len(r))) {
			return moves
		}
	}
	t.Fatalf("live %v not balanced after 3 rounds: %v", live, r.counts())
	return 0
}

// TestBalanceConverges follows a region through replicas starting one
// after another, joining, leaving without a word, and leaving gracefully:
// each time it reaches the targets within three rounds, and moves no
// more shards than the change requires.
func TestBalanceConverges(t *testing.T) {
	t.Parallel()
	r := make(region, 64)
	if moves := r.settle(t, []string{"a"}); moves != 64 {
		t.Errorf("first replica: %d moves, want 64", moves)
	}
	if moves := r.settle(t, []string{"a", "b"}); moves != 32 {
		t.Errorf("second replica joins: %d moves, want 32", moves)
	}
	if moves := r.settle(t, []string{"a", "b", "c"}); moves != 21 {
		t.Errorf("third replica joins: %d moves, want 21 (a keeps 22)", moves)
	}
	// b dies: its leases expire, and the survivors take its shards.
	for s, o := range r {
		if o == "b" {
			r[s] = ""
		}
	}
	if moves := r.settle(t, []string{"a", "c"}); moves != 21 {
		t.Errorf("b died: %d moves, want its 21 shards", moves)
	}
	// d joins, then a leaves gracefully (releases, leaves the live set).
	r.settle(t, []string{"a", "c", "d"})
	for s, o := range r {
		if o == "a" {
			r[s] = ""
		}
	}
	if moves := r.settle(t, []string{"c", "d"}); moves != 22 {
		t.Errorf("a left: %d moves, want its 22 shards", moves)
	}
}

// TestBalanceProperties: for any reading (live replicas, shards held by
// live, dead or no replicas), the plans of all live replicas are valid,
// disjoint, and leave no replica above its target or, when nobody is
// above target and nobody dead holds a shard, no shard free.
func TestBalanceProperties(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(rt, "replicas")
		shards := rapid.IntRange(1, 130).Draw(rt, "shards")
		live := make([]string, n)
		for i := range live {
			live[i] = fmt.Sprintf("r%d", i)
		}
		owners := append(slices.Clone(live), "", "", "dead")
		leases := make([]ownership.Lease, shards)
		for s := range leases {
			leases[s] = ownership.Lease{Shard: s, Owner: rapid.SampledFrom(owners).Draw(rt, "owner")}
		}
		target := ownership.Targets(live, shards)
		held := map[string]int{}
		for _, l := range leases {
			held[l.Owner]++
		}
		taken := map[int]bool{}
		excess := false
		for _, me := range live {
			p := ownership.Balance(me, live, leases)
			checkPlan(rt, me, leases, p)
			after := held[me] + len(p.Take) - len(p.Release)
			switch {
			case held[me] > target[me]:
				excess = true
				if after != target[me] {
					rt.Errorf("%s holds %d, target %d, keeps %d", me, held[me], target[me], after)
				}
			case after > target[me]:
				rt.Errorf("%s holds %d, target %d, would hold %d", me, held[me], target[me], after)
			}
			for _, s := range p.Take {
				if taken[s] {
					rt.Errorf("shard %d planned twice", s)
				}
				taken[s] = true
			}
		}
		if !excess && held["dead"] == 0 && len(taken) != held[""] {
			rt.Errorf("%d shards free, %d planned to be taken", held[""], len(taken))
		}
	})
}
