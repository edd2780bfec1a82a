package server

import (
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/federation"
)

// Regions is the read-only aggregate of the peer regions
// (federation.Aggregate).
type Regions interface {
	Regions() []federation.PeerStatus
	View(region, service string) (federation.RemoteView, time.Duration, bool)
	// Granted reports whether the peer region granted caller its
	// service; Peers lists the peer regions in configuration order.
	Granted(region, service, caller string) bool
	Peers() []string
	// Revoked is closed when a peer withdraws a grant it had given.
	Revoked() <-chan struct{}
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

// remoteViewBody is GET /v1/regions/{region}/views/{service}'s answer.
type remoteViewBody struct {
	Region string `json:"region"`
	// AgeSeconds is how old the copy may be: the time since the peer
	// last answered.
	AgeSeconds float64   `json:"age_seconds"`
	ReceivedAt time.Time `json:"received_at"`
	// View is the peer's view as it published it.
	View any `json:"view"`
	// ServedVersion is the version this region serves it under: the
	// peer's, plus the offset a regression of the peer's versions left.
	ServedVersion uint64 `json:"served_version"`
	// Regressed is set while the peer's versions are below those held
	// before (its database restored).
	Regressed *federation.Regression `json:"regressed,omitempty"`
}

// remoteViewGet answers GET /v1/regions/{region}/views/{service} from
// the aggregate: the peer region's view of one of its services as this
// region holds it, with its age. For operators and tools (inspection;
// cross-region resolution for workloads comes through /v1/resolve in a
// later slice).
func (s *Server) remoteViewGet(w http.ResponseWriter, r *http.Request) {
	if !estateReader(w, r, "a peer region's view") {
		return
	}
	region, service := chi.URLParam(r, "region"), chi.URLParam(r, "service")
	if s.cfg.Regions == nil {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "this muster follows no peer region"))
		return
	}
	v, age, ok := s.cfg.Regions.View(region, service)
	if !ok {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "no view of "+service+" from peer region "+region+" is held"))
		return
	}
	writeJSON(w, http.StatusOK, remoteViewBody{Region: v.Region, AgeSeconds: age.Seconds(), ReceivedAt: v.ReceivedAt, View: v.View,
		ServedVersion: v.Served(), Regressed: v.Regressed})
}
