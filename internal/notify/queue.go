package notify

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// delivery is one alert waiting for one target.
type delivery struct {
	// id names the alert at its target: the alarm's key and its team
	// label (an alarm whose team changed is two alerts).
	id       string
	key      string
	alarm    Alarm
	team     string
	startsAt time.Time
	endsAt   time.Time // zero: firing
	attempts int
	next     time.Time // not before
}

// queue is one target's deliveries, oldest first, at most one per alert.
type queue struct {
	items []*delivery
}

// put queues d, replacing a delivery of the same alert (the newer state
// wins, tried at once); when the queue holds size deliveries already, the
// oldest is dropped and returned.
func (q *queue) put(d *delivery, size int) (dropped *delivery) {
	if i := slices.IndexFunc(q.items, func(x *delivery) bool { return x.id == d.id }); i >= 0 {
		q.items = slices.Delete(q.items, i, i+1)
	}
	if len(q.items) >= size {
		dropped = q.items[0]
		q.items = slices.Delete(q.items, 0, 1)
	}
	q.items = append(q.items, d)
	return dropped
}

// due returns up to n deliveries whose time has come, oldest first.
func (q *queue) due(now time.Time, n int) []*delivery {
	var out []*delivery
	for _, d := range q.items {
		if len(out) == n {
			break
		}
		if !d.next.After(now) {
			out = append(out, d)
		}
	}
	return out
}

// remove takes d out of the queue (if put has not replaced it already).
func (q *queue) remove(d *delivery) {
	if i := slices.Index(q.items, d); i >= 0 {
		q.items = slices.Delete(q.items, i, i+1)
	}
}

type metrics struct {
	sent       *prometheus.CounterVec
	failures   *prometheus.CounterVec
	deadLetter *prometheus.CounterVec
	queued     *prometheus.GaugeVec
	firing     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_alerts_sent_total", Help: "Alerts delivered to a notification target (a team's, or platform), by status (firing, resolved).",
		}, []string{"target", "status"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_alerts_send_failures_total", Help: "Failed POSTs of alerts to a notification target (each is retried with backoff).",
		}, []string{"target"}),
		deadLetter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_alerts_dead_letter_total", Help: "Alerts given up on, by target and reason (attempts: every retry failed; queue_full: the target's queue was full).",
		}, []string{"target", "reason"}),
		queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "muster_alerts_queued", Help: "Alerts waiting for delivery to a notification target.",
		}, []string{"target"}),
		firing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_alerts_firing", Help: "Alarms the notifier holds as firing (sent and not yet resolved).",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.sent, m.failures, m.deadLetter, m.queued, m.firing} {
			if err := reg.Register(c); err != nil {
				return metrics{}, err
			}
		}
	}
	return m, nil
}

// forget drops every queued delivery of the alert key: another replica
// sends it now, and a late copy from here would be a duplicate.
func (n *Notifier) forget(key string) {
	for name, q := range n.queues {
		q.items = slices.DeleteFunc(q.items, func(d *delivery) bool { return d.key == key })
		n.metrics.queued.WithLabelValues(name).Set(float64(len(q.items)))
	}
}
