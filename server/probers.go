package server

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/musterhq/muster/registry"
)

func (s *Server) proberAssignmentsGet(w http.ResponseWriter, r *http.Request) {
	a, err := s.cfg.Registry.GetProberAssignments(r.Context(), principal(r), chi.URLParam(r, "subject"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

func (s *Server) proberAssignmentsPut(w http.ResponseWriter, r *http.Request) {
	if !s.limitWrite(w, r, "probers", "prober.assign", "prober", chi.URLParam(r, "subject")) {
		return
	}
	var a registry.ProberAssignments
	if p := s.decodeJSON(w, r, &a); p != nil {
		writeProblem(w, r, p)
		return
	}
	out, err := s.cfg.Registry.PutProberAssignments(r.Context(), principal(r), chi.URLParam(r, "subject"), a)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
