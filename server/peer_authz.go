package server

import (
	"errors"
	"net/http"

	"github.com/musterhq/muster/internal/registry"
)

// PeerAuthzPath is where a replica hands its copy of services and grants
// to a peer (a replica that starts while PostgreSQL is
// unreachable authorises watch and resolve with a peer's rows).
const PeerAuthzPath = "/v1/peer/authz"

// AuthzSnapshot hands the rows of services and grants the authorisation
// copy last read, seals included (registry.AuthzCache.Snapshot).
type AuthzSnapshot interface {
	Snapshot() ([]byte, error)
}

// peerAuthz answers a peer replica with the rows of services and grants
// this replica's copy last read. The receiver verifies every seal with
// its own keys, so the rows need no more trust than the signed request
// that asked for them; this replica answers 503 until it has read any.
func (s *Server) peerAuthz(w http.ResponseWriter, r *http.Request) {
	src, _ := s.cfg.Authz.(AuthzSnapshot)
	if src == nil {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "this replica keeps no copy of services and grants to hand over"))
		return
	}
	b, err := src.Snapshot()
	if err != nil {
		if !errors.Is(err, registry.ErrNoSnapshot) {
			s.log.Error("hand services and grants to a peer", "err", err)
		}
		p := problem(http.StatusServiceUnavailable, "not-ready", "this replica holds no copy of services and grants yet; ask another, or retry after Retry-After")
		p.retryAfter = 1
		writeProblem(w, r, p)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// readOnly answers 503 at once while the replica serves views without
// its database (Config.ReadOnly): it started while PostgreSQL was
// unreachable and has not caught up, so it takes no evidence it could
// neither evaluate nor forward.
func (s *Server) readOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.ReadOnly != nil && s.cfg.ReadOnly() {
			p := problem(http.StatusServiceUnavailable, "read-only",
				"this replica started while its database was unreachable and serves views read-only (watch, resolve) until it returns; "+
					"nothing was taken: send this to another replica, or retry after Retry-After")
			p.retryAfter = databaseRetryAfter
			writeProblem(w, r, p)
			return
		}
		next.ServeHTTP(w, r)
	})
}
