package forward

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	forwarded *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	refused   *prometheus.CounterVec
	lag       prometheus.Histogram
	queue     *prometheus.GaugeVec
	rerouted  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_evidence_forwarded_total", Help: "Accepted evidence items delivered to another replica of the region, by peer.",
		}, []string{"peer"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_evidence_forward_dropped_total",
			Help: "Accepted evidence items never delivered to a peer: the oldest beyond its queue's bound, or queued when it stopped being live (refusals are muster_evidence_forward_refused_total).",
		}, []string{"peer"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_evidence_forward_refused_total",
			Help: "Forwarded evidence items a peer refused for good, by peer and reason: the evaluator's refusal code for an item (alarm evidence_refused); for a request refused whole, unknown_field, malformed, too_large, unsupported_media_type, invalid_request or status_<code>; unsendable when this replica could not encode or address the request; unreported when the peer did not say why (alarm evidence_forward_refused for whole requests).",
		}, []string{"peer", "reason"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "muster_evidence_forward_lag_seconds", Help: "Time from an evidence item's acceptance here to a peer's acknowledgement of it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		rerouted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_evidence_forward_rerouted_total",
			Help: "Evidence items queued for a replica that stopped being live, sent instead to the replicas now keeping their shards.",
		}),
		queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "muster_evidence_forward_queue", Help: "Evidence items waiting to be forwarded, by peer.",
		}, []string{"peer"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.forwarded, m.dropped, m.refused, m.lag, m.queue, m.rerouted} {
		if err := reg.Register(c); err != nil {
			return metrics{}, err
		}
	}
	return m, nil
}
