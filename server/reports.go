package server

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
)

// reportBatch is the body of POST /v1/reports.
type reportBatch struct {
	Reports []evaluator.Report `json:"reports"`
}

// reportsPost ingests a batch of health evidence. Each item is attributed to
// the caller's identity on its own: bad or unattributable items are refused
// and explained, the rest are applied.
//
// Each identity has a bucket of requests and one of items (Limits). A
// caller whose item bucket is empty is refused before its body is read,
// so a flood costs muster neither decoding nor evaluation, and other
// reporters are not slowed; a batch let in is charged in full once
// decoded, leaving the bucket in debt when it was larger than what was
// left, which the refusals that follow repay.
func (s *Server) reportsPost(w http.ResponseWriter, r *http.Request) {
	actor := principal(r)
	key := actor.String()
	if d := s.limits.reportRequests.Take(key, 1); !d.Allowed {
		s.refuseLimited(w, r, d, "report_requests", fmt.Sprintf("%s has sent %d report batches within %s, the most allowed; retry in %d s",
			actor, d.Limit.Max, d.Limit.Window, d.ResetSeconds()))
		return
	}
	if d := s.limits.reportItems.Peek(key); !d.Allowed {
		s.refuseLimited(w, r, d, "report_items", fmt.Sprintf("%s has reported %d items within %s, the most allowed; retry in %d s",
			actor, d.Limit.Max, d.Limit.Window, d.ResetSeconds()))
		return
	}
	// Room for the batch its length suggests (a report takes at least
	// about 60 bytes of JSON), so decoding does not grow the slice
	// from one item, copying it at every doubling.
	b := reportBatch{Reports: make([]evaluator.Report, 0, min(evaluator.MaxBatch, max(r.ContentLength/60, 0)+1))}
	if p := s.decodeReports(w, r, &b); p != nil {
		writeProblem(w, r, p)
		return
	}
	if len(b.Reports) == 0 || len(b.Reports) > evaluator.MaxBatch {
		p := problem(http.StatusUnprocessableEntity, "validation", fmt.Sprintf("a batch holds 1 to %d reports, got %d", evaluator.MaxBatch, len(b.Reports)))
		p.Errors = append(p.Errors, fieldError("reports", "wrong number of items"))
		writeProblem(w, r, p)
		return
	}
	setRateLimit(w.Header(), s.limits.reportItems.Charge(key, len(b.Reports)))
	// The TCP peer is what a self-report is checked against (forwarded
	// headers prove nothing, ADR-15), with the instance credential for an
	// instance that has one.
	ctx := evaluator.WithInstanceCredential(evaluator.WithSourceAddr(r.Context(), sourceAddr(r)), instanceCredential(r))
	res, err := s.cfg.Evaluator.Ingest(ctx, actor, b.Reports)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.auditRefusedEvidence(actor, b.Reports, res)
	// Taken to the replica that keeps each service's evidence (its
	// owner, and the replica offered it during a move): only what was
	// accepted, and without waiting.
	if s.cfg.Forwarder != nil && res.Accepted > 0 {
		reports, services := accepted(b.Reports, res)
		s.cfg.Forwarder.Offer(actor, reports, services)
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) eligibilityGet(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	actor := principal(r)
	// Who may read the service is the registry's rule; that it exists is
	// answered from the in-memory copy of services (Authz), so the
	// verdicts the evaluator holds are served while PostgreSQL is away.
	// A service the copy does not hold (not loaded yet, or
	// created through another replica since its last reload) is looked up
	// in the registry.
	if !registry.CanReadService(actor, name) {
		s.writeError(w, r, &refusal.Error{Kind: registry.ErrForbidden, Check: "authorisation",
			Detail: fmt.Sprintf("%s may not read service %s", actor, name)})
		return
	}
	if ok, err := s.cfg.Authz.ServiceExists(name); err != nil || !ok {
		if _, err := s.cfg.Registry.GetService(r.Context(), actor, name); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	v, err := s.eligibility(r.Context(), name)
	if p := ownerUnreachableProblem(err); p != nil {
		writeProblem(w, r, p)
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func notReadyProblem(err error) *Problem {
	if !errors.Is(err, evaluator.ErrNotReady) {
		return nil
	}
	p := problem(http.StatusServiceUnavailable, "not-ready", "muster is rebuilding its evaluation state after a start; retry in a moment")
	p.retryAfter = 1
	return p
}
