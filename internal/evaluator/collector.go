package evaluator

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the evaluator's reported signals (not alarms) at scrape
// time, per service: instances by state, unknown health (the observation
// coverage gap), quarantines, flap rate, single-class evidence,
// contradicted failures; and per prober, outages, suspicion and
// contradicted targets. Computing them at scrape keeps the tick path free
// of metric bookkeeping.
type collector struct {
	e *Evaluator

	instances, healthUnknown, quarantined, flapRate, singleClass, quarantines *prometheus.Desc
	contradicted, contradictions, suspectProbed                               *prometheus.Desc
	proberOutage, proberSuspect, proberContradicted, ready                    *prometheus.Desc
}

func newCollector(e *Evaluator) *collector {
	svc := []string{"service"}
	return &collector{
		e:             e,
		instances:     prometheus.NewDesc("muster_instances", "Instances by eligibility state.", []string{"service", "state"}, nil),
		healthUnknown: prometheus.NewDesc("muster_instances_health_unknown", "Instances in rotation that no evidence class currently speaks for (ADR-05).", svc, nil),
		quarantined:   prometheus.NewDesc("muster_instances_quarantined", "Instances held out of rotation by flap quarantine (ADR-09).", svc, nil),
		flapRate:      prometheus.NewDesc("muster_flap_rate", "Eligibility changes per instance per hour over the flap window.", svc, nil),
		singleClass:   prometheus.NewDesc("muster_service_single_class", "1 when the service has fewer than two sufficient evidence classes (ADR-04).", svc, nil),
		quarantines:   prometheus.NewDesc("muster_quarantines_total", "Flap quarantines started since the service was loaded.", svc, nil),
		contradicted: prometheus.NewDesc("muster_instances_contradicted",
			"Instances held in rotation, degraded, because their failure comes from one evidence class and another class or a peer prober contradicts it (ADR-04).", svc, nil),
		contradictions: prometheus.NewDesc("muster_contradicted_failures_total",
			"Single-class failures held in rotation (degraded) by contradicting evidence, since the service was loaded.", svc, nil),
		suspectProbed: prometheus.NewDesc("muster_instances_suspect_probed", "Instances whose evidence from a suspect prober is being ignored.", svc, nil),
		proberOutage:  prometheus.NewDesc("muster_prober_outage", "1 while a prober is out: silent on all its targets, or only able to say it cannot observe.", []string{"prober", "kind"}, nil),
		proberSuspect: prometheus.NewDesc("muster_prober_suspect",
			"1 while a prober is suspect: it reports failure that other evidence contradicts on many of its targets, so its evidence is ignored.", []string{"prober"}, nil),
		proberContradicted: prometheus.NewDesc("muster_prober_contradicted_targets",
			"Targets a prober reports failing while another evidence class or a peer prober says healthy (listed while above 0).", []string{"prober"}, nil),
		ready: prometheus.NewDesc("muster_evaluator_ready", "1 once the evaluator has rebuilt its state and publishes verdicts.", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.instances, c.healthUnknown, c.quarantined, c.flapRate, c.singleClass, c.quarantines,
		c.contradicted, c.contradictions, c.suspectProbed, c.proberOutage, c.proberSuspect, c.proberContradicted, c.ready} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	e := c.e
	ready := 0.0
	if e.ready.Load() {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, ready)
	if ready == 0 {
		return
	}
	now := e.cfg.Now()
	e.mu.Lock()
	stats := e.engine.AllServiceStats(now)
	outages := e.engine.ProberOutages()
	probers := e.engine.ProberStats()
	e.mu.Unlock()
	names := e.reporterNames()
	for _, s := range stats {
		for state, n := range map[string]int{"eligible": s.Eligible, "degraded": s.Degraded, "ineligible": s.Ineligible, "unknown": s.Unknown} {
			ch <- prometheus.MustNewConstMetric(c.instances, prometheus.GaugeValue, float64(n), s.Service, state)
		}
		ch <- prometheus.MustNewConstMetric(c.healthUnknown, prometheus.GaugeValue, float64(s.HealthUnknown), s.Service)
		ch <- prometheus.MustNewConstMetric(c.quarantined, prometheus.GaugeValue, float64(s.Quarantined), s.Service)
		ch <- prometheus.MustNewConstMetric(c.flapRate, prometheus.GaugeValue, s.FlapRate, s.Service)
		single := 0.0
		if s.SingleClass {
			single = 1
		}
		ch <- prometheus.MustNewConstMetric(c.singleClass, prometheus.GaugeValue, single, s.Service)
		ch <- prometheus.MustNewConstMetric(c.quarantines, prometheus.CounterValue, float64(s.Quarantines), s.Service)
		ch <- prometheus.MustNewConstMetric(c.contradicted, prometheus.GaugeValue, float64(s.Contradicted), s.Service)
		ch <- prometheus.MustNewConstMetric(c.contradictions, prometheus.CounterValue, float64(s.Contradictions), s.Service)
		ch <- prometheus.MustNewConstMetric(c.suspectProbed, prometheus.GaugeValue, float64(s.SuspectProbed), s.Service)
	}
	for _, o := range outages {
		kind := "silent"
		if o.Unobservable {
			kind = "unobservable"
		}
		ch <- prometheus.MustNewConstMetric(c.proberOutage, prometheus.GaugeValue, 1, names[uint64(o.Prober)], kind)
	}
	// Prober labels are the interned identities, as for outages.
	for _, p := range probers {
		if p.Suspect {
			ch <- prometheus.MustNewConstMetric(c.proberSuspect, prometheus.GaugeValue, 1, names[uint64(p.Prober)])
		}
		if p.Contradicted > 0 {
			ch <- prometheus.MustNewConstMetric(c.proberContradicted, prometheus.GaugeValue, float64(p.Contradicted), names[uint64(p.Prober)])
		}
	}
}

// reporterNames inverts the reporter intern table (for labels).
func (e *Evaluator) reporterNames() map[uint64]string {
	e.reporterMu.Lock()
	defer e.reporterMu.Unlock()
	out := make(map[uint64]string, len(e.reporters))
	for name, id := range e.reporters {
		out[uint64(id)] = name
	}
	return out
}
