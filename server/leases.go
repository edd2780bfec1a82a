package server

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
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

// renewalBatch is the body of POST /v1/leases/renewals.
type renewalBatch struct {
	Renewals []renewalItem `json:"renewals"`
}

// renewalItem is one lease of a batch: the instance, and the credential
// a single renewal would send in Muster-Instance-Credential (for an
// instance that has one).
type renewalItem struct {
	InstanceID string `json:"instance_id"`
	Credential string `json:"credential,omitempty"`
}

// renewalResults is the answer to POST /v1/leases/renewals: one result
// per lease, in the order asked.
type renewalResults struct {
	Results []registry.RenewalResult `json:"results"`
	// Renewed counts the results renewed.
	Renewed int `json:"renewed"`
}

// decodeRenewals reads a batch of renewals: one JSON object (decodeJSON's
// refusals), then 1 to registry.MaxRenewalBatch leases, each an instance
// id named once (422 otherwise). Nothing is read or changed before it
// succeeds.
func (s *Server) decodeRenewals(w http.ResponseWriter, r *http.Request) ([]registry.LeaseRenewal, *Problem) {
	var b renewalBatch
	if p := s.decodeJSON(w, r, &b); p != nil {
		return nil, p
	}
	out := make([]registry.LeaseRenewal, len(b.Renewals))
	var fe []registry.FieldError
	for i, it := range b.Renewals {
		id, err := uuid.Parse(it.InstanceID)
		if err != nil {
			fe = append(fe, fieldError(fmt.Sprintf("renewals[%d].instance_id", i), fmt.Sprintf("not an instance id: %q", it.InstanceID)))
			continue
		}
		out[i] = registry.LeaseRenewal{ID: id, Credential: registry.PresentedCredential(it.Credential)}
	}
	if len(fe) > 0 {
		p := problem(http.StatusUnprocessableEntity, "validation", "every renewal names an instance by its id")
		p.Errors = fe
		return nil, p
	}
	var re *refusal.Error
	if err := registry.CheckRenewalBatch(out); errors.As(err, &re) {
		return nil, refusalProblem(w, re)
	}
	return out, nil
}

// leaseRenewBatch renews up to registry.MaxRenewalBatch leases in one
// request and one transaction, each decided as PUT
// /v1/instances/{id}/lease decides it; the answer says what became of
// each. The renewal limit is taken once the batch is read (see
// Limits.LeaseRenewals for its cost): refused, every lease it names is
// noted as a renewal refused for load, as a single renewal is.
func (s *Server) leaseRenewBatch(w http.ResponseWriter, r *http.Request) {
	renewals, p := s.decodeRenewals(w, r)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	actor := principal(r)
	if !s.allowRenewals(w, r, actor, renewalBatchCost(len(renewals)), renewals) {
		return
	}
	res, err := s.cfg.Registry.RenewBatch(r.Context(), actor, renewals)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := renewalResults{Results: res}
	for _, x := range res {
		if x.Outcome == registry.RenewalRenewed {
			out.Renewed++
		}
	}
	// Each lease not renewed costs a token of its own, as a single
	// renewal would: a refusal is audited, and a batch of someone else's
	// ids must cost what as many requests would.
	if n := len(res) - out.Renewed; n > 0 {
		setRateLimit(w.Header(), s.limits.renewals.buckets.Charge(actor.String(), n))
	}
	writeJSON(w, http.StatusOK, out)
}
