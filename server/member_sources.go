package server

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/musterhq/muster/internal/registry"
)

// memberSourcesBody is the body of PUT /v1/services/{name}/member-sources.
type memberSourcesBody struct {
	Sources []registry.MemberSource `json:"sources"`
}

// memberSourcesGet answers who may supply the service's members from each
// reconciliation source (configured false: the reconcile config's
// defaults apply).
func (s *Server) memberSourcesGet(w http.ResponseWriter, r *http.Request) {
	m, err := s.cfg.Registry.GetMemberSources(r.Context(), principal(r), chi.URLParam(r, "name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// memberSourcesPut replaces them whole: the owning team's operators or
// admins, audited as member_sources.put, refusals too.
func (s *Server) memberSourcesPut(w http.ResponseWriter, r *http.Request) {
	if !s.limitWrite(w, r, "member-sources", "member_sources.put", "service", chi.URLParam(r, "name")) {
		return
	}
	var b memberSourcesBody
	if p := s.decodeJSON(w, r, &b); p != nil {
		writeProblem(w, r, p)
		return
	}
	m, err := s.cfg.Registry.PutMemberSources(r.Context(), principal(r), chi.URLParam(r, "name"), b.Sources)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}
