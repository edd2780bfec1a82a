package ownership

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a replica stops holding a shard, and the one it starts: the
// change label of muster_shard_ownership_changes_total.
const (
	changeGained   = "gained"   // taken: free, released or expired
	changeReleased = "released" // given up: the balance, or a graceful stop
	changeExpired  = "expired"  // the local deadline passed without a renewal landing
	changeDeposed  = "deposed"  // the database no longer names this tenure (renewal refused)
	changeHanded   = "handed"   // taken by the replica it was offered to
)

type metrics struct {
	owned         prometheus.Gauge
	renewFailures prometheus.Counter
	changes       *prometheus.CounterVec
	unbelieved    *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_shards_owned",
			Help: "Shards this replica holds now (leases it took and renewed within its local deadline).",
		}),
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_shard_lease_renew_failures_total",
			Help: "Ownership rounds that ended before their lease renewal landed (database unreachable or refusing); held shards stay held until their local deadlines.",
		}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_shard_ownership_changes_total",
			Help: "Shards this replica started or stopped holding, by change: gained, released (balance or graceful stop), expired (local deadline passed without a renewal), deposed (the database refused the renewal), handed (taken by the replica it was offered to).",
		}, []string{"change"}),
		unbelieved: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "muster_replicas_unbelieved",
			Help: "Live rows of table replicas not believed at the last reading (not followed, dealt shards, sent evidence or counted), by reason: unsealed, unknown_key, bad_seal, insecure_address (replica_unsealed, replica_insecure_address).",
		}, []string{"reason"}),
	}
	for _, r := range unbelievedReasons {
		m.unbelieved.WithLabelValues(r)
	}
	for _, c := range []string{changeGained, changeReleased, changeExpired, changeDeposed, changeHanded} {
		m.changes.WithLabelValues(c)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.owned, m.renewFailures, m.changes, m.unbelieved} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("ownership: register metrics: %w", err)
		}
	}
	return m, nil
}
