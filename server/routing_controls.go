package server

import (
	"net/http"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/routingcontrol"
)

// RoutingControls are the out-of-band region routing controls this
// replica reads (routingcontrol.Controls; ADR-14).
type RoutingControls interface {
	Status() routingcontrol.Status
	// Alarms are routing_control_stale and routing_control_all_off.
	Alarms() []assembler.Alarm
}

// routingControlsGet answers GET /v1/routing-controls from memory: the
// source, its last reading, whether the controls are stale, and each
// region's control with since when. Operators (viewers included) and
// tools, as GET /v1/replicas.
func (s *Server) routingControlsGet(w http.ResponseWriter, r *http.Request) {
	if !estateReader(w, r, "the routing controls") {
		return
	}
	if s.cfg.RoutingControls == nil {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "this muster reads no routing controls (--routing-control)"))
		return
	}
	writeJSON(w, http.StatusOK, s.cfg.RoutingControls.Status())
}
