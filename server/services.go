package server

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/musterhq/muster/internal/registry"
)

func (s *Server) servicesList(w http.ResponseWriter, r *http.Request) {
	limit, after, p := pageParams(r)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	items, err := s.cfg.Registry.ListServices(r.Context(), principal(r),
		registry.ServiceFilter{Owner: r.URL.Query().Get("owner")}, registry.Page{After: after, Limit: limit})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := list[registry.Service]{Items: items}
	if len(items) > 0 {
		out.NextCursor = nextCursor(len(items), limit, items[len(items)-1].Name)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) serviceGet(w http.ResponseWriter, r *http.Request) {
	svc, err := s.cfg.Registry.GetService(r.Context(), principal(r), chi.URLParam(r, "name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, svc)
}

func (s *Server) servicePut(w http.ResponseWriter, r *http.Request) {
	var spec registry.ServiceSpec
	if p := s.decodeJSON(w, r, &spec); p != nil {
		writeProblem(w, r, p)
		return
	}
	svc, created, err := s.cfg.Registry.PutService(r.Context(), principal(r), chi.URLParam(r, "name"), spec)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/services/"+svc.Name)
	}
	writeJSON(w, status, svc)
}
