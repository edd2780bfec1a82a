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
	// OfferedTo is the replica the owner offers the shard to, "" when
	// none.
	OfferedTo string
}

// Member is one live replica as a round read it.
type Member struct {
	ID string
	// Ready says it can publish what it is dealt: rebuilt, its publisher
	// prepared, its peers' views relayed (replicas.ready).
	Ready bool
	// Leaving says it is handing everything over before it stops (only
	// ever this replica's own entry: a leaving peer is simply not ready).
	Leaving bool
}

// Plan is what one replica should do about its shards this round.
type Plan struct {
	// Take are free shards to take, ascending.
	Take []int
	// Offer maps each shard it holds and should hand over to the replica
	// it is offered to. A shard it should give up for which no ready
	// replica is short is not in Offer: it is kept until one is.
	Offer map[int]string
	// Accept are shards their owners offer to it that it should take,
	// ascending: no more than it is short of its target.
	Accept []int
	// Dealt maps each free shard dealt to another replica to it: the
	// caller watches that it is taken (a replica that leaves what it is
	// dealt untaken is dealt nothing for a while).
	Dealt map[int]string
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

// Balance returns what replica me (an entry of live; added as ready if
// live does not name it) should do so that the shards end up shared
// evenly among the ready live replicas, handed over before they are let
// go. It is a pure function of what one round read from the database,
// and every replica runs it on its own reading:
//
//   - Only ready replicas are dealt shards (Targets over them). A
//     replica that is starting, rebuilding or leaving holds no target:
//     it could not publish what it were given, so giving it a shard
//     would leave the shard's services unpublished. While no replica is
//     ready at all (a region starting cold), every live replica that is
//     not leaving counts, as nothing can publish yet anyway.
//   - Free shards are dealt first, then the shards to hand over (a
//     ready replica's excess, the lowest in its rendezvous order, and
//     everything a live replica that is not ready holds): each, in that
//     order and by shard, goes to the replica still short with the
//     highest rendezvous score for it. Every replica deals the same way
//     from the same reading, so two replicas short at once go for
//     different shards instead of racing for the same ones.
//   - A replica takes the free shards dealt to it, offers the shards it
//     hands over to those they were dealt to, and accepts the shards
//     offered to it, as many as it is still short. An offer changes
//     nothing until it is accepted: the giver keeps the shard, and
//     publishes it, until the taker takes it under a new epoch.
//   - A shard held by a replica that is not live (it stopped
//     heartbeating, its lease has not yet expired) is nobody's to take:
//     only the database's clock frees it.
//
// Since the targets sum to the number of shards, the ready replicas are
// together short by exactly the free shards plus the shards to hand over,
// so everything is dealt, and rounds with the same readings converge.
// Replicas reading the region at different moments may plan differently
// for a round; a take the database refuses (someone else got there
// first, or the offer was withdrawn) costs nothing, and the next round
// reads again.
func Balance(me string, live []Member, leases []Lease) Plan {
	members := map[string]Member{}
	for _, m := range live {
		members[m.ID] = m
	}
	if _, ok := members[me]; !ok {
		members[me] = Member{ID: me, Ready: true}
	}
	var dealt []string
	for id, m := range members {
		if m.Ready && !m.Leaving {
			dealt = append(dealt, id)
		}
	}
	if len(dealt) == 0 {
		if members[me].Leaving {
			// Nobody could publish what a leaving replica would hand
			// over: it keeps its shards until it releases them.
			return Plan{}
		}
		for id, m := range members {
			if !m.Leaving {
				dealt = append(dealt, id)
			}
		}
	}
	target := Targets(dealt, len(leases))
	held := map[string][]int{}
	var free []int
	for _, l := range leases {
		if l.Owner == "" {
			free = append(free, l.Shard)
			continue
		}
		held[l.Owner] = append(held[l.Owner], l.Shard)
	}
	// What must be handed over, and who is short.
	var handover []int
	short := map[string]int{}
	for id, shards := range held {
		t, counted := target[id]
		switch {
		case counted && len(shards) > t:
			// Keep the shards it prefers; hand over the rest.
			ss := slices.Clone(shards)
			slices.SortFunc(ss, func(a, b int) int { return cmp.Compare(score(id, a), score(id, b)) })
			handover = append(handover, ss[:len(ss)-t]...)
		case !counted:
			if _, isLive := members[id]; isLive {
				handover = append(handover, shards...)
			}
		}
	}
	ids := make([]string, 0, len(target))
	for id, t := range target {
		if n := t - len(held[id]); n > 0 {
			short[id] = n
			ids = append(ids, id)
		}
	}
	slices.Sort(ids) // ties in score are broken by id, the same everywhere
	slices.Sort(free)
	slices.Sort(handover)
	deal := func(s int) string {
		best, bestScore := "", uint64(0)
		for _, id := range ids {
			if short[id] == 0 {
				continue
			}
			if sc := score(id, s); best == "" || sc > bestScore {
				best, bestScore = id, sc
			}
		}
		if best != "" {
			short[best]--
		}
		return best
	}
	var p Plan
	for _, s := range free {
		switch to := deal(s); to {
		case me:
			p.Take = append(p.Take, s)
		case "":
		default:
			if p.Dealt == nil {
				p.Dealt = map[int]string{}
			}
			p.Dealt[s] = to
		}
	}
	mine := map[int]bool{}
	for _, s := range held[me] {
		mine[s] = true
	}
	for _, s := range handover {
		to := deal(s)
		if mine[s] && to != "" {
			if p.Offer == nil {
				p.Offer = map[int]string{}
			}
			p.Offer[s] = to
		}
	}
	// Accept what is offered to me, up to what I am short after the free
	// shards I take: the giver's reading may differ from mine, and taking
	// more than my target would only make me hand some back.
	if room := target[me] - len(held[me]) - len(p.Take); room > 0 {
		for _, l := range leases {
			if room == 0 {
				break
			}
			if l.OfferedTo == me && l.Owner != "" && l.Owner != me {
				p.Accept = append(p.Accept, l.Shard)
				room--
			}
		}
	}
	return p
}
