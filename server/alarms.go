package server

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/evaluator"
)

// alarmList is the body of GET /v1/alarms.
type alarmList struct {
	Alarms []assembler.Alarm `json:"alarms"`
	// Incomplete says a replica that owns services did not answer for
	// their quarantines (each is named by an owner_unreachable alarm):
	// the list lacks them, it does not say they have none.
	Incomplete bool `json:"incomplete"`
}

// alarmsGet lists the open alarms. Estate-wide information: operators and
// tools only.
func (s *Server) alarmsGet(w http.ResponseWriter, r *http.Request) {
	if !estateReader(w, r, "the alarm list") {
		return
	}
	alarms := allAlarms(r.Context(), &s.cfg)
	if alarms == nil {
		alarms = []assembler.Alarm{}
	}
	incomplete := slices.ContainsFunc(alarms, func(a assembler.Alarm) bool { return a.Kind == AlarmOwnerUnreachable })
	writeJSON(w, http.StatusOK, alarmList{Alarms: alarms, Incomplete: incomplete})
}

// AlarmDatabaseUnreachable is open while PostgreSQL does not answer this
// replica: writes answer 503, views are served from memory.
const AlarmDatabaseUnreachable = "database_unreachable"

// databaseAlarm is the database_unreachable alarm while the database is
// down.
func databaseAlarm(cfg *Config) (assembler.Alarm, bool) {
	db := cfg.Database
	if db == nil || db.Up() {
		return assembler.Alarm{}, false
	}
	since := db.DownSince()
	detail := fmt.Sprintf("PostgreSQL has not answered this replica since %s", since.UTC().Format(time.RFC3339))
	if err := db.Err(); err != nil {
		detail += " (" + err.Error() + ")"
	}
	detail += "; writes answer 503 database-unavailable, views are served from memory, reports are held in memory"
	return assembler.Alarm{Kind: AlarmDatabaseUnreachable, Since: since, Detail: detail}, true
}

// Alarms lists every open alarm, as GET /v1/alarms does: the guard's,
// the shift-backs', the lease reaper's, the database's, the probers' and
// those of rows written outside muster.
func (s *Server) Alarms() []assembler.Alarm { return allAlarms(context.Background(), &s.cfg) }

// AlarmsOf returns the list of open alarms a server built on cfg answers
// GET /v1/alarms with, from cfg's sources (Alarms, Shifts, Leases,
// Database, Probers). The UI's banner is given it, so it shows the same
// list without needing the server that mounts it.
func AlarmsOf(cfg Config) func() []assembler.Alarm {
	return func() []assembler.Alarm { return allAlarms(context.Background(), &cfg) }
}

// The quarantines are asked of their owners (Config.Reads), each within
// a second: a caller without a deadline of its own waits at most that.
func allAlarms(ctx context.Context, cfg *Config) []assembler.Alarm {
	out := cfg.Alarms.Alarms()
	if cfg.Reads != nil {
		now := time.Now
		if cfg.Now != nil {
			now = cfg.Now
		}
		out = append(out, quarantineAlarms(ctx, cfg.Reads, now())...)
	}
	if cfg.Shifts != nil {
		out = append(out, cfg.Shifts.Alarms()...)
	}
	out = append(out, holdAlarms(cfg)...)
	if a, ok := databaseAlarm(cfg); ok {
		out = append(out, a)
	}
	if cfg.Reconcile != nil {
		out = append(out, cfg.Reconcile.Alarms()...)
	}
	if cfg.Replicas != nil {
		out = append(out, cfg.Replicas.Alarms()...)
	}
	if cfg.Relay != nil {
		out = append(out, cfg.Relay.Alarms()...)
	}
	// The forwarder's: peers that refused evidence (forward.Forwarder).
	if f, ok := cfg.Forwarder.(interface{ Alarms() []assembler.Alarm }); ok {
		out = append(out, f.Alarms()...)
	}
	if cfg.RoutingControls != nil {
		out = append(out, cfg.RoutingControls.Alarms()...)
	}
	if cfg.Regions != nil {
		out = append(out, cfg.Regions.Alarms()...)
	}
	if cfg.Tampering != nil {
		out = append(out, cfg.Tampering()...)
	}
	if cfg.ReplicaAlarms != nil {
		out = append(out, cfg.ReplicaAlarms()...)
	}
	if cfg.Probers != nil {
		for _, a := range cfg.Probers.ProberAlarms() {
			out = append(out, a.Alarm())
		}
	}
	// The evaluator's flap quarantines in force, when they are not asked
	// of their owners (above): the notifier sends them to the owning
	// team, so the list (and muster_alarms_open, and the overview) names
	// them too.
	if q, ok := cfg.Probers.(interface {
		QuarantineAlarms() []evaluator.QuarantineAlarm
	}); ok && cfg.Reads == nil {
		for _, a := range q.QuarantineAlarms() {
			out = append(out, assembler.Alarm{Kind: evaluator.AlarmInstanceQuarantined, Service: a.Service, Zone: a.Zone,
				Instance: a.InstanceID.String(), Since: a.At, Detail: a.Detail()})
		}
	}
	slices.SortStableFunc(out, func(a, b assembler.Alarm) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Service, b.Service), cmp.Compare(a.Zone, b.Zone), cmp.Compare(a.Instance, b.Instance))
	})
	return out
}
