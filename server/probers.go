package server

import (
	"net/http"
	"net/url"

	"github.com/go-chi/chi/v5"

	"github.com/musterhq/muster/internal/registry"
)

// proberName reads {subject}: a prober's name, its token subject for the
// home issuer and "issuer#subject" for another (identity's ProberName),
// which a client sends percent-encoded; chi hands it over as sent when it
// holds an encoded '/'.
func proberName(r *http.Request) string {
	name := chi.URLParam(r, "subject")
	if r.URL.RawPath == "" {
		return name // routed on the decoded path
	}
	if n, err := url.PathUnescape(name); err == nil {
		return n
	}
	return name
}

func (s *Server) proberAssignmentsGet(w http.ResponseWriter, r *http.Request) {
	a, err := s.cfg.Registry.GetProberAssignments(r.Context(), principal(r), proberName(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

func (s *Server) proberAssignmentsPut(w http.ResponseWriter, r *http.Request) {
	if !s.limitWrite(w, r, "probers", "prober.assign", "prober", proberName(r)) {
		return
	}
	var a registry.ProberAssignments
	if p := s.decodeJSON(w, r, &a); p != nil {
		writeProblem(w, r, p)
		return
	}
	out, err := s.cfg.Registry.PutProberAssignments(r.Context(), principal(r), proberName(r), a)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
