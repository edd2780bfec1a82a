package server

import "net/http"

// authzConfirmation is the body of POST /v1/authz/reload-confirmations.
type authzConfirmation struct {
	Reason string `json:"reason"`
}

// authzReloadConfirm records an admin's confirmation that a held reload of
// services and grants (alarm authz_reload_held) is what the database
// should say, releasing the hold on every replica.
func (s *Server) authzReloadConfirm(w http.ResponseWriter, r *http.Request) {
	var body authzConfirmation
	if p := s.decodeJSON(w, r, &body); p != nil {
		writeProblem(w, r, p)
		return
	}
	if !s.limitWrite(w, r, "grants", "authz.reload.confirm", "region", "region:"+s.cfg.Registry.Region()) {
		return
	}
	c, err := s.cfg.Registry.ConfirmAuthzReload(r.Context(), principal(r), body.Reason)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, c)
}
