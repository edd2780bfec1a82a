package tgsync

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are per binding (label binding).
type metrics struct {
	desired, registered, held, pendingDeregs, pendingRegs, unmanaged, version *prometheus.GaugeVec
	apiErrors, changes                                                        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, s *Syncer) (*metrics, error) {
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "muster_tgsync_" + name, Help: help}, []string{"binding"})
	}
	m := &metrics{
		desired:       gauge("desired_targets", "Targets the view routes to (resolver.Snapshot.Targets of the snapshot the client guards chose)."),
		registered:    gauge("registered_targets", "Targets in the group, as last read or changed."),
		held:          gauge("held", "1 while a guard keeps the group larger than the newest view: the resolver's shrink hold, or a view routing to nothing."),
		pendingDeregs: gauge("pending_deregistrations", "Deregistrations the per-interval cap defers (an alarm while above 0: a view is draining the group)."),
		pendingRegs:   gauge("pending_registrations", "Additions waiting for their slow-start step."),
		unmanaged:     gauge("unmanaged_targets", "Targets in the group muster did not put there, left alone unless own_group."),
		version:       gauge("view_version", "The view version of the last plan."),
		apiErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_tgsync_api_errors_total",
			Help: "Failed cycles: a backend call that failed after the SDK's retries (ELBv2) or at once (HAProxy)."}, []string{"binding"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_tgsync_changes_total",
			Help: "Targets changed, by op (register, reweight, deregister)."}, []string{"binding", "op"}),
	}
	if reg == nil {
		return m, nil
	}
	age := &ageCollector{s: s, desc: prometheus.NewDesc("muster_tgsync_last_sync_age_seconds",
		"Seconds since the binding's last successful cycle (-1: none yet).", []string{"binding"}, nil)}
	for _, c := range []prometheus.Collector{m.desired, m.registered, m.held, m.pendingDeregs, m.pendingRegs, m.unmanaged, m.version, m.apiErrors, m.changes, age} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("tgsync: register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(name string, rep Report, held bool) {
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	m.desired.WithLabelValues(name).Set(float64(rep.Desired))
	m.registered.WithLabelValues(name).Set(float64(rep.Registered))
	m.held.WithLabelValues(name).Set(b(held))
	m.pendingDeregs.WithLabelValues(name).Set(float64(len(rep.Plan.DeferredDeregister)))
	m.pendingRegs.WithLabelValues(name).Set(float64(len(rep.Plan.DeferredRegister)))
	m.unmanaged.WithLabelValues(name).Set(float64(len(rep.Plan.Unmanaged)))
	m.version.WithLabelValues(name).Set(float64(rep.Version))
}

// ageCollector reports each binding's last-sync age at scrape time,
// without waiting for a cycle in progress.
type ageCollector struct {
	s    *Syncer
	desc *prometheus.Desc
}

func (c *ageCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *ageCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.s.cfg.Clock()
	for _, b := range c.s.bindings {
		age := -1.0
		if ns := b.lastSync.Load(); ns != 0 {
			age = now.Sub(time.Unix(0, ns)).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, age, b.Binding.Name)
	}
}
