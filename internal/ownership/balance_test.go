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

// members lists ids as ready live replicas.
func members(ids ...string) []ownership.Member {
	out := make([]ownership.Member, len(ids))
	for i, id := range ids {
		out[i] = ownership.Member{ID: id, Ready: true}
	}
	return out
}

// TestBalance: what each replica plans from one reading of the region.
// want is, per replica, how many shards it takes (free) and offers; the
// takes of all replicas must be disjoint, free shards only, and the
// offers of its own shards to ready replicas short of their targets.
func TestBalance(t *testing.T) {
	t.Parallel()
	type tr struct{ take, offer int }
	notReady := func(ms []ownership.Member, id string) []ownership.Member {
		ms = slices.Clone(ms)
		for i := range ms {
			if ms[i].ID == id {
				ms[i].Ready = false
			}
		}
		return ms
	}
	for _, c := range []struct {
		name   string
		live   []ownership.Member
		leases []ownership.Lease
		want   map[string]tr
	}{
		{"one replica starts", members("a"), layout(64), map[string]tr{"a": {64, 0}}},
		{"one replica not yet in the live list", nil, layout(64), map[string]tr{"a": {64, 0}}},
		{"two replicas start together", members("a", "b"), layout(64), map[string]tr{"a": {32, 0}, "b": {32, 0}}},
		{"a region starting cold: nobody ready, the live share", notReady(notReady(members("a", "b"), "a"), "b"), layout(64),
			map[string]tr{"a": {32, 0}, "b": {32, 0}}},
		{"three replicas start together", members("a", "b", "c"), layout(64), map[string]tr{"a": {22, 0}, "b": {21, 0}, "c": {21, 0}}},
		{"three balanced", members("a", "b", "c"), layout(64, holding{"a", 22}, holding{"b", 21}, holding{"c", 21}),
			map[string]tr{"a": {}, "b": {}, "c": {}}},
		{"a second replica joins the first: offered, not released", members("a", "b"), layout(64, holding{"a", 64}),
			map[string]tr{"a": {0, 32}, "b": {}}},
		{"a joiner not yet ready is offered nothing", notReady(members("a", "b"), "b"), layout(64, holding{"a", 64}),
			map[string]tr{"a": {}, "b": {}}},
		{"a joiner not yet ready takes no free shard", notReady(members("a", "b"), "b"), layout(64, holding{"a", 32}),
			map[string]tr{"a": {32, 0}, "b": {}}},
		{"a replica that stops being ready hands everything over", notReady(members("a", "b", "c"), "c"), layout(64, holding{"a", 22}, holding{"b", 21}, holding{"c", 21}),
			map[string]tr{"a": {}, "b": {}, "c": {0, 21}}},
		{"the last ready replica keeps what it holds", notReady(members("a"), "a"), layout(64, holding{"a", 64}),
			map[string]tr{"a": {}}},
		{"a third replica joins two", members("a", "b", "c"), layout(64, holding{"a", 32}, holding{"b", 32}),
			map[string]tr{"a": {0, 10}, "b": {0, 11}, "c": {}}},
		{"a replica left, its leases expired", members("a", "b"), layout(64, holding{"a", 22}, holding{"b", 21}),
			map[string]tr{"a": {10, 0}, "b": {11, 0}}},
		{"a replica left, its leases not yet expired", members("a", "b"), layout(64, holding{"a", 22}, holding{"b", 21}, holding{"c", 21}),
			map[string]tr{"a": {}, "b": {}}},
		{"a replacement joins before the dead one's leases expire", members("a", "b", "d"), layout(64, holding{"a", 22}, holding{"b", 21}, holding{"c", 21}),
			map[string]tr{"a": {}, "b": {}, "d": {}}},
		{"the dead one's leases expire under a replacement", members("a", "b", "d"), layout(64, holding{"a", 22}, holding{"b", 21}),
			map[string]tr{"a": {}, "b": {}, "d": {21, 0}}},
		{"over target offers while the short take the free", members("a", "b"), layout(64, holding{"a", 40}),
			map[string]tr{"a": {0, 8}, "b": {24, 0}}},
		{"more replicas than shards", members("a", "b", "c"), layout(2), map[string]tr{"a": {1, 0}, "b": {1, 0}, "c": {}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := map[string]tr{}
			taken := map[int]string{}
			dealt := map[string]map[int]string{}
			ids := []string{}
			for me := range c.want {
				ids = append(ids, me)
			}
			slices.Sort(ids)
			for _, me := range ids {
				p := ownership.Balance(me, c.live, c.leases)
				got[me] = tr{len(p.Take), len(p.Offer)}
				dealt[me] = p.Dealt
				checkPlan(t, me, c.live, c.leases, p)
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
			// What a replica says it dealt to another is what that
			// one takes (the caller watches that it does).
			for me, d := range dealt {
				for s, to := range d {
					if _, planned := c.want[to]; planned && taken[s] != to {
						t.Errorf("%s dealt shard %d to %s, which plans %q", me, s, to, taken[s])
					}
				}
			}
		})
	}
}

// TestBalanceAccepts: a replica accepts what is offered to it, no more
// than it is short after the free shards it takes.
func TestBalanceAccepts(t *testing.T) {
	t.Parallel()
	leases := layout(64, holding{"a", 64})
	for s := range 40 {
		leases[s].OfferedTo = "b" // more than b's 32
	}
	p := ownership.Balance("b", members("a", "b"), leases)
	if len(p.Accept) != 32 || len(p.Take) != 0 {
		t.Errorf("b accepts %d and takes %d, want 32 and 0", len(p.Accept), len(p.Take))
	}
	leases = layout(64, holding{"a", 40}) // 24 free
	for s := range 40 {
		leases[s].OfferedTo = "b"
	}
	if p := ownership.Balance("b", members("a", "b"), leases); len(p.Take) != 24 || len(p.Accept) != 8 {
		t.Errorf("b takes %d free and accepts %d, want 24 and 8", len(p.Take), len(p.Accept))
	}
	if p := ownership.Balance("b", notReadyMember(members("a", "b"), "b"), leases); len(p.Take)+len(p.Accept) != 0 {
		t.Errorf("a replica not ready takes %v and accepts %v", p.Take, p.Accept)
	}
}

func notReadyMember(ms []ownership.Member, id string) []ownership.Member {
	ms = slices.Clone(ms)
	for i := range ms {
		if ms[i].ID == id {
			ms[i].Ready = false
		}
	}
	return ms
}

// checkPlan: a plan takes only free shards, offers only its own to ready
// replicas other than itself, and accepts only what is offered to it,
// each listed once in order.
func checkPlan(t errorer, me string, live []ownership.Member, leases []ownership.Lease, p ownership.Plan) {
	t.Helper()
	for _, s := range p.Take {
		if leases[s].Owner != "" {
			t.Errorf("%s plans to take shard %d, held by %q", me, s, leases[s].Owner)
		}
	}
	for s, to := range p.Offer {
		if leases[s].Owner != me {
			t.Errorf("%s plans to offer shard %d, held by %q", me, s, leases[s].Owner)
		}
		// While no replica is ready (a cold start), any live one that is
		// not leaving is dealt shards.
		anyReady := slices.ContainsFunc(live, func(m ownership.Member) bool { return m.Ready && !m.Leaving })
		if to == me || !slices.ContainsFunc(live, func(m ownership.Member) bool { return m.ID == to && (m.Ready || !anyReady) && !m.Leaving }) {
			t.Errorf("%s offers shard %d to %q, not another ready replica", me, s, to)
		}
	}
	for _, s := range p.Accept {
		if leases[s].OfferedTo != me || leases[s].Owner == me || leases[s].Owner == "" {
			t.Errorf("%s accepts shard %d, not offered to it: %+v", me, s, leases[s])
		}
	}
	if !slices.IsSorted(p.Take) || !slices.IsSorted(p.Accept) || len(slices.Compact(slices.Clone(p.Take))) != len(p.Take) {
		t.Errorf("%s: plan not sorted or repeats a shard: %+v", me, p)
	}
}

// errorer is what checkPlan needs of a *testing.T or a *rapid.T.
type errorer interface {
	Helper()
	Errorf(format string, args ...any)
}

// region is the simulated shard table: shard → owner ("" free) and the
// replica it is offered to.
type region struct {
	owner, offered []string
}

func newRegion(shards int) *region {
	return &region{owner: make([]string, shards), offered: make([]string, shards)}
}

// round lets every live replica, in turn, read the region and carry out
// its plan, as RunOnce does; it returns how many shards changed owner.
// An offer is carried out by the taker's round, never the giver's.
func (r *region) round(t *testing.T, live []ownership.Member) (moves int) {
	t.Helper()
	for _, me := range live {
		leases := make([]ownership.Lease, len(r.owner))
		for s, o := range r.owner {
			leases[s] = ownership.Lease{Shard: s, Owner: o, OfferedTo: r.offered[s]}
		}
		p := ownership.Balance(me.ID, live, leases)
		checkPlan(t, me.ID, live, leases, p)
		for _, s := range p.Take {
			r.owner[s], r.offered[s] = me.ID, ""
			moves++
		}
		for _, s := range p.Accept {
			r.owner[s], r.offered[s] = me.ID, ""
			moves++
		}
		for s, o := range r.owner {
			if o == me.ID {
				r.offered[s] = p.Offer[s]
			}
		}
	}
	return moves
}

func (r *region) counts() map[string]int {
	out := map[string]int{}
	for _, o := range r.owner {
		if o != "" {
			out[o]++
		}
	}
	return out
}

// settle runs rounds until the region is at the targets of its ready
// replicas, failing after three (an offer is made in one round and
// accepted in the next).
func (r *region) settle(t *testing.T, live []ownership.Member) (moves int) {
	t.Helper()
	var ready []string
	for _, m := range live {
		if m.Ready {
			ready = append(ready, m.ID)
		}
	}
	for i := 0; i < 3; i++ {
		moves += r.round(t, live)
		if maps.Equal(r.counts(), ownership.Targets(ready, len(r.owner))) {
			return moves
		}
	}
	t.Fatalf("live %v not balanced after 3 rounds: %v", live, r.counts())
	return 0
}

// TestBalanceConverges follows a region through replicas starting one
// after another, joining (first not ready, then ready), leaving without a
// word, and leaving gracefully: each time it reaches the targets within
// three rounds, moves no more shards than the change requires, and no
// shard is ever free while a live replica holds it out for a taker
// (shards move only by offer and acceptance).
func TestBalanceConverges(t *testing.T) {
	t.Parallel()
	r := newRegion(64)
	if moves := r.settle(t, members("a")); moves != 64 {
		t.Errorf("first replica: %d moves, want 64", moves)
	}
	// b joins, rebuilding: nothing moves until it is ready.
	if moves := r.round(t, notReadyMember(members("a", "b"), "b")); moves != 0 {
		t.Errorf("b not ready: %d moves, want 0", moves)
	}
	if moves := r.settle(t, members("a", "b")); moves != 32 {
		t.Errorf("second replica ready: %d moves, want 32", moves)
	}
	if moves := r.settle(t, members("a", "b", "c")); moves != 21 {
		t.Errorf("third replica joins: %d moves, want 21 (a keeps 22)", moves)
	}
	// b dies: its leases expire, and the survivors take its shards.
	for s, o := range r.owner {
		if o == "b" {
			r.owner[s], r.offered[s] = "", ""
		}
	}
	if moves := r.settle(t, members("a", "c")); moves != 21 {
		t.Errorf("b died: %d moves, want its 21 shards", moves)
	}
	// d joins, then a leaves gracefully: it stops being ready and hands
	// its shards over; none is ever free on the way.
	r.settle(t, members("a", "c", "d"))
	leaving := []ownership.Member{{ID: "a", Leaving: true}, {ID: "c", Ready: true}, {ID: "d", Ready: true}}
	moves := 0
	for i := 0; i < 3 && r.counts()["a"] > 0; i++ {
		moves += r.round(t, leaving)
		if free := r.counts()[""]; free != 0 {
			t.Fatalf("a shard is free during the handover")
		}
		for _, o := range r.owner {
			if o == "" {
				t.Fatalf("a shard is free during the handover")
			}
		}
	}
	if moves != 22 || r.counts()["a"] != 0 {
		t.Errorf("a left: %d moves, a still holds %d; want its 22 shards moved", moves, r.counts()["a"])
	}
}

// TestBalanceProperties: for any reading (live replicas, ready or not,
// shards held by live, dead or no replicas, offers anywhere), the plans
// of all live replicas are valid and disjoint, no replica would end
// above its target, and when nobody dead holds a shard every free shard
// is dealt.
func TestBalanceProperties(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(rt, "replicas")
		shards := rapid.IntRange(1, 130).Draw(rt, "shards")
		live := make([]ownership.Member, n)
		ids := make([]string, n)
		var ready []string
		for i := range live {
			ids[i] = fmt.Sprintf("r%d", i)
			live[i] = ownership.Member{ID: ids[i], Ready: rapid.Bool().Draw(rt, "ready")}
			if live[i].Ready {
				ready = append(ready, ids[i])
			}
		}
		if len(ready) == 0 {
			ready = ids
		}
		owners := append(slices.Clone(ids), "", "", "dead")
		leases := make([]ownership.Lease, shards)
		for s := range leases {
			leases[s] = ownership.Lease{Shard: s, Owner: rapid.SampledFrom(owners).Draw(rt, "owner")}
			if leases[s].Owner != "" {
				leases[s].OfferedTo = rapid.SampledFrom(append(slices.Clone(ids), "")).Draw(rt, "offered")
			}
		}
		target := ownership.Targets(ready, shards)
		held := map[string]int{}
		for _, l := range leases {
			held[l.Owner]++
		}
		taken := map[int]bool{}
		for _, m := range live {
			me := m.ID
			p := ownership.Balance(me, live, leases)
			checkPlan(rt, me, live, leases, p)
			if after := held[me] + len(p.Take) + len(p.Accept); len(p.Take)+len(p.Accept) > 0 && after > target[me] {
				rt.Errorf("%s holds %d, target %d, would hold %d", me, held[me], target[me], after)
			}
			for _, s := range append(slices.Clone(p.Take), p.Accept...) {
				if taken[s] {
					rt.Errorf("shard %d planned twice", s)
				}
				taken[s] = true
			}
		}
		free := 0
		for s := range taken {
			if leases[s].Owner == "" {
				free++
			}
		}
		if held["dead"] == 0 && free != held[""] {
			rt.Errorf("%d shards free, %d planned to be taken", held[""], free)
		}
	})
}

// TestALeavingReplicaHandsOnlyToReadyOnes: a replica leaving while no
// other is ready (the region stopping at once) offers nothing: nobody
// could publish it.
func TestALeavingReplicaHandsOnlyToReadyOnes(t *testing.T) {
	t.Parallel()
	live := []ownership.Member{{ID: "a", Leaving: true}, {ID: "b"}, {ID: "c"}}
	if p := ownership.Balance("a", live, layout(64, holding{"a", 22}, holding{"b", 21}, holding{"c", 21})); len(p.Offer)+len(p.Take)+len(p.Accept) != 0 {
		t.Errorf("a leaving replica plans %+v with no ready replica to take anything", p)
	}
}
