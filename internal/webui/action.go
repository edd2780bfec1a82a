package webui

import (
	"context"
	"net/http"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
)

// ActionFunc carries out a form action for the signed-in operator p, who
// has already been checked to hold the action's role.
type ActionFunc func(w http.ResponseWriter, r *http.Request, p identity.Principal)

// Action registers a state-changing form at POST BasePath+path (a
// net/http pattern, e.g. "/instances/{id}/override"). Like every POST it is
// behind the cross-origin check. A request without a live session is
// refused (401); one whose role is below min is refused (403) and audited
// as action with outcome refused before fn runs, so the buttons a viewer
// does not see cannot be pressed by a forged request either. fn records its
// own accepted and refused outcomes (through the domain packages, which
// audit).
func (u *UI) Action(path, action string, min identity.Role, fn ActionFunc) {
	u.mux.HandleFunc("POST "+u.cfg.BasePath+path, func(w http.ResponseWriter, r *http.Request) {
		p, ok := u.current(r)
		if !ok {
			u.message(w, r, http.StatusUnauthorized, "Signed out", "Your session has ended; sign in again and repeat the action.")
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
		if !p.Role.AtLeast(min) {
			u.audit(r, audit.Entry{ActorKind: string(p.Kind), Actor: p.String(), Action: action,
				TargetKind: "path", Target: truncate(r.URL.Path), Outcome: audit.Refused,
				Reason: "the " + string(p.Role) + " role may not " + action + "; it needs " + string(min) + " or higher"})
			u.message(w, r, http.StatusForbidden, "Not allowed",
				"Your role ("+string(p.Role)+") may look but not act; "+action+" needs the "+string(min)+" role.")
			return
		}
		fn(w, r, p)
	})
}
