package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
)

type principalKey struct{}

// principal returns the authenticated caller. Only routes behind
// authenticate call it, so it is always set there.
func principal(r *http.Request) identity.Principal {
	p, _ := r.Context().Value(principalKey{}).(identity.Principal)
	return p
}

// authenticate admits only requests with a valid bearer token, or a
// client certificate the TLS handshake verified whose SPIFFE ID maps to a
// workload (ClientCertificates). Network position grants nothing
// (ADR-15). The token itself is never logged, nor is the certificate.
//
// A request with both proofs is the token's: the certificate can only
// refuse it, when the token is a workload's and the certificate maps to
// another service (conflicting-proofs, 403), so that a stolen token cannot
// be used from a host whose certificate names another service.
//
// Refusals are counted per source address: once an address has had
// Limits.Unauthenticated of them, its requests are answered 429 without
// their token being looked at until its bucket refills, so guessing
// tokens (or a client stuck on an expired one) costs no signature check
// and no key-set fetch. A valid token spends nothing.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr := addressKey(sourceAddr(r))
		if d := s.limits.unauthenticated.Peek(addr); !d.Allowed {
			// A token accepted before is still served: whoever floods
			// from an address real clients share (a NAT, a node, a load
			// balancer) must not lock them out. Knowing it costs a hash,
			// not a signature check. So is a mapped certificate the
			// handshake verified.
			raw, err := identity.BearerToken(r)
			if k, ok := s.cfg.Authenticator.(KnownTokens); ok && err == nil {
				if p, ok := k.Known(raw); ok {
					s.authenticatedWith(w, r, next, addr, p)
					return
				}
			}
			if errors.Is(err, identity.ErrNoToken) {
				if p, err := s.certificatePrincipal(r); err == nil {
					s.authenticated(w, r, next, p)
					return
				}
			}
			s.metrics.unauthenticated.WithLabelValues("429").Inc()
			s.refuseLimited(w, r, d, "unauthenticated", fmt.Sprintf(
				"%d requests from %s were refused for want of a valid token within %s, the most allowed; this one was not looked at: retry in %d s with a valid token",
				d.Limit.Max, addr, d.Limit.Window, d.ResetSeconds()))
			return
		}
		raw, err := identity.BearerToken(r)
		if err == nil {
			var p identity.Principal
			p, err = s.cfg.Authenticator.Verify(r.Context(), raw)
			if err == nil {
				s.authenticatedWith(w, r, next, addr, p)
				return
			}
		} else if errors.Is(err, identity.ErrNoToken) && hasClientCertificate(r) {
			var p identity.Principal
			if p, err = s.certificatePrincipal(r); err == nil {
				s.authenticated(w, r, next, p)
				return
			}
		}
		reason := identity.FailureCode(err)
		if errors.Is(err, identity.ErrCertificateUnmapped) {
			reason = identity.FailureCertificateUnmapped
		}
		if reason == identity.FailureUnavailable {
			s.metrics.authFailures.WithLabelValues(reason).Inc()
			s.writeError(w, r, err)
			return
		}
		s.metrics.authFailures.WithLabelValues(reason).Inc()
		s.auditAuthFailure(addr, reason)
		s.metrics.unauthenticated.WithLabelValues("401").Inc()
		s.limits.unauthenticated.Charge(addr, 1)
		detail := "this call needs a valid bearer token: " + err.Error()
		if reason == identity.FailureCertificateUnmapped {
			detail = "this call needs a valid bearer token, or a client certificate whose SPIFFE ID maps to a workload: " + err.Error()
		}
		writeProblem(w, r, problem(http.StatusUnauthorized, "unauthenticated", detail))
	})
}

// hasClientCertificate reports whether the TLS handshake took a client
// certificate (it verified it, or the handshake would have failed).
func hasClientCertificate(r *http.Request) bool {
	return r.TLS != nil && len(r.TLS.PeerCertificates) > 0
}

// certificatePrincipal is the workload r's client certificate maps to.
// Its errors wrap identity.ErrCertificateUnmapped.
func (s *Server) certificatePrincipal(r *http.Request) (identity.Principal, error) {
	if s.cfg.ClientCertificates == nil {
		if hasClientCertificate(r) {
			return identity.Principal{}, fmt.Errorf("client certificates are not mapped to workloads here: %w", identity.ErrCertificateUnmapped)
		}
		return identity.Principal{}, fmt.Errorf("no client certificate: %w", identity.ErrCertificateUnmapped)
	}
	if !hasClientCertificate(r) {
		return identity.Principal{}, fmt.Errorf("no client certificate: %w", identity.ErrCertificateUnmapped)
	}
	return s.cfg.ClientCertificates.Principal(r.TLS.PeerCertificates)
}

