package xds

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	streams          *prometheus.GaugeVec
	pushes           *prometheus.CounterVec
	nacks            *prometheus.CounterVec
	denied           *prometheus.CounterVec
	admissionRefused prometheus.Counter
	notCurrent       prometheus.Counter
	refused          *prometheus.CounterVec
	latency          prometheus.Histogram
	// pushed are pushes' counters by delta and type URL, looked up once.
	pushed map[bool]map[string]prometheus.Counter
}

// push counts a response sent.
func (m metrics) push(delta bool, typeURL string) {
	if c := m.pushed[delta][typeURL]; c != nil {
		c.Inc()
		return
	}
	p := "sotw"
	if delta {
		p = "delta"
	}
	m.pushes.WithLabelValues(p, typeName(typeURL)).Inc()
}

func newMetrics(reg prometheus.Registerer, s *Server) (metrics, error) {
	m := metrics{
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "muster_xds_streams", Help: "Open xDS (ADS) streams, by protocol (sotw, delta).",
		}, []string{"protocol"}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_xds_pushes_total", Help: "xDS responses sent, by protocol and resource type (listener, route, cluster, endpoint).",
		}, []string{"protocol", "type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_xds_nacks_total", Help: "xDS responses a client rejected (NACK), by resource type; each is logged and not resent.",
		}, []string{"type"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_xds_denied_total",
			Help: "xDS attempts refused: streams without a token (unauthenticated) or with one not accepted (invalid_token, issuer_unavailable), and services asked for that the node may not resolve (not_granted, once per stream and service).",
		}, []string{"reason"}),
		admissionRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_xds_admission_refused_total", Help: "xDS streams refused by reconnect admission (RESOURCE_EXHAUSTED with a retry delay).",
		}),
		notCurrent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_xds_not_current_total", Help: "xDS streams ended or refused (UNAVAILABLE) because their node sees a service this replica cannot follow the owner of while another replica can.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_xds_refused_total",
			Help: "xDS streams and requests refused (RESOURCE_EXHAUSTED) for a limit per principal, by reason (names_per_stream, name_bytes_per_principal, streams_per_principal, streams_per_connection).",
		}, []string{"reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "muster_xds_push_latency_seconds",
			Help:    "From the hub receiving a view to an xDS response carrying its assignment being sent, per response.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	m.pushed = map[bool]map[string]prometheus.Counter{false: {}, true: {}}
	for _, t := range typeURLs {
		m.pushed[false][t] = m.pushes.WithLabelValues("sotw", typeName(t))
		m.pushed[true][t] = m.pushes.WithLabelValues("delta", typeName(t))
	}
	if reg == nil {
		return m, nil
	}
	nodes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "muster_xds_nodes", Help: "Principals with at least one open xDS stream (each has a snapshot of its own).",
	}, func() float64 {
		s.mu.RLock()
		defer s.mu.RUnlock()
		return float64(len(s.nodes))
	})
	nameBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "muster_xds_name_bytes", Help: "Bytes the xDS streams' subscriptions hold, summed over principals (each bounded by MUSTER_XDS_MAX_NAME_BYTES).",
	}, func() float64 {
		s.acct.mu.Lock()
		defer s.acct.mu.Unlock()
		var n int64
		for _, u := range s.acct.principals {
			n += u.bytes
		}
		return float64(n)
	})
	for _, c := range []prometheus.Collector{m.streams, m.pushes, m.nacks, m.denied, m.admissionRefused, m.notCurrent, m.refused, m.latency, nodes, nameBytes} {
		if err := reg.Register(c); err != nil {
			return m, fmt.Errorf("xds: register metrics: %w", err)
		}
	}
	return m, nil
}
