package webui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/views"
)

// Removals is the one removal rule's state as the holds page uses it:
// every gate's holds, and the one confirmation (server.ConfirmRemoval),
// which authorises and audits the attempt as the API does.
type Removals struct {
	Holds      func() []disbelief.Hold
	LeaseGrace func() bool
	Confirm    func(ctx context.Context, actor identity.Principal, gate, scope, reason string) (any, error)
}

// keyHoldDone carries the outcome of a confirmation across its redirect.
const keyHoldDone = "hold_done"

func (u *UI) holdRoutes() {
	if u.cfg.Removals == nil {
		return
	}
	u.mux.Handle("GET "+u.cfg.BasePath+"/holds", u.page(u.holdsPage))
	u.Action("/holds/confirm", "removal.confirm", identity.RoleOperator, u.holdConfirm)
}

// holdsPage lists the holds. Every signed-in role may read it; operators
// and admins see the confirmation forms (the confirmation itself decides
// whether they may confirm a given hold).
func (u *UI) holdsPage(w http.ResponseWriter, r *http.Request, pg views.Page) {
	h := u.buildHolds(r, pg)
	h.Done = u.sessions.PopString(r.Context(), keyHoldDone)
	u.render(w, r, http.StatusOK, views.HoldsPage(h))
}

func (u *UI) buildHolds(r *http.Request, pg views.Page) views.Holds {
	pg.Title, pg.Nav, pg.Refresh = "Removal holds", "holds", 15
	actor := principalFrom(r.Context())
	h := views.Holds{Page: pg, CanAct: actor.Role.AtLeast(identity.RoleOperator)}
	if u.cfg.Removals.LeaseGrace != nil {
		h.LeaseGrace = u.cfg.Removals.LeaseGrace()
	}
	for _, x := range u.cfg.Removals.Holds() {
		h.Holds = append(h.Holds, views.HoldRow{Gate: x.Gate, Scope: x.Scope.String(), Since: x.Since, Had: x.Had,
			Lacking: x.Lacking, Held: x.Held, Threshold: x.Threshold, Partition: x.Partition, Detail: x.Detail, Services: x.Services})
	}
	return h
}

// holdConfirm confirms one hold from its form: gate, scope, reason.
func (u *UI) holdConfirm(w http.ResponseWriter, r *http.Request, p identity.Principal) {
	gate, scope, reason := r.PostFormValue("gate"), r.PostFormValue("scope"), r.PostFormValue("reason")
	_, err := u.cfg.Removals.Confirm(r.Context(), p, gate, scope, reason)
	var se *refusal.Error
	switch {
	case errors.As(err, &se):
		h := u.buildHolds(r, u.pageFor(p))
		h.Refused, h.Refresh = "Not confirmed: "+se.Detail+fieldsText(se.Fields), 0
		u.render(w, r, refusalStatus(se), views.HoldsPage(h))
	case err != nil:
		u.log.Error("hold confirmation", "err", err)
		u.message(w, r, http.StatusServiceUnavailable, "Not done", "muster could not record the confirmation right now (the database is not answering); nothing changed. Try again in a moment.")
	default:
		u.sessions.Put(r.Context(), keyHoldDone, fmt.Sprintf("Confirmed: the removals %s holds in %s may go ahead.", truncate(gate), truncate(scope)))
		http.Redirect(w, r, u.cfg.BasePath+"/holds", http.StatusSeeOther)
	}
}

// refusalStatus is the HTTP status a page answers a refusal with: 403,
// 422, 404, else 409.
func refusalStatus(se *refusal.Error) int {
	switch {
	case errors.Is(se, refusal.Forbidden):
		return http.StatusForbidden
	case errors.Is(se, refusal.Invalid):
		return http.StatusUnprocessableEntity
	case errors.Is(se, refusal.NotFound):
		return http.StatusNotFound
	}
	return http.StatusConflict
}

func fieldsText(fs []refusal.Field) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, " (%s: %s)", f.Field, f.Message)
	}
	return b.String()
}
