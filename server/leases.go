package server

import (
	"fmt"
	"net/http"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
)

// AlarmLeaseExpirySuppressed is raised while a disbelief threshold holds
// lease expiry in a scope (the region, or one service).
const AlarmLeaseExpirySuppressed = "lease_expiry_suppressed"

// Leases is the lease reaper's state (registry.Reaper).
type Leases interface {
	Suppressions() []registry.Suppression
	InGrace() bool
}

// leaseExpiryStatus is the body of GET /v1/leases/expiry.
type leaseExpiryStatus struct {
	// Grace: every expiry waits, because renewals have not been able to
	// land for a full TTL yet (after a start or a database outage).
	Grace        bool                   `json:"grace"`
	Suppressions []registry.Suppression `json:"suppressions"`
}

// leaseExpiryGet shows whether lease expiry is in its grace or held by a
// disbelief threshold, and by how much. Operators and tools only.
func (s *Server) leaseExpiryGet(w http.ResponseWriter, r *http.Request) {
	if p := principal(r); p.Kind != identity.KindOperator && p.Kind != identity.KindTool {
		writeProblem(w, r, problem(http.StatusForbidden, "forbidden", "lease expiry describes the whole estate; it is for operator and tool identities"))
		return
	}
	out := leaseExpiryStatus{Suppressions: []registry.Suppression{}}
	if s.cfg.Leases != nil {
		out.Grace = s.cfg.Leases.InGrace()
		out.Suppressions = append(out.Suppressions, s.cfg.Leases.Suppressions()...)
	}
	writeJSON(w, http.StatusOK, out)
}

// leaseConfirmation is the body of POST /v1/leases/expiry-confirmations.
type leaseConfirmation struct {
	// Service is the scope; empty or absent for the whole region.
	Service string `json:"service"`
	Reason  string `json:"reason"`
}

// leaseExpiryConfirm records an operator's confirmation that the leases
// held in a scope really ran out, releasing them to the reaper.
func (s *Server) leaseExpiryConfirm(w http.ResponseWriter, r *http.Request) {
	var body leaseConfirmation
	if p := s.decodeJSON(w, r, &body); p != nil {
		writeProblem(w, r, p)
		return
	}
	if body.Service != "" && !registry.ValidName(body.Service) {
		writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", fmt.Sprintf("%q is not a service name", body.Service)))
		return
	}
	// Audited under the same target as the registry audits the attempt.
	kind, target := "service", body.Service
	if target == "" {
		kind, target = "region", "region:"+s.cfg.Registry.Region()
	}
	if !s.limitWrite(w, r, "leases", "lease.expiry.confirm", kind, target) {
		return
	}
	c, err := s.cfg.Registry.ConfirmLeaseExpiry(r.Context(), principal(r), body.Service, body.Reason)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, c)
}

// leaseAlarms turns the reaper's suppressions into alarms.
func leaseAlarms(cfg *Config) []assembler.Alarm {
	if cfg.Leases == nil {
		return nil
	}
	var out []assembler.Alarm
	for _, sup := range cfg.Leases.Suppressions() {
		out = append(out, assembler.Alarm{Kind: AlarmLeaseExpirySuppressed, Service: sup.Service, Since: sup.Since, Detail: sup.Detail})
	}
	return out
}
