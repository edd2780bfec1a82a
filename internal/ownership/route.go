package ownership

import (
	"slices"
	"sync/atomic"

	"github.com/musterhq/muster/db"
)

// Evidence about a service is evaluated where the service is owned, and
// kept warm on at most one other replica, its standby (internal/forward,
// docs/replicas.md "Evidence reaches the owner"). The routes are a
// table per shard, rebuilt from each round's reading of the leases and
// the live replicas, and read without a lock on every report.

// routes is one reading's destinations per shard.
type routes struct {
	to [][]string // by shard
}

// noteRoutes rebuilds the evidence routes from a round's reading: for
// each shard, its owner and its standby; for a shard without a live
// owner (free, or held by a replica that stopped heartbeating), every
// live replica, since any of them may be dealt it.
func (m *Manager) noteRoutes(replicas []db.Replica, rows []db.ShardLeaseListRow) {
	live := map[string]bool{}
	var ready, all []string
	for _, r := range replicas {
		live[r.ID] = true
		all = append(all, r.ID)
		if r.Ready {
			ready = append(ready, r.ID)
		}
	}
	if !live[m.cfg.ID] {
		live[m.cfg.ID] = true
		all = append(all, m.cfg.ID)
	}
	slices.Sort(all)
	if len(ready) == 0 {
		ready = all
	}
	n := 0
	for _, r := range rows {
		n = max(n, int(r.Shard)+1)
	}
	rt := &routes{to: make([][]string, n)}
	for _, r := range rows {
		s := int(r.Shard)
		owner := ""
		if r.Held && r.Owner != nil && live[*r.Owner] {
			owner = *r.Owner
		}
		if owner == "" {
			rt.to[s] = all
			continue
		}
		rt.to[s] = []string{owner}
		sb := standby(s, owner, r.OfferedTo, live, ready)
		if sb == "" {
			// No other replica is ready (they are starting): one of
			// them will be, and it had better hold current windows.
			sb = standby(s, owner, nil, live, all)
		}
		if sb != "" {
			rt.to[s] = append(rt.to[s], sb)
		}
	}
	m.routes.Store(rt)
}

// standby is the one replica besides owner that is sent a shard's
// evidence: the replica the shard is offered to while a move is under
// way (so the new owner holds current windows when it takes it), else
// the ready replica with the highest rendezvous score for the shard (the
// order the balance deals shards in; any live one when no other is
// ready), so the standby changes only when that replica comes or goes.
func standby(shard int, owner string, offeredTo *string, live map[string]bool, ready []string) string {
	if offeredTo != nil && *offeredTo != owner && live[*offeredTo] {
		return *offeredTo
	}
	best, bestScore := "", uint64(0)
	for _, id := range ready {
		if id == owner {
			continue
		}
		if sc := score(id, shard); best == "" || sc > bestScore || (sc == bestScore && id < best) {
			best, bestScore = id, sc
		}
	}
	return best
}

// EvidenceRoute returns the shard of service and the replicas its
// evidence goes to (this one possibly among them): its owner and its
// standby, or every live replica while the shard has no live owner. ok
// is false before the first reading of the leases: the caller then
// sends to everyone, as nothing better is known.
func (m *Manager) EvidenceRoute(service string) (shard int, to []string, ok bool) {
	rt := m.routes.Load()
	if rt == nil || len(rt.to) == 0 {
		return -1, nil, false
	}
	shard = shardOf(service, len(rt.to))
	return shard, rt.to[shard], true
}

// shardOf is ShardOf without its allocations (it runs on every report):
// FNV-1a over the name's bytes, the same finaliser, the same modulo.
func shardOf(service string, shards int) int {
	const offset64, prime64 = 14695981039346656037, 1099511628211
	h := uint64(offset64)
	for i := 0; i < len(service); i++ {
		h ^= uint64(service[i])
		h *= prime64
	}
	return int(mix(h) % uint64(shards))
}

// ShardRoute returns the replicas a shard's evidence goes to, as
// EvidenceRoute does; ok is false before the first reading or for a
// shard out of range.
func (m *Manager) ShardRoute(shard int) (to []string, ok bool) {
	rt := m.routes.Load()
	if rt == nil || shard < 0 || shard >= len(rt.to) {
		return nil, false
	}
	return rt.to[shard], true
}

// Evaluates says whether this replica keeps evidence about service: it
// owns it or stands by for it, the shard has no live owner, or no
// reading has been made yet.
func (m *Manager) Evaluates(service string) bool {
	_, to, ok := m.EvidenceRoute(service)
	return !ok || slices.Contains(to, m.cfg.ID)
}

// routeTable is an atomic pointer to the current routes.
type routeTable = atomic.Pointer[routes]
