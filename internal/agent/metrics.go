package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/musterhq/muster/internal/stream"
)

// register puts the agent's metrics, the xDS server's (registered by
// xds.New) and the process's on the server's registry.
func (s *Server) register(listeners []*Listener) error {
	a := s.a
	boolGauge := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	s.watchAdmissionRefused = prometheus.NewCounter(prometheus.CounterOpts{Name: "muster_agent_watch_admission_refused_total",
		Help: "Local watch (re)subscriptions refused by reconnect admission (xDS streams: muster_xds_admission_refused_total)."})
	s.watchStreamsRefused = prometheus.NewCounter(prometheus.CounterOpts{Name: "muster_agent_watch_streams_refused_total",
		Help: "Local watch streams refused because --max-streams were open (xDS streams: muster_xds_refused_total{reason=\"streams_per_principal\"})."})
	adm := func(f func(stream.AdmissionStats) float64) func() float64 {
		return func() float64 { return f(s.admission.Stats()) }
	}
	cs := []prometheus.Collector{
		s.watchAdmissionRefused, s.watchStreamsRefused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_agent_admission_budget",
			Help: "Local (re)subscriptions, xDS and watch, admitted per admission window now."},
			adm(func(st stream.AdmissionStats) float64 { return float64(st.Budget) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_agent_admitted_window",
			Help: "Local (re)subscriptions, xDS and watch, admitted within the last admission window."},
			adm(func(st stream.AdmissionStats) float64 { return float64(st.InWindow) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "muster_agent_admitted_total",
			Help: "Local (re)subscriptions, xDS and watch, admitted since start."},
			adm(func(st stream.AdmissionStats) float64 { return float64(st.Admitted) })),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_agent_upstream_connected",
			Help: "1 while the agent's watch stream to muster is open."},
			func() float64 { return boolGauge(a.Upstream().Connected) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_agent_upstream_synced",
			Help: "1 while the open watch stream has caught up and holds a view of every service followed."},
			func() float64 { return boolGauge(a.Upstream().Synced) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "muster_agent_upstream_reconnects_total",
			Help: "Watch subscriptions to muster after the first, by the current upstream client."},
			func() float64 { return float64(a.Upstream().Reconnects) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_agent_services",
			Help: "Services the agent follows upstream."},
			func() float64 { return float64(len(a.Services())) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_agent_services_unchecked",
			Help: "Services local clients asked for that muster could not be asked about yet (unreachable); asked again every 5 s."},
			func() float64 { return float64(len(a.Unchecked())) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_agent_views",
			Help: "Services the agent holds a view of and serves."},
			func() float64 { return float64(a.hub.Views()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_agent_ready",
			Help: "1 once every service followed has a view (what /readyz answers)."},
			func() float64 { return boolGauge(a.Ready()) }),
		ageCollector{a},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_agent_local_streams", Help: "Open local streams, by surface.",
			ConstLabels: prometheus.Labels{"surface": "xds"}},
			func() float64 { return float64(s.xds.Streams()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_agent_local_streams", Help: "Open local streams, by surface.",
			ConstLabels: prometheus.Labels{"surface": "watch"}},
			func() float64 { return float64(s.watches.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "muster_agent_refused_connections_total",
			Help: "Connections closed because their peer was not a loopback address."},
			func() float64 {
				var n uint64
				for _, l := range listeners {
					n += l.Refused()
				}
				return float64(n)
			}),
	}
	for _, c := range cs {
		if err := s.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

var ageDesc = prometheus.NewDesc("muster_agent_view_age_seconds",
	"How old the data of the view the agent serves is (now minus the view's generated_at), by service: grows while muster is unreachable.",
	[]string{"service"}, nil)

// ageCollector reports each held view's age at scrape time.
type ageCollector struct{ a *Agent }

func (c ageCollector) Describe(ch chan<- *prometheus.Desc) { ch <- ageDesc }

func (c ageCollector) Collect(ch chan<- prometheus.Metric) {
	for name, age := range c.a.Ages() {
		ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, age.Seconds(), name)
	}
}