// authenticatedWith serves r as p, the token's principal, unless r's
// client certificate maps to a workload of another service than p's.
func (s *Server) authenticatedWith(w http.ResponseWriter, r *http.Request, next http.Handler, addr string, p identity.Principal) {
	if p.Kind == identity.KindWorkload && hasClientCertificate(r) {
		if cp, err := s.certificatePrincipal(r); err == nil && cp.Service != p.Service {
			s.metrics.authFailures.WithLabelValues(identity.FailureConflictingProofs).Inc()
			s.auditAuthFailure(addr, identity.FailureConflictingProofs)
			if ann, ok := r.Context().Value(annotationKey{}).(*annotation); ok {
				ann.principal = p.String()
			}
			writeProblem(w, r, problem(http.StatusForbidden, "conflicting-proofs", fmt.Sprintf(
				"the bearer token is %s's, of service %s, and the client certificate (%s) maps to service %s: a request proves one workload, so nothing was done",
				p, p.Service, cp.Subject, cp.Service)))
			return
		}
	}
	s.authenticated(w, r, next, p)
}

// AuthFailures takes the requests refused for a token that was presented
// and not accepted (audit.NewAuthFailureSummaries): one item per request,
// its failure code as Code.
type AuthFailures interface {
	Record(actorKind, actor string, items []audit.RefusedItem)
}

// auditAuthFailure hands a refused token's failure code, by source
// address, to the summaries. A request with no token at all is not on the
// record (it claims nothing), only counted.
func (s *Server) auditAuthFailure(addr, code string) {
	if s.cfg.AuthFailures == nil || code == identity.FailureMissing {
		return
	}
	s.cfg.AuthFailures.Record("anonymous", audit.AuthSourcePrefix+addr, []audit.RefusedItem{{Code: code}})
}

// authenticated serves r as p.
func (s *Server) authenticated(w http.ResponseWriter, r *http.Request, next http.Handler, p identity.Principal) {
	if ann, ok := r.Context().Value(annotationKey{}).(*annotation); ok {
		ann.principal = p.String()
	}
	next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
}

// dbBudget gives the request its database budget: a deadline by which
// whatever it does on PostgreSQL has ended (pgx honours it by setting a
// deadline on the connection), so a database that hangs turns into a
// prompt 503 instead of a request that waits with it.
func (s *Server) dbBudget(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.DBTimeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// needsDatabase answers 503 at once, without trying, while the database
// monitor says PostgreSQL is down: every request would only wait out its
// budget to learn the same.
func (s *Server) needsDatabase(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if db := s.cfg.Database; db != nil && !db.Up() {
			detail := fmt.Sprintf("muster cannot reach its database (unreachable since %s); nothing was attempted. "+
				"Views are still served (watch, resolve) and reports still taken; retry after Retry-After",
				db.DownSince().UTC().Format(time.RFC3339))
			p := problem(http.StatusServiceUnavailable, "database-unavailable", detail)
			p.retryAfter = databaseRetryAfter
			writeProblem(w, r, p)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// databaseRetryAfter is the Retry-After (seconds) of database-unavailable.
const databaseRetryAfter = 5

type annotationKey struct{}

// annotation carries facts learned deeper in the chain (the principal) back
// to the access log.
type annotation struct{ principal string }

// observe records metrics and one access-log line per request.
func (s *Server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ann := &annotation{}
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r.WithContext(context.WithValue(r.Context(), annotationKey{}, ann)))
		route := "unmatched"
		if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
			route = rc.RoutePattern()
		}
		status := ww.Status()
		if status == 0 {
			status = http.StatusOK
		}
		elapsed := time.Since(start)
		s.metrics.requests.WithLabelValues(route, r.Method, strconv.Itoa(status)).Inc()
		s.metrics.duration.WithLabelValues(route, r.Method).Observe(elapsed.Seconds())
		s.log.LogAttrs(r.Context(), levelFor(status), "request",
			slog.String("method", r.Method), slog.String("route", route), slog.String("path", r.URL.Path),
			slog.Int("status", status), slog.Duration("duration", elapsed),
			slog.String("principal", ann.principal), slog.String("request_id", middleware.GetReqID(r.Context())))
	})
}

// recoverer turns a panic into a logged 500 problem instead of a dropped
// connection.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic in handler", "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
				writeProblem(w, r, problem(http.StatusInternalServerError, "internal", "muster failed to handle the request; it has been logged"))
			}
		}()
		next.ServeHTTP(w, r)
	})
}
