package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/identity"
	"github.com/musterhq/muster/policy"
	"github.com/musterhq/muster/registry"
)

// ProblemBase prefixes every problem type URI. The types are stable: clients
// may switch on them.
const ProblemBase = "https://muster.dev/problems/"

// Problem is an RFC 9457 problem details body.
type Problem struct {
	Type     string                `json:"type"`
	Title    string                `json:"title"`
	Status   int                   `json:"status"`
	Detail   string                `json:"detail,omitempty"`
	Instance string                `json:"instance,omitempty"`
	Errors   []registry.FieldError `json:"errors,omitempty"`
	// Extensions are RFC 9457 extension members, encoded beside the
	// standard ones: a policy refusal's deciding check and its figures.
	Extensions map[string]any `json:"-"`

	retryAfter int // seconds; sent as Retry-After when positive
}

// MarshalJSON encodes the standard members and then the extensions; an
// extension never replaces a standard member.
func (p *Problem) MarshalJSON() ([]byte, error) {
	type plain Problem
	b, err := json.Marshal((*plain)(p))
	if err != nil || len(p.Extensions) == 0 {
		return b, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for k, v := range p.Extensions {
		if _, std := m[k]; !std && k != "detail" && k != "instance" && k != "errors" {
			m[k] = v
		}
	}
	return json.Marshal(m)
}

func problem(status int, slug, detail string) *Problem {
	return &Problem{Type: ProblemBase + slug, Title: http.StatusText(status), Status: status, Detail: detail}
}

func writeProblem(w http.ResponseWriter, r *http.Request, p *Problem) {
	if p.Instance == "" {
		p.Instance = r.URL.Path
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.retryAfter))
	}
	if p.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="muster", error="invalid_token"`)
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// writeError maps a domain error to its problem, in one place.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var (
		re *registry.Error
		pe *policy.Error
	)
	switch {
	case errors.As(err, &pe):
		writeProblem(w, r, policyProblem(w, pe))
	case errors.As(err, &re):
		p := problem(http.StatusInternalServerError, "internal", re.Detail)
		switch {
		case errors.Is(re.Kind, registry.ErrNotFound):
			p = problem(http.StatusNotFound, "not-found", re.Detail)
		case errors.Is(re.Kind, registry.ErrForbidden):
			p = problem(http.StatusForbidden, "forbidden", re.Detail)
		case errors.Is(re.Kind, registry.ErrConflict):
			p = problem(http.StatusConflict, "conflict", re.Detail)
		case errors.Is(re.Kind, registry.ErrPrecondition):
			p = problem(http.StatusPreconditionFailed, "precondition-failed", re.Detail)
		case errors.Is(re.Kind, registry.ErrGone):
			p = problem(http.StatusGone, "gone", re.Detail)
		case errors.Is(re.Kind, registry.ErrInvalid):
			p = problem(http.StatusUnprocessableEntity, "validation", re.Detail)
		}
		p.Errors = re.Fields
		writeProblem(w, r, p)
	case notReadyProblem(err) != nil:
		writeProblem(w, r, notReadyProblem(err))
	case errors.Is(err, registry.ErrNotLoaded):
		p := problem(http.StatusServiceUnavailable, "not-ready", "muster has not yet loaded who may watch and resolve what; retry in a moment")
		p.retryAfter = 1
		writeProblem(w, r, p)
	case errors.Is(r.Context().Err(), context.Canceled):
		// The client went away; nobody is listening for a body.
		w.WriteHeader(499)
	case errors.Is(err, identity.ErrIssuerUnavailable):
		s.log.Warn("token issuer unavailable", "path", r.URL.Path, "err", err)
		p := problem(http.StatusServiceUnavailable, "unavailable", "muster cannot reach a token issuer right now; nothing was changed, retry later")
		p.retryAfter = 5
		writeProblem(w, r, p)
	case db.IsUnavailable(err):
		// Refused, broken, or not answered within the request's database
		// budget (DBTimeout): the monitor hears of it too.
		s.log.Warn("database unavailable", "path", r.URL.Path, "err", err)
		if s.cfg.Database != nil {
			s.cfg.Database.Observe(err)
		}
		p := problem(http.StatusServiceUnavailable, "database-unavailable", "muster's database could not be reached or did not answer in time; "+
			"the request did not complete (a write most likely changed nothing: read back before retrying one that is not idempotent). "+
			"Views are still served (watch, resolve) and reports still taken; retry after Retry-After")
		p.retryAfter = databaseRetryAfter
		writeProblem(w, r, p)
	default:
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeProblem(w, r, problem(http.StatusInternalServerError, "internal", "muster failed to handle the request; it has been logged"))
	}
}
