package ownership

import (
	"cmp"
	"slices"
)

// Lease is one shard's lease as Balance sees it.
type Lease struct {
	Shard int
	// Owner is the replica holding the shard now, "" when the shard is
	// free: never taken, released, or expired by the database's clock.
	Owner string
}

// Plan is what one replica should do about its shards this round.
type Plan struct {
	Take    []int // free shards to take, ascending
	Release []int // shards it holds and should give up, ascending
}

// Targets returns how many shards each live replica should hold when
// there are shards shards: shards/N each, and the remainder one apiece to
// the first replicas in id order, so the targets sum to shards and differ
// by at most one. Every replica computes the same targets from the same
// live set, with no coordination. Duplicates in live count once.
func Targets(live []string, shards int) map[string]int {
	ids := slices.Clone(live)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	out := make(map[string]int, len(ids))
	if len(ids) == 0 {
		return out
	}
	base, extra := shards/len(ids), shards%len(ids)
	for i, id := range ids {
		out[id] = base
		if i < extra {
			out[id]++
		}
	}
	return out
}

// Balance returns what replica me should do so that every live replica
// ends up holding its target (Targets) of the shards leases describes.
// me counts as live whether or not live names it. It is a pure function
// of what one round read from the database, and every replica runs it on
// its own reading:
//
//   - A replica above its target releases its excess (the shards it holds
//     with the lowest rendezvous score for it) and takes nothing.
//   - Otherwise, free shards are dealt to the live replicas below their
//     targets: each free shard, in shard order, goes to the replica with
//     the highest rendezvous score for it among those still short. A
//     replica takes the ones dealt to it. Every replica deals the same
//     way from the same reading, so two replicas short at once go for
//     different shards instead of racing for the same ones.
//   - A shard held by a replica that is not live (it stopped
//     heartbeating, its lease has not yet expired) is nobody's to take:
//     only the database's clock frees it.
//
// Since the targets of the live replicas sum to the number of shards,
// the live replicas are together short by exactly the free shards, the
// shards of replicas no longer live, and the excess of those above
// target; so every free shard is dealt, and rounds with the same live
// set converge: the excess is released in one round and dealt in the
// next. Replicas reading the region at different moments (one just
// joined, one just left) may plan differently for a round; a take the
// database refuses (someone else got there first) costs nothing, and the
// next round reads again.
func Balance(me string, live []string, leases []Lease) Plan {
	target := Targets(append(slices.Clone(live), me), len(leases))
	held := map[string]int{}
	var mine, free []int
	for _, l := range leases {
		switch {
		case l.Owner == "":
			free = append(free, l.Shard)
		case l.Owner == me:
			mine = append(mine, l.Shard)
		}
		if _, ok := target[l.Owner]; ok {
			held[l.Owner]++
		}
	}
	var p Plan
	if excess := len(mine) - target[me]; excess > 0 {
		// Keep the shards me prefers; give up the rest.
		slices.SortFunc(mine, func(a, b int) int { return cmp.Compare(score(me, a), score(me, b)) })
		p.Release = mine[:excess]
		slices.Sort(p.Release)
		return p
	}
	short := map[string]int{}
	for id, t := range target {
		if n := t - held[id]; n > 0 {
			short[id] = n
		}
	}
	if short[me] == 0 {
		return p
	}
	ids := make([]string, 0, len(short))
	for id := range short {
		ids = append(ids, id)
	}
	slices.Sort(ids) // ties in score are broken by id, the same everywhere
	slices.Sort(free)
	for _, s := range free {
		best, bestScore := "", uint64(0)
		for _, id := range ids {
			if short[id] == 0 {
				continue
			}
			if sc := score(id, s); best == "" || sc > bestScore {
				best, bestScore = id, sc
			}
		}
		if best == "" {
			break // nobody is short any more
		}
		short[best]--
		if best == me {
			p.Take = append(p.Take, s)
		}
	}
	return p
}
