package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/musterhq/muster/internal/registry"
)

// MaxEvidenceRouteServices bounds the services one GET
// /v1/evidence/routes names, so its URL stays within what proxies pass.
const MaxEvidenceRouteServices = 200

// evidenceRoutes is GET /v1/evidence/routes's answer.
type evidenceRoutes struct {
	// Self is the replica that answered. A reporter learns which of the
	// URLs it was configured with is which replica by asking each, and
	// never sends its token to an address it was told by the answer.
	Self string `json:"self"`
	// At is the ownership reading the owners come from.
	At time.Time `json:"at"`
	// Owners maps each service asked about to the replica that evaluates
	// its evidence; "" while the service's shard has no live owner (any
	// replica takes the evidence then).
	Owners map[string]string `json:"owners"`
	// RefreshSeconds is how often the owners are worth asking again:
	// ownership is read every round and moves as replicas come and go.
	RefreshSeconds int `json:"refresh_seconds"`
}

// evidenceRoutesGet answers GET /v1/evidence/routes?service=a&service=b
// from memory: which replica evaluates each service's evidence. Any
// replica takes any report and forwards it to its service's owner; a
// reporter that sends each service's reports to that owner spares the
// region the hop (its decoding, signing and a second lookup), which is
// what lets a region's evidence capacity grow with its replicas. The
// answer is a hint, never a rule: a report sent to the wrong replica, or
// one that lost the shard since, is forwarded as before.
//
// Any authenticated identity may ask: a name's owner follows from the
// name's hash alone, so the answer says nothing about whether the
// service exists, and it carries replica ids, not addresses.
func (s *Server) evidenceRoutesGet(w http.ResponseWriter, r *http.Request) {
	names := r.URL.Query()["service"]
	if len(names) == 0 || len(names) > MaxEvidenceRouteServices {
		p := problem(http.StatusBadRequest, "bad-parameter", fmt.Sprintf("name 1 to %d services with service=, got %d", MaxEvidenceRouteServices, len(names)))
		p.Errors = append(p.Errors, fieldError("service", "wrong number of services"))
		writeProblem(w, r, p)
		return
	}
	for _, n := range names {
		if !registry.ValidName(n) {
			p := problem(http.StatusBadRequest, "bad-parameter", fmt.Sprintf("%q is not a service name", n))
			p.Errors = append(p.Errors, fieldError("service", "not a service name"))
			writeProblem(w, r, p)
			return
		}
	}
	out := evidenceRoutes{Owners: make(map[string]string, len(names)), RefreshSeconds: 10}
	for _, n := range names {
		out.Owners[n] = ""
	}
	if s.cfg.Replicas != nil {
		region := s.cfg.Replicas.Region()
		out.Self, out.At = region.Self, region.At
		for _, n := range names {
			out.Owners[n] = s.cfg.Replicas.EvidenceOwner(n)
		}
	}
	writeJSON(w, http.StatusOK, out)
}
