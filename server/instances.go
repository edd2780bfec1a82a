package server

import (
	"net/http"
	"net/netip"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
)

// sourceAddr is the address the request came from, as the TCP connection
// says. Forwarded headers are deliberately not trusted: a header is not a
// proof of address (ADR-15).
func sourceAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

func (s *Server) instanceRegister(w http.ResponseWriter, r *http.Request) {
	var reg registry.Registration
	if p := s.decodeJSON(w, r, &reg); p != nil {
		writeProblem(w, r, p)
		return
	}
	inst, err := s.cfg.Registry.RegisterWithCredential(r.Context(), principal(r), sourceAddr(r), chi.URLParam(r, "name"), reg)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/instances/"+inst.ID.String())
	// The credential is in this body and nowhere else: not cached by
	// anyone on the way.
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, inst)
}

// instanceCredential is the instance credential the request presents
// (registry.CredentialHeader), held as its hash from here on.
func instanceCredential(r *http.Request) registry.Credential {
	return registry.PresentedCredential(r.Header.Get(registry.CredentialHeader))
}

func (s *Server) instancesList(w http.ResponseWriter, r *http.Request) {
	limit, after, p := pageParams(r)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	if after != "" {
		if _, err := uuid.Parse(after); err != nil {
			writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", "cursor is not one this API issued"))
			return
		}
	}
	f := registry.InstanceFilter{}
	switch st := r.URL.Query().Get("state"); st {
	case "", "active":
	case "all":
		f.IncludeEnded = true
	default:
		writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", "state must be active (the default) or all"))
		return
	}
	items, err := s.cfg.Registry.ListInstances(r.Context(), principal(r), chi.URLParam(r, "name"), f, registry.Page{After: after, Limit: limit})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := list[registry.Instance]{Items: items}
	if len(items) > 0 {
		out.NextCursor = nextCursor(len(items), limit, items[len(items)-1].ID.String())
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) instanceID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "no instance "+chi.URLParam(r, "id")+": instance ids are UUIDs"))
		return uuid.Nil, false
	}
	return id, true
}

func (s *Server) instanceGet(w http.ResponseWriter, r *http.Request) {
	id, ok := s.instanceID(w, r)
	if !ok {
		return
	}
	inst, err := s.cfg.Registry.GetInstance(r.Context(), principal(r), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, inst)
}

// leaseRenew renews one lease. The renewal limit (allowRenewals) is
// taken here rather than by limitActor, so that a renewal it refuses is
// noted with its instance and credential and never expires the lease.
func (s *Server) leaseRenew(w http.ResponseWriter, r *http.Request) {
	id, ok := s.instanceID(w, r)
	if !ok {
		return
	}
	actor, cred := principal(r), instanceCredential(r)
	if !s.allowRenewals(w, r, actor, 1, []registry.LeaseRenewal{{ID: id, Credential: cred}}) {
		return
	}
	inst, err := s.cfg.Registry.RenewWithCredential(r.Context(), actor, id, cred)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, inst)
}

// instanceDeregister ends an instance. The instance itself deregisters at
// once; anyone else's deregistration is an override, justified by an
// optional JSON body ({"justification": "..."}) and checked and audited by
// the policy package.
func (s *Server) instanceDeregister(w http.ResponseWriter, r *http.Request) {
	id, ok := s.instanceID(w, r)
	if !ok {
		return
	}
	var req policy.DeregisterRequest
	// No body (a workload shutting down) is an empty request; a body must
	// be one JSON object like any other.
	if r.ContentLength != 0 {
		if p := s.decodeJSON(w, r, &req); p != nil {
			writeProblem(w, r, p)
			return
		}
	}
	d, err := s.cfg.Policy.Deregister(r.Context(), principal(r), sourceAddr(r), instanceCredential(r), id, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if q, ok := d.Quota(); ok {
		setRateLimit(w.Header(), q)
	}
	if d.Override != nil {
		// The body is the override the deregistration was kept as.
		w.Header().Set("Content-Location", "/v1/overrides/"+d.Override.ID.String())
		writeJSON(w, http.StatusOK, d.Override)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
