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

func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }
