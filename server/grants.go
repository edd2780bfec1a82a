package server

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// grantsBody is the body of PUT /v1/services/{name}/grants.
type grantsBody struct {
	Callers []string `json:"callers"`
}

func (s *Server) grantsGet(w http.ResponseWriter, r *http.Request) {
	g, err := s.cfg.Registry.GetGrants(r.Context(), principal(r), chi.URLParam(r, "name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, g)
}

func (s *Server) grantsPut(w http.ResponseWriter, r *http.Request) {
	if !s.limitWrite(w, r, "grants", "grants.put", "service", chi.URLParam(r, "name")) {
		return
	}
	var b grantsBody
	if p := s.decodeJSON(w, r, &b); p != nil {
		writeProblem(w, r, p)
		return
	}
	g, err := s.cfg.Registry.PutGrants(r.Context(), principal(r), chi.URLParam(r, "name"), b.Callers)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, g)
}
