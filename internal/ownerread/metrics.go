package ownerread

import "github.com/prometheus/client_golang/prometheus"

// kind is what an owner is asked for (the metrics' kind label).
type kind string

const (
	kindEligibility kind = "eligibility"
	kindQuarantines kind = "quarantines"
	kindStats       kind = "stats"
)

type metrics struct {
	requests   *prometheus.CounterVec
	incomplete *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_owner_reads_total",
			Help: "Reads of evaluator state asked of the replica that owns the services, by kind (eligibility, quarantines, stats, preview) and result (ok, timeout, unreachable, refused, malformed, unsendable, no_address).",
		}, []string{"kind", "result"}),
		incomplete: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_owner_reads_incomplete_total",
			Help: "Merged lists of evaluator state answered without some owner's part (it did not answer), by kind (quarantines, stats).",
		}, []string{"kind"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.incomplete} {
		if err := reg.Register(c); err != nil {
			return metrics{}, err
		}
	}
	return m, nil
}
