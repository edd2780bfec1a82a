package app

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/notify"
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/server"
)

// WorkerNotify sends the alarms to their owning teams' notification
// targets and the platform's (internal/notify).
const WorkerNotify = "notify"

// buildNotifier builds the notifier from Config.Notify: its alarms are
// the flap quarantines in force (the evaluator's) and what GET
// /v1/alarms lists (from svc's sources), all read from memory; a
// service's team is its owner in the authorisation copy; its Logger and
// Registerer are the app's, its Region the app's unless set. Its clock
// stays the wall clock unless set: Alertmanager reads startsAt and endsAt
// against its own.
func (a *App) buildNotifier(cfg Config, svc server.Config) error {
	if cfg.Notify == nil {
		return nil
	}
	nc := *cfg.Notify
	listed := server.AlarmsOf(svc)
	reads := a.OwnerReads
	nc.Alarms = func() []notify.Alarm {
		// Every service's quarantines, each from its owner: the replica
		// that sends the region's alarms owns only some of them. An owner
		// that does not answer is stood in for by its last answer for a
		// while (ownerread.DefaultHoldFor), so its alerts are not resolved
		// only because it was away for a moment. Asking takes at most the
		// reader's timeout (1 s) per round.
		ctx, cancel := context.WithTimeout(context.Background(), ownerread.DefaultTimeout+100*time.Millisecond)
		qs, _ := reads.QuarantinesHeld(ctx)
		cancel()
		open := listed()
		out := make([]notify.Alarm, 0, len(qs)+len(open))
		for _, q := range qs {
			out = append(out, notify.Alarm{Kind: evaluator.AlarmInstanceQuarantined, Service: q.Service, Instance: q.InstanceID.String(), Zone: q.Zone, Since: q.At,
				Summary: fmt.Sprintf("instance %s (%s:%d) of %s is quarantined for flapping until %s", q.InstanceID, q.Address, q.Port, q.Service, q.Until.UTC().Format(time.RFC3339)),
				Detail:  q.Detail()})
		}
		for _, al := range open {
			// The quarantines are sent above with their instance; an
			// owner that did not answer is a moment's state of this
			// replica's requests, not a condition to page on.
			if al.Kind == evaluator.AlarmInstanceQuarantined || al.Kind == server.AlarmOwnerUnreachable {
				continue
			}
			out = append(out, notify.Alarm{Kind: al.Kind, Service: al.Service, Zone: al.Zone, Since: al.Since, Detail: al.Detail})
		}
		return out
	}
	nc.Owner = a.Authz.Owner
	if nc.Region == "" {
		nc.Region = cfg.Region
	}
	nc.Logger, nc.Registerer = a.log, a.Metrics
	n, err := notify.New(nc)
	if err != nil {
		return err
	}
	a.Notifier = n
	return nil
}

// alarmsOpen exports the open alarms GET /v1/alarms lists, counted by
// kind, as muster_alarms_open: the alert rules
// (deploy/prometheus/muster-alerts.rules.yml) fire on the conditions
// that have no metric of their own (a tripped guard, a withdrawal budget
// spent) from it.
type alarmsOpen struct {
	desc   *prometheus.Desc
	alarms func() []assembler.Alarm
}

func newAlarmsOpen(alarms func() []assembler.Alarm) *alarmsOpen {
	return &alarmsOpen{alarms: alarms, desc: prometheus.NewDesc("muster_alarms_open",
		"Open alarms by kind, as GET /v1/alarms lists them (kinds with none are absent).", []string{"kind"}, nil)}
}

func (c *alarmsOpen) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *alarmsOpen) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	for _, a := range c.alarms() {
		n[a.Kind]++
	}
	for kind, v := range n {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), kind)
	}
}
