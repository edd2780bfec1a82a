package server

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
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

// refusalProblem maps a refusal (registry's, policy's, the shift-backs')
// to its problem: the broad kind decides the status, the kind names the
// type; the deciding check, the figures and what the refusal left behind
// (Subject's ProblemMembers) are extension members; a quota is sent as
// RateLimit-* headers, and a wait as Retry-After.
func refusalProblem(w http.ResponseWriter, re *refusal.Error) *Problem {
	status, slug := http.StatusInternalServerError, "internal"
	if re.Kind != nil {
		if st, ok := refusalStatus[re.Kind.Broad()]; ok {
			status, slug = st, re.Kind.ProblemType()
		}
	}
	p := problem(status, slug, re.Detail)
	p.Errors = re.Fields
	if q := re.Quota; q != nil {
		setQuota(w.Header(), *q)
		if errors.Is(re, refusal.RateLimited) {
			p.retryAfter = q.ResetSeconds()
		}
	}
	if re.RetryAfter > 0 {
		p.retryAfter = max(1, int(math.Ceil(re.RetryAfter.Seconds())))
	}
	ext := map[string]any{}
	if re.Check != "" {
		ext["check"] = re.Check
	}
	for k, v := range re.Figures {
		ext[k] = v
	}
	if m, ok := re.Subject.(interface{ ProblemMembers() map[string]any }); ok {
		for k, v := range m.ProblemMembers() {
			ext[k] = v
		}
	}
	if len(ext) > 0 {
		p.Extensions = ext
	}
	return p
}

// refusalStatus is the HTTP status of each broad kind of refusal.
var refusalStatus = map[*refusal.Kind]int{
	refusal.Invalid:      http.StatusUnprocessableEntity,
	refusal.NotFound:     http.StatusNotFound,
	refusal.Forbidden:    http.StatusForbidden,
	refusal.Conflict:     http.StatusConflict,
	refusal.Gone:         http.StatusGone,
	refusal.Precondition: http.StatusPreconditionFailed,
	refusal.RateLimited:  http.StatusTooManyRequests,
}

// writeError maps a domain error to its problem, in one place.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var re *refusal.Error
	switch {
	case errors.As(err, &re):
		writeProblem(w, r, refusalProblem(w, re))
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
	case s.cfg.Database != nil && s.cfg.Database.Unavailable(err):
		// Refused, broken, or not answered within the request's database
		// budget (DBTimeout): the monitor hears of it too.
		s.log.Warn("database unavailable", "path", r.URL.Path, "err", err)
		s.cfg.Database.Observe(err)
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
