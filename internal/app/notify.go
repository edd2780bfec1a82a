package app

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/notify"
	"github.com/musterhq/muster/internal/relay"
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
	ev := a.Evaluator
	nc.Alarms = func() []notify.Alarm {
		// This replica's quarantines: it sends only the alarms of the
		// services it owns (Sends, below), whose evidence comes to it.
		qs := ev.QuarantineAlarms()
		open := listed()
		out := make([]notify.Alarm, 0, len(qs)+len(open))
		for _, q := range qs {
			out = append(out, notify.Alarm{Kind: evaluator.AlarmInstanceQuarantined, Service: q.Service, Instance: q.InstanceID.String(), Zone: q.Zone, Since: q.At,
				Summary: fmt.Sprintf("instance %s (%s:%d) of %s is quarantined for flapping until %s", q.InstanceID, q.Address, q.Port, q.Service, q.Until.UTC().Format(time.RFC3339)),
				Detail:  q.Detail()})
		}
		for _, al := range open {
			// Quarantines are sent above, with their instance and flap
			// history. An owner that did not answer a read is a moment's
			// state of this replica's requests, not a condition to page
			// on.
			if al.Kind == evaluator.AlarmInstanceQuarantined || al.Kind == server.AlarmOwnerUnreachable {
				continue
			}
			n := notify.Alarm{Kind: al.Kind, Service: al.Service, Zone: al.Zone, Since: al.Since, Detail: al.Detail}
			if replicaAlarms[al.Kind] {
				n.Replica = cfg.Replica
			}
			out = append(out, n)
		}
		return out
	}
	// One replica of the region sends each alarm: the owner of its
	// service's shard, or of RegionAlarmsOwnershipKey's for an
	// estate-wide one, so a webhook hears of it once, and a replica's own
	// condition from that replica. When the sender dies its shards move
	// within the lease bound (9 s) and the new owner sends at its next
	// round.
	nc.Sends = func(al notify.Alarm) bool {
		key := RegionAlarmsOwnershipKey
		switch {
		case al.Replica != "":
			return true
		case al.Service != "":
			key = al.Service
		}
		_, ok := a.Ownership.Owns(key)
		return ok
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

// RegionAlarmsOwnershipKey is what the region's estate-wide alarms hash
// onto the shards as: the owner of that shard sends them.
const RegionAlarmsOwnershipKey = "alarms:region"

// replicaAlarms are the kinds that are one replica's own condition, not
// the region's: each replica sends its own, labelled with its name.
var replicaAlarms = map[string]bool{
	server.AlarmDatabaseUnreachable: true,
	AlarmClockSkew:                  true,
	AlarmPeerTrustUpgrade:           true,
	relay.AlarmRelayBehind:          true,
	relay.AlarmRelayCutOff:          true,
	relay.AlarmRelayForged:          true,
	relay.AlarmViewOutsideTenure:    true,
	forward.AlarmForwardRefused:     true,
	forward.AlarmEvidenceRefused:    true,
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
