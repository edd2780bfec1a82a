package server

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/musterhq/muster/internal/registry"
)

func (s *Server) contractGet(w http.ResponseWriter, r *http.Request) {
	c, err := s.cfg.Registry.GetContract(r.Context(), principal(r), chi.URLParam(r, "name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("ETag", etag(c.Version))
	writeJSON(w, http.StatusOK, c)
}

// contractPut replaces the contract. Omitted fields take the platform
// defaults. With If-Match (the ETag from GET) the write only happens if
// nobody changed the contract in between; 412 otherwise.
func (s *Server) contractPut(w http.ResponseWriter, r *http.Request) {
	ifVersion := int64(-1)
	if im := r.Header.Get("If-Match"); im != "" && im != "*" {
		// If-Match uses strong comparison: a weak tag never matches.
		v, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(im, `"`), `"`), 10, 64)
		if err != nil || v < 0 || !strings.HasPrefix(im, `"`) {
			writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", "If-Match must be one strong ETag returned by GET on this contract, such as \"3\""))
			return
		}
		ifVersion = v
	}
	if !s.limitWrite(w, r, "contracts", "contract.put", "service", chi.URLParam(r, "name")) {
		return
	}
	c := registry.DefaultContract()
	if p := s.decodeJSON(w, r, &c); p != nil {
		writeProblem(w, r, p)
		return
	}
	stored, err := s.cfg.Registry.PutContract(r.Context(), principal(r), chi.URLParam(r, "name"), c, ifVersion)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("ETag", etag(stored.Version))
	writeJSON(w, http.StatusOK, stored)
}

// contractPreview answers what a proposed contract would have done to the
// service on the evidence muster holds for it, beside what the contract in
// force did. It takes the body PUT takes, authorised and
// validated as PUT does (registry.PreviewContract, which audits the
// attempt either way, as contract.preview), and changes nothing else: the
// replay runs on engines of its own (Evaluator.PreviewContract). It
// counts against the actor's contract-write quota: a preview costs a
// replay of the service's windows.
func (s *Server) contractPreview(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	if !s.limitWrite(w, r, "contracts", "contract.preview", "service", name) {
		return
	}
	c := registry.DefaultContract()
	if p := s.decodeJSON(w, r, &c); p != nil {
		writeProblem(w, r, p)
		return
	}
	pv, err := s.cfg.Registry.PreviewContract(r.Context(), principal(r), name, c)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// The replay needs what only the service's owner holds (its
	// instances' readiness, the windows not yet flushed).
	preview := s.cfg.Evaluator.PreviewContract
	if s.cfg.Reads != nil {
		preview = s.cfg.Reads.PreviewContract
	}
	res, err := preview(r.Context(), pv)
	if p := ownerUnreachableProblem(err); p != nil {
		writeProblem(w, r, p)
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }
