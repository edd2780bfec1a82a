package ownership

import (
	"slices"
	"sync/atomic"

	"github.com/musterhq/muster/db"
)

// Evidence about a service is evaluated where the service is owned
// (internal/forward, docs/replicas.md "Evidence reaches the owner"): each
// sample goes to its service's owner, and to a second replica only while
// the shard is offered to it in a move, so the new owner takes it with
// current windows. Every other replica keeps its copy of the service's
// state warm from the windows the owner writes to PostgreSQL every
// flush (evaluator.Config.FollowWindows), which costs a row per instance
// and class per flush instead of a copy of every sample. The routes are
// a table per shard, rebuilt from each round's reading of the leases and
// the live replicas, and read without a lock on every report.

// routes is one reading's destinations per shard.
type routes struct {
	to [][]string // by shard
	// owner is each shard's live owner, "" for a shard without one.
	owner []string
}

// noteRoutes rebuilds the evidence routes from a round's reading: for
// each shard, its owner, and the replica it is offered to while a move
// is under way; for a shard without a live owner (free, or held by a
// replica that stopped heartbeating), every live replica, since any of
// them may be dealt it.
func (m *Manager) noteRoutes(replicas []db.Replica, rows []db.ShardLeaseListRow) {
	live := map[string]bool{}
	var all []string
	for _, r := range replicas {
		live[r.ID] = true
		all = append(all, r.ID)
	}
	if !live[m.cfg.ID] {
		live[m.cfg.ID] = true
		all = append(all, m.cfg.ID)
	}
	slices.Sort(all)
	n := 0
	for _, r := range rows {
		n = max(n, int(r.Shard)+1)
	}
	rt := &routes{to: make([][]string, n), owner: make([]string, n)}
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
		rt.owner[s] = owner
		if o := r.OfferedTo; o != nil && *o != owner && live[*o] {
			rt.to[s] = append(rt.to[s], *o)
		}
	}
	m.routes.Store(rt)
}

// EvidenceRoute returns the shard of service and the replicas its
// evidence goes to (this one possibly among them): its owner (and the
// replica it is offered to, during a move), or every live replica while
// the shard has no live owner. ok
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

// EvidenceOwner returns the replica that evaluates service's evidence:
// its shard's live owner as of the last reading, or "" while the shard
// has no live owner or before the first reading (any replica then takes
// the evidence and forwards it where it belongs). A reporter that sends
// each service's evidence to its owner spares the region the forwarding
// hop (GET /v1/evidence/routes); during a move the owner still forwards
// a copy to the replica the shard is offered to, so the new owner starts
// with current windows either way.
func (m *Manager) EvidenceOwner(service string) string {
	rt := m.routes.Load()
	if rt == nil || len(rt.owner) == 0 {
		return ""
	}
	return rt.owner[shardOf(service, len(rt.owner))]
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
// owns it or is being offered it, the shard has no live owner, or no
// reading has been made yet.
func (m *Manager) Evaluates(service string) bool {
	_, to, ok := m.EvidenceRoute(service)
	return !ok || slices.Contains(to, m.cfg.ID)
}

// routeTable is an atomic pointer to the current routes.
type routeTable = atomic.Pointer[routes]
