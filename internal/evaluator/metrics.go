package evaluator

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	accepted           prometheus.Counter
	refused            *prometheus.CounterVec
	forwarded          *prometheus.CounterVec
	tick               prometheus.Histogram
	transitions        *prometheus.CounterVec
	damping            *prometheus.HistogramVec
	rebuild            prometheus.Gauge
	windowsWritten     prometheus.Counter
	windowsDropped     prometheus.Counter
	windowsPending     prometheus.Gauge
	windowsFollowed    prometheus.Counter
	transitionsWritten prometheus.Counter
	transitionsDropped prometheus.Counter
	loadedOnDemand     *prometheus.CounterVec
	lookups            *prometheus.CounterVec
	lookupIDs          *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_samples_accepted_total", Help: "Health samples accepted at ingest.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_samples_refused_total", Help: "Health samples refused at ingest, by reason.",
		}, []string{"reason"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_samples_forwarded_total",
			Help: "Health samples another replica of the region accepted and forwarded here, by result here (accepted, refused); not counted in muster_samples_accepted_total or muster_samples_refused_total.",
		}, []string{"result"}),
		tick: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "muster_evaluation_tick_seconds", Help: "Time one evaluation tick takes.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_eligibility_transitions_total", Help: "Eligibility transitions, by the state entered.",
		}, []string{"to"}),
		damping: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "muster_damping_cost_seconds", Help: "Time from an instance's first failed sample to its removal, per service.",
			Buckets: []float64{0.25, 0.5, 1, 2, 3, 4, 5, 7.5, 10, 15, 30, 60},
		}, []string{"service"}),
		rebuild: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_evaluator_rebuild_seconds", Help: "How long the last rebuild of evaluation state took.",
		}),
		windowsWritten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_observed_windows_written_total", Help: "Observed windows written to PostgreSQL.",
		}),
		windowsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_observed_windows_dropped_total",
			Help: "Observed windows never written: over the bound of those kept while PostgreSQL was away, or older than the prune horizon by the time it came back (observed state is lossy by design).",
		}),
		windowsFollowed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_windows_followed_total",
			Help: "Observed windows other replicas wrote that this replica read and applied to the services it does not evaluate, keeping its state of them warm.",
		}),
		windowsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_observed_windows_pending", Help: "Observed windows kept in memory because a flush failed, waiting for PostgreSQL.",
		}),
		transitionsWritten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_transitions_written_total", Help: "Eligibility transitions appended to the transitions table.",
		}),
		transitionsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_transitions_dropped_total", Help: "Eligibility transitions dropped because the bounded buffer was full while PostgreSQL was away.",
		}),
		loadedOnDemand: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_evaluator_instances_loaded_on_demand_total",
			Help: "Instances the evaluator loaded before its registry refresh did: handed over by a registration on this process (source=registration), or looked up because a report named them (source=report).",
		}, []string{"source"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_evaluator_instance_lookups_total",
			Help: "PostgreSQL lookups of instances reports named that the evaluator did not know (at most one per report batch), by result (ok, error).",
		}, []string{"result"}),
		lookupIDs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_evaluator_instance_lookup_ids_total",
			Help: "Unknown instance ids named in report batches, by what became of them: active (loaded), ended, missing (looked up); cached (answered from the memory of recent misses); unchecked (not looked up: over the per-batch bound, database down, lookup failed).",
		}, []string{"result"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.accepted, m.refused, m.forwarded, m.tick, m.transitions, m.damping, m.rebuild,
		m.windowsWritten, m.windowsDropped, m.windowsPending, m.windowsFollowed, m.transitionsWritten, m.transitionsDropped,
		m.loadedOnDemand, m.lookups, m.lookupIDs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
