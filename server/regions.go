package server

import (
	"net/http"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/federation"
)

// Regions is the read-only aggregate of the peer regions
// (federation.Aggregate).
type Regions interface {
	Regions() []federation.PeerStatus
	// Alarms are federation.AlarmPeerStale, per peer region not reached.
	Alarms() []assembler.Alarm
}

// regionsBody is GET /v1/regions's answer.
type regionsBody struct {
	// Region is this muster's region.
	Region string `json:"region"`
	// Peers lists the peer regions followed (none configured: empty).
	Peers []federation.PeerStatus `json:"peers"`
}

// regionsGet answers GET /v1/regions from memory: each peer region
// followed, its link and how old this region's copy of it may be.
// Operators (any role) and tools only, as GET /v1/replicas.
func (s *Server) regionsGet(w http.ResponseWriter, r *http.Request) {
	if !estateReader(w, r, "the peer region list") {
		return
	}
	body := regionsBody{Region: s.cfg.Region, Peers: []federation.PeerStatus{}}
	if s.cfg.Regions != nil {
		body.Peers = append(body.Peers, s.cfg.Regions.Regions()...)
	}
	writeJSON(w, http.StatusOK, body)
}
