package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/internal/preview"
	"github.com/musterhq/muster/internal/registry"
)

// OwnerReads answers reads of evaluator state from the replica that owns
// each service (ownerread.Reader): only the owner evaluates a service's
// evidence, so this replica's evaluator knows nothing of the others'.
type OwnerReads interface {
	// Eligibility is a service's verdicts from its owner; an owner that
	// does not answer is an *ownerread.OwnerUnreachableError.
	Eligibility(ctx context.Context, service string) (evaluator.ServiceEligibility, error)
	// Quarantines are the region's quarantines in force, and the
	// replicas that did not answer (theirs are missing).
	Quarantines(ctx context.Context) ([]evaluator.QuarantineAlarm, []string)
	// Answers is whether this replica answers a peer for service.
	Answers(service string) bool
	// LocalQuarantines and LocalStats are what this replica answers a
	// peer's list with: the services it answers for.
	LocalQuarantines() []evaluator.QuarantineAlarm
	LocalStats() ([]eligibility.ServiceStats, time.Time, error)
	// PreviewContract replays a proposed contract on the service's
	// owner; an owner that does not answer is an
	// *ownerread.OwnerUnreachableError.
	PreviewContract(ctx context.Context, p registry.ContractPreview) (preview.Result, error)
}

// AlarmOwnerUnreachable is listed while a replica that owns services did
// not answer this replica's request for their quarantines: the list is
// incomplete, and says whose part is missing.
const AlarmOwnerUnreachable = "owner_unreachable"

// eligibility answers a service's verdicts: from its owner when
// OwnerReads is set, else from this replica's evaluator.
func (s *Server) eligibility(ctx context.Context, service string) (evaluator.ServiceEligibility, error) {
	if s.cfg.Reads == nil {
		return s.cfg.Evaluator.ServiceEligibility(service)
	}
	return s.cfg.Reads.Eligibility(ctx, service)
}

// ownerUnreachableProblem is the 503 of a read whose owner did not
// answer: the verdicts are not known here, and saying "unknown" instead
// would mislead.
func ownerUnreachableProblem(err error) *Problem {
	var oe *ownerread.OwnerUnreachableError
	if !errors.As(err, &oe) {
		return nil
	}
	p := problem(http.StatusServiceUnavailable, "owner-unavailable", fmt.Sprintf(
		"replica %s owns service %s and alone holds its evaluation state (verdicts, quarantines, recent evidence), and it did not answer this replica (%v); "+
			"nothing is known of it here: retry after Retry-After (if %s is down, another replica takes its shards within 9 s)",
		oe.Owner, oe.Service, oe.Err, oe.Owner))
	p.retryAfter = 1
	p.Extensions = map[string]any{"owner": oe.Owner}
	return p
}

// quarantineAlarms lists the region's quarantines in force as alarms,
// with an owner_unreachable alarm per replica whose part is missing.
func quarantineAlarms(ctx context.Context, reads OwnerReads, now time.Time) []assembler.Alarm {
	qs, unanswered := reads.Quarantines(ctx)
	out := make([]assembler.Alarm, 0, len(qs)+len(unanswered))
	for _, q := range qs {
		out = append(out, assembler.Alarm{Kind: evaluator.AlarmInstanceQuarantined, Service: q.Service, Zone: q.Zone,
			Instance: q.InstanceID.String(), Since: q.At, Detail: q.Detail()})
	}
	for _, id := range unanswered {
		out = append(out, assembler.Alarm{Kind: AlarmOwnerUnreachable, Since: now, Detail: fmt.Sprintf(
			"replica %s holds shards and did not answer for the quarantines of its services: they are missing from this list; retry, or ask %s", id, id)})
	}
	return out
}

// peerEligibility answers a peer with a service's verdicts, when this
// replica answers for it; otherwise 421, so that the peer does not take
// this replica's empty state for the owner's.
func (s *Server) peerEligibility(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "service")
	if s.cfg.Reads != nil && !s.cfg.Reads.Answers(name) {
		writeProblem(w, r, problem(http.StatusMisdirectedRequest, "not-owner",
			"this replica does not own service "+name+" by its reading of the leases, so it holds none of its verdicts"))
		return
	}
	v, err := s.cfg.Evaluator.ServiceEligibility(name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// peerQuarantines answers a peer with the quarantines in force of the
// services this replica owns.
func (s *Server) peerQuarantines(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Reads == nil {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "this replica does not answer for the services it owns"))
		return
	}
	writeJSON(w, http.StatusOK, ownerread.QuarantineBody(s.cfg.Reads.LocalQuarantines()))
}

// peerStats answers a peer with the counts of the services this replica
// owns.
func (s *Server) peerStats(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Reads == nil {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "this replica does not answer for the services it owns"))
		return
	}
	st, at, err := s.cfg.Reads.LocalStats()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ownerread.StatsBody(st, at))
}

// peerContractPreview replays, for a peer, a contract preview that peer
// authorised, validated and audited (the owner holds the instances'
// readiness and the windows not yet flushed). 421 when this replica does
// not answer for the service.
func (s *Server) peerContractPreview(w http.ResponseWriter, r *http.Request) {
	if p := jsonContentType(r); p != nil {
		writeProblem(w, r, p)
		return
	}
	var b ownerread.PreviewBody
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)).Decode(&b); err != nil {
		writeProblem(w, r, problem(http.StatusBadRequest, "malformed-json", "the preview could not be decoded: "+err.Error()))
		return
	}
	if !registry.ValidName(b.Service.Name) {
		writeProblem(w, r, problem(http.StatusUnprocessableEntity, "validation", "the preview names no valid service"))
		return
	}
	if s.cfg.Reads == nil || !s.cfg.Reads.Answers(b.Service.Name) {
		writeProblem(w, r, problem(http.StatusMisdirectedRequest, "not-owner",
			"this replica does not own service "+b.Service.Name+" by its reading of the leases, so it holds none of its evidence"))
		return
	}
	res, err := s.cfg.Evaluator.PreviewContract(r.Context(), b.ContractPreview())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// livePeer admits only a signed peer (authenticatePeer ran) that this
// replica has seen live in the region (Config.PeerLive): a process that
// holds the key but never joined the region reads nothing.
func (s *Server) livePeer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := r.Context().Value(peerKey{}).(string)
		if s.cfg.PeerLive != nil && !s.cfg.PeerLive(id) {
			writeProblem(w, r, problem(http.StatusForbidden, "forbidden",
				"replica "+id+" has not been seen live in this region by this replica (no heartbeat in its readings since it started); its reads are refused"))
			return
		}
		next.ServeHTTP(w, r)
	})
}
