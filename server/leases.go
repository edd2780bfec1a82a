package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
)

// Leases is the lease reaper's state (registry.Reaper).
type Leases interface {
	Holds() []disbelief.Hold
	InGrace() bool
}

// RemovalHolds lists every gate's held removals (the lease reaper's and
// each reconciliation source's) as the one removal rule sees them: the
// list GET /v1/removal-holds answers, the UI's holds page shows and the
// removal_held alarms are made of.
func RemovalHolds(cfg *Config) []disbelief.Hold {
	var leases, sources []disbelief.Hold
	if cfg.Leases != nil {
		leases = cfg.Leases.Holds()
	}
	if cfg.Reconcile != nil {
		sources = cfg.Reconcile.Holds()
	}
	return disbelief.Merge(leases, sources)
}

// removalHolds is the body of GET /v1/removal-holds.
type removalHolds struct {
	// LeaseGrace: every lease expiry waits, because renewals have not
	// been able to land for a full TTL yet (after a start, readiness or
	// a database outage).
	LeaseGrace bool             `json:"lease_grace"`
	Holds      []disbelief.Hold `json:"holds"`
}

// estateReader refuses identities other than operators and tools: held
// removals describe the whole estate.
func estateReader(w http.ResponseWriter, r *http.Request, what string) bool {
	if p := principal(r); p.Kind != identity.KindOperator && p.Kind != identity.KindTool {
		writeProblem(w, r, problem(http.StatusForbidden, "forbidden", what+" describes the whole estate; it is for operator and tool identities"))
		return false
	}
	return true
}

// removalHoldsGet answers GET /v1/removal-holds from memory (it keeps
// answering while PostgreSQL is away).
func (s *Server) removalHoldsGet(w http.ResponseWriter, r *http.Request) {
	if !estateReader(w, r, "the removal holds list") {
		return
	}
	out := removalHolds{Holds: RemovalHolds(&s.cfg)}
	if s.cfg.Leases != nil {
		out.LeaseGrace = s.cfg.Leases.InGrace()
	}
	writeJSON(w, http.StatusOK, out)
}

// removalConfirmation is the body of POST /v1/removal-holds/confirmations.
type removalConfirmation struct {
	// Gate is the hold's gate: "lease-expiry" or "reconcile/<source>".
	Gate string `json:"gate"`
	// Scope is the hold's scope as the hold names it ("zone az1",
	// "service web", "region", "source k8s/prod").
	Scope  string `json:"scope"`
	Reason string `json:"reason"`
}

// ConfirmRemoval records actor's confirmation that the removals gate holds
// in scope (as Hold.Scope's String names it) are real: the one
// confirmation of every gate, for the API and the UI. The gate's own
// confirmation authorises and audits the attempt, refusals too.
//
// A reconciliation gate's scope is its source (or none: the source as a
// whole) or one of its services: a service's confirmation releases that
// service's held removals only, and its owning team may give it.
func ConfirmRemoval(ctx context.Context, cfg *Config, actor identity.Principal, gate, scope, reason string) (any, error) {
	if source, ok := strings.CutPrefix(gate, reconcile.GatePrefix); ok {
		sc, err := reconcileScope(source, scope)
		if err != nil {
			return nil, err
		}
		if cfg.Reconcile == nil {
			return nil, refusal.New(refusal.NotFound, "", "this muster reconciles no sources")
		}
		return cfg.Reconcile.Confirm(ctx, actor, source, sc, reason)
	}
	sc, err := disbelief.ParseScope(scope)
	if err != nil {
		return nil, &refusal.Error{Kind: refusal.Invalid, Detail: "the scope is not valid", Fields: []refusal.Field{{Field: "scope", Message: err.Error()}}}
	}
	if gate == registry.GateLeaseExpiry {
		return cfg.Registry.ConfirmLeaseExpiry(ctx, actor, sc, reason)
	}
	return nil, &refusal.Error{Kind: refusal.Invalid, Detail: "the gate is not valid", Fields: []refusal.Field{{Field: "gate",
		Message: fmt.Sprintf("%q is neither %q nor %q followed by a source", gate, registry.GateLeaseExpiry, reconcile.GatePrefix)}}}
}

