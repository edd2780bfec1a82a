package server

import (
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/refusal"
)

func (s *Server) overrideCreate(w http.ResponseWriter, r *http.Request) {
	var req policy.Request
	if p := s.decodeJSON(w, r, &req); p != nil {
		writeProblem(w, r, p)
		return
	}
	o, err := s.cfg.Policy.Create(r.Context(), principal(r), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if d, ok := o.Quota(); ok {
		setRateLimit(w.Header(), d)
	}
	w.Header().Set("Location", "/v1/overrides/"+o.ID.String())
	writeJSON(w, http.StatusCreated, o)
}

func (s *Server) overridesList(w http.ResponseWriter, r *http.Request) {
	limit, after, prob := pageParams(r)
	if prob != nil {
		writeProblem(w, r, prob)
		return
	}
	q := r.URL.Query()
	f := policy.Filter{Service: q.Get("service"), State: policy.State(q.Get("state")), Actor: q.Get("actor"), Limit: limit}
	if after != "" {
		id, err := uuid.Parse(after)
		if err != nil {
			writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", "cursor is not one this API issued"))
			return
		}
		f.Before = id
	}
	if v := q.Get("instance_id"); v != "" {
		id, err := uuid.Parse(v)
		if err != nil {
			writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", "instance_id must be an instance's id (a UUID)"))
			return
		}
		f.Instance = id
	}
	items, err := s.cfg.Policy.List(r.Context(), principal(r), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := list[policy.Override]{Items: items}
	if len(items) > 0 {
		out.NextCursor = nextCursor(len(items), limit, items[len(items)-1].ID.String())
	}
	writeJSON(w, http.StatusOK, out)
}

// overrideID reads {id}, answering 404 for anything that is not a UUID:
// no override can have such an id.
func overrideID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "no override "+chi.URLParam(r, "id")))
		return uuid.Nil, false
	}
	return id, true
}

func (s *Server) overrideGet(w http.ResponseWriter, r *http.Request) {
	id, ok := overrideID(w, r)
	if !ok {
		return
	}
	o, err := s.cfg.Policy.Get(r.Context(), principal(r), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

func (s *Server) overrideLift(w http.ResponseWriter, r *http.Request) {
	id, ok := overrideID(w, r)
	if !ok {
		return
	}
	// Lifting gives capacity back, so it is not counted with the
	// override attempts (5 per 10 min per service); its own family keeps
	// a runaway script from churning overrides.
	if !s.limitWrite(w, r, "lifts", "override.lift", "override", id.String()) {
		return
	}
	o, err := s.cfg.Policy.Lift(r.Context(), principal(r), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

func (s *Server) overrideCosign(w http.ResponseWriter, r *http.Request) {
	id, ok := overrideID(w, r)
	if !ok {
		return
	}
	var req policy.CosignRequest
	if p := s.decodeJSON(w, r, &req); p != nil {
		writeProblem(w, r, p)
		return
	}
	o, err := s.cfg.Policy.Cosign(r.Context(), principal(r), id, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if d, ok := o.Quota(); ok {
		setRateLimit(w.Header(), d)
	}
	writeJSON(w, http.StatusOK, o)
}

// limitWrite takes one attempt from the caller's quota for a family of
// policy writes and answers 429 when it is spent. It reports whether the
// handler may go on.
func (s *Server) limitWrite(w http.ResponseWriter, r *http.Request, scope, action, targetKind, target string) bool {
	d, err := s.cfg.Policy.LimitWrite(r.Context(), principal(r), scope, action, targetKind, target)
	if err != nil {
		s.writeError(w, r, err)
		return false
	}
	setRateLimit(w.Header(), d)
	return true
}

// setRateLimit sends the quota as RateLimit-* headers (the IETF
// httpapi-ratelimit-headers fields, with the policy as "5;w=600").
func setRateLimit(h http.Header, d policy.Decision) { setQuota(h, *d.Quota()) }

func setQuota(h http.Header, q refusal.Quota) {
	h.Set("RateLimit-Limit", strconv.Itoa(q.Max))
	h.Set("RateLimit-Remaining", strconv.Itoa(q.Remaining))
	h.Set("RateLimit-Reset", strconv.Itoa(q.ResetSeconds()))
	h.Set("RateLimit-Policy", q.Policy())
}
