package ownership

// Owner names the replica a read of service's evaluator state should be
// answered by, as this replica knows it now: itself when it owns the
// service (Owns), the other replica the last reading of the leases showed
// holding its shard when that replica was live then, and "" when the
// shard had no live owner (free, expired, or held by a replica no longer
// heartbeating: every replica then keeps the service's evidence, so any
// may answer). known is false before the first reading, when nothing
// better than this replica's own state is known.
func (m *Manager) Owner(service string) (id string, known bool) {
	if _, ok := m.Owns(service); ok {
		return m.cfg.ID, true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.shards == 0 {
		return "", false
	}
	s := ShardOf(service, m.shards)
	owner, ok := m.others[s]
	if !ok {
		return "", true
	}
	for _, r := range m.region.Replicas {
		if r.ID == owner {
			return owner, true
		}
	}
	return "", true
}

// Seen reports whether any reading of the region since this replica
// started showed replica id live (a believed row heartbeating within the
// lease TTL). Reads of evaluator state are answered to such replicas
// only: a replica cut off from PostgreSQL stops heartbeating but still
// serves its callers, and its reads are no less legitimate for that.
func (m *Manager) Seen(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seen[id]
}
