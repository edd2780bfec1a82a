package server

import (
	"net/http"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/relay"
)

// Replicas is the region's shard ownership as this replica last read it
// (ownership.Manager).
type Replicas interface {
	Region() ownership.RegionStatus
	Alarms() []assembler.Alarm
	// EvidenceOwner is the replica that evaluates service's evidence, ""
	// while its shard has no live owner (GET /v1/evidence/routes).
	EvidenceOwner(service string) string
}

// Relay is the relay from peer replicas (relay.Relay).
type Relay interface {
	Status() []relay.PeerStatus
	// Alarms are relay.AlarmRelayBehind, per peer not followed, and
	// relay.AlarmRelayCutOff, per peer whose services are not current here.
	Alarms() []assembler.Alarm
}

// replicasBody is GET /v1/replicas's answer: the ownership reading and
// the relay from each peer followed.
type replicasBody struct {
	ownership.RegionStatus
	// Relay lists the peers this replica follows (none without the
	// region's signing key).
	Relay []relay.PeerStatus `json:"relay"`
	// EpochsLeft is the region's version epochs left.
	EpochsLeft *uint64 `json:"epochs_left,omitempty"`
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
	body := replicasBody{RegionStatus: s.cfg.Replicas.Region(), Relay: []relay.PeerStatus{}}
	if s.cfg.Relay != nil {
		body.Relay = append(body.Relay, s.cfg.Relay.Status()...)
	}
	if s.cfg.EpochsLeft != nil {
		n := s.cfg.EpochsLeft()
		body.EpochsLeft = &n
	}
	writeJSON(w, http.StatusOK, body)
}