// reconcileScope reads the scope of a confirmation of source's held
// removals: none or "source <source>" for the source as a whole, or
// "service <name>" for one of its services. Anything else is refused as
// invalid before anything is read or written.
func reconcileScope(source, scope string) (disbelief.Scope, error) {
	whole := disbelief.Scope{Kind: disbelief.Source, Name: source}
	if strings.TrimSpace(scope) == "" {
		return whole, nil
	}
	bad := func(msg string) error {
		return &refusal.Error{Kind: refusal.Invalid, Detail: "the scope is not one this reconciliation source holds",
			Fields: []refusal.Field{{Field: "scope", Message: msg}}}
	}
	sc, err := disbelief.ParseScope(scope)
	switch {
	case err != nil:
		return disbelief.Scope{}, bad(err.Error())
	case sc.Kind == disbelief.Source && sc.Name != source:
		return disbelief.Scope{}, bad(fmt.Sprintf("%q is another source's scope; this gate's source is %q", sc.String(), whole.String()))
	case sc.Kind == disbelief.Service && !registry.ValidName(sc.Name):
		return disbelief.Scope{}, bad(fmt.Sprintf("%q is not a service name", sc.Name))
	case sc.Kind != disbelief.Source && sc.Kind != disbelief.Service:
		return disbelief.Scope{}, bad(fmt.Sprintf("a reconciliation source holds in %q or in one of its services (\"service <name>\"), not in a %s", whole.String(), sc.Kind))
	}
	return sc, nil
}

// removalConfirm answers POST /v1/removal-holds/confirmations
// (ConfirmRemoval).
func (s *Server) removalConfirm(w http.ResponseWriter, r *http.Request) {
	var body removalConfirmation
	if p := s.decodeJSON(w, r, &body); p != nil {
		writeProblem(w, r, p)
		return
	}
	kind, target := "removal-hold", body.Gate+" "+body.Scope
	if !s.limitWrite(w, r, "removals", "removal.confirm", kind, truncateTarget(target)) {
		return
	}
	c, err := ConfirmRemoval(r.Context(), &s.cfg, principal(r), body.Gate, body.Scope, body.Reason)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, c)
}

// truncateTarget bounds an audit target taken from a request body.
func truncateTarget(s string) string {
	if len(s) > 300 {
		return s[:300]
	}
	return s
}

// confirmLeases records a lease expiry confirmation in scope (the path
// POST /v1/leases/expiry-confirmations keeps).
func (s *Server) confirmLeases(w http.ResponseWriter, r *http.Request, scope disbelief.Scope, reason string) {
	kind, target := string(scope.Kind), scope.Name
	if scope.Kind == disbelief.Region {
		target = "region:" + s.cfg.Registry.Region()
	}
	if !s.limitWrite(w, r, "leases", "lease.expiry.confirm", kind, target) {
		return
	}
	c, err := s.cfg.Registry.ConfirmLeaseExpiry(r.Context(), principal(r), scope, reason)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, c)
}

// confirmSource records a confirmation of a reconciliation source's held
// removals (the path POST /v1/reconcile/sources/{kind}/{name}/confirm
// keeps).
func (s *Server) confirmSource(w http.ResponseWriter, r *http.Request, source, reason string) {
	if s.cfg.Reconcile == nil {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "this muster reconciles no sources"))
		return
	}
	if !s.limitWrite(w, r, "reconcile", "reconcile.confirm", "reconcile-source", source) {
		return
	}
	c, err := s.cfg.Reconcile.Confirm(r.Context(), principal(r), source, disbelief.Scope{Kind: disbelief.Source, Name: source}, reason)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, c)
}

// leaseExpiryStatus is the body of GET /v1/leases/expiry: the lease
// gate's part of GET /v1/removal-holds.
type leaseExpiryStatus struct {
	Grace bool             `json:"grace"`
	Holds []disbelief.Hold `json:"holds"`
}

// leaseExpiryGet shows whether lease expiry is in its grace or held, and
// by how much. Operators and tools only.
func (s *Server) leaseExpiryGet(w http.ResponseWriter, r *http.Request) {
	if !estateReader(w, r, "lease expiry") {
		return
	}
	out := leaseExpiryStatus{Holds: []disbelief.Hold{}}
	if s.cfg.Leases != nil {
		out.Grace = s.cfg.Leases.InGrace()
		out.Holds = append(out.Holds, s.cfg.Leases.Holds()...)
	}
	writeJSON(w, http.StatusOK, out)
}

// leaseConfirmation is the body of POST /v1/leases/expiry-confirmations,
// kept for the clients written before POST /v1/removal-holds/confirmations.
type leaseConfirmation struct {
	// Service is the scope; empty or absent for the whole region.
	Service string `json:"service"`
	Reason  string `json:"reason"`
}

// leaseExpiryConfirm is POST /v1/removal-holds/confirmations for the
// lease gate in a service or the region.
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
	scope := disbelief.Scope{Kind: disbelief.Region}
	if body.Service != "" {
		scope = disbelief.Scope{Kind: disbelief.Service, Name: body.Service}
	}
	s.confirmLeases(w, r, scope, body.Reason)
}

// holdAlarms are the removal_held alarms, one per hold.
func holdAlarms(cfg *Config) []assembler.Alarm {
	var out []assembler.Alarm
	for _, h := range RemovalHolds(cfg) {
		out = append(out, h.Alarm())
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
