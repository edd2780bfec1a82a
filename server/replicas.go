package server

import (
	"net/http"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/ownership"
)

// Replicas is the region's shard ownership as this replica last read it
// (ownership.Manager).
type Replicas interface {
	Region() ownership.RegionStatus
	Alarms() []assembler.Alarm
}

// replicasGet answers GET /v1/replicas from memory: the live replicas,
// the shards each holds, the shards no one holds, and this replica's own
// tenures. Operators and tools only.
func (s *Server) replicasGet(w http.ResponseWriter, r *http.Request) {
	if !estateReader(w, r, "the replica list") {
		return
	}
	if s.cfg.Replicas == nil {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "this muster keeps no shard ownership"))
		return
	}
	writeJSON(w, http.StatusOK, s.cfg.Replicas.Region())
}
