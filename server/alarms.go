package server

import (
	"net/http"

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
