package xds

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	streams          *prometheus.GaugeVec
	pushes           *prometheus.CounterVec
	nacks            *prometheus.CounterVec
	denied           *prometheus.CounterVec
	admissionRefused prometheus.Counter
	latency          prometheus.Histogram
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
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "muster_xds_push_latency_seconds",
			Help:    "From the hub receiving a view to an xDS response carrying its assignment being sent, per response.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	if reg == nil {
		return m, nil
	}
	nodes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "muster_xds_nodes", Help: "Principals with at least one open xDS stream (each has a snapshot of its own).",
	}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(len(s.nodes))
	})
	for _, c := range []prometheus.Collector{m.streams, m.pushes, m.nacks, m.denied, m.admissionRefused, m.latency, nodes} {
		if err := reg.Register(c); err != nil {
			return m, fmt.Errorf("xds: register metrics: %w", err)
		}
	}
	return m, nil
}

// quietLogger is go-control-plane's logger on slog: its per-watch chatter
// goes to debug.
type quietLogger struct{ log *slog.Logger }

func (l quietLogger) Debugf(format string, args ...any) { l.log.Debug(fmt.Sprintf(format, args...)) }
func (l quietLogger) Infof(format string, args ...any)  { l.log.Debug(fmt.Sprintf(format, args...)) }
func (l quietLogger) Warnf(format string, args ...any)  { l.log.Warn(fmt.Sprintf(format, args...)) }
func (l quietLogger) Errorf(format string, args ...any) { l.log.Error(fmt.Sprintf(format, args...)) }
