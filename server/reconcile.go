package server

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
)

// Reconcile is the reconciliation of orchestrators and inventories into
// the registry (reconcile.Reconciler): its diff, its confirmations and its
// alarms (reconcile_stale, reconcile_unauthorised, member_sources_unsealed,
// reconcile_replace_refused) and its held removals (Holds, listed with
// the other removal holds).
type Reconcile interface {
	Diff(ctx context.Context) (reconcile.Diff, error)
	Confirm(ctx context.Context, actor identity.Principal, source string, scope disbelief.Scope, reason string) (registry.ReconcileConfirmation, error)
	Alarms() []assembler.Alarm
	Holds() []disbelief.Hold
}

// reconcileDiffGet answers GET /v1/reconcile/diff: per source and
// service, what the sources have that the registry lacks (startup
// failures), what the registry has that no source knows (leaks), and
// where they disagree. Estate-wide: operators and tools only.
func (s *Server) reconcileDiffGet(w http.ResponseWriter, r *http.Request) {
	if !estateReader(w, r, "the reconciliation diff") {
		return
	}
	if s.cfg.Reconcile == nil {
		writeJSON(w, http.StatusOK, reconcile.Diff{Sources: []reconcile.Status{}, Counts: map[reconcile.DiffKind]int{}, Items: []reconcile.DiffItem{}})
		return
	}
	d, err := s.cfg.Reconcile.Diff(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// reconcileConfirmBody is the body of POST
// /v1/reconcile/sources/{kind}/{name}/confirm.
type reconcileConfirmBody struct {
	Reason string `json:"reason"`
}

// reconcileConfirm is POST /v1/removal-holds/confirmations for a
// source's gate, at the path it had before that API. Audited, refusals
// too.
func (s *Server) reconcileConfirm(w http.ResponseWriter, r *http.Request) {
	var body reconcileConfirmBody
	if p := s.decodeJSON(w, r, &body); p != nil {
		writeProblem(w, r, p)
		return
	}
	s.confirmSource(w, r, chi.URLParam(r, "kind")+"/"+chi.URLParam(r, "name"), body.Reason)
}
