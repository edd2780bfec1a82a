package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/musterhq/muster/assembler"
	"github.com/musterhq/muster/identity"
)

// alarmList is the body of GET /v1/alarms.
type alarmList struct {
	Alarms []assembler.Alarm `json:"alarms"`
}

// alarmsGet lists the open alarms. Estate-wide information: operators and
// tools only.
func (s *Server) alarmsGet(w http.ResponseWriter, r *http.Request) {
	p := principal(r)
	if p.Kind != identity.KindOperator && p.Kind != identity.KindTool {
		writeProblem(w, r, problem(http.StatusForbidden, "forbidden", "the alarms describe the whole estate; they are for operator and tool identities"))
		return
	}
	alarms := s.allAlarms()
	if alarms == nil {
		alarms = []assembler.Alarm{}
	}
	writeJSON(w, http.StatusOK, alarmList{Alarms: alarms})
}

// AlarmDatabaseUnreachable is open while PostgreSQL does not answer this
// replica: writes answer 503, views are served from memory.
const AlarmDatabaseUnreachable = "database_unreachable"

// databaseAlarm is the database_unreachable alarm while the database is
// down.
func (s *Server) databaseAlarm() (assembler.Alarm, bool) {
	db := s.cfg.Database
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
