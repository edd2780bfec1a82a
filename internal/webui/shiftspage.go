package webui

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/views"
)

// ShiftBacks is the shift-back state machine as the UI uses it
// (shift.Service): the same audited calls the /v1/shifts API makes, with
// the session's operator as the actor.
type ShiftBacks interface {
	Drain(ctx context.Context, actor identity.Principal, req shift.Request) (shift.Shift, error)
	StepBack(ctx context.Context, actor identity.Principal, id uuid.UUID) (shift.Shift, error)
	Confirm(ctx context.Context, actor identity.Principal, id uuid.UUID) (shift.Shift, error)
	List(ctx context.Context, actor identity.Principal, f shift.Filter) ([]shift.Shift, error)
	// Alarms lists the open shiftback_pending alarms.
	Alarms() []assembler.Alarm
}

// completedPageSize is how many ended shifts the page lists at a time.
const completedPageSize = 20

// keyShiftDone carries the outcome of a shift action across its redirect.
const keyShiftDone = "shift_done"

func (u *UI) shiftRoutes() {
	if u.cfg.Shifts == nil {
		return
	}
	b := u.cfg.BasePath
	u.mux.Handle("GET "+b+"/shifts", u.page(u.shiftsPage))
	u.Action("/shifts", "shift.start", identity.RoleOperator, u.shiftDrain)
	u.Action("/shifts/{id}/step", "shift.step", identity.RoleOperator, u.shiftStep)
	u.Action("/shifts/{id}/confirm", "shift.confirm", identity.RoleOperator, u.shiftConfirm)
}

func (u *UI) shiftsPage(w http.ResponseWriter, r *http.Request, pg views.Page) {
	after := r.URL.Query().Get("after")
	if after != "" {
		if _, err := uuid.Parse(after); err != nil {
			u.message(w, r, http.StatusBadRequest, "Bad page", "This page link is not one the shift-backs page made.")
			return
		}
	}
	s := u.buildShifts(r, pg, after)
	s.Done = u.sessions.PopString(r.Context(), keyShiftDone)
	u.render(w, r, http.StatusOK, views.ShiftsPage(s))
}

// buildShifts reads the active shifts, one page of completed ones and the
// zones the drain form offers.
func (u *UI) buildShifts(r *http.Request, pg views.Page, after string) views.Shifts {
	pg.Title, pg.Nav, pg.Refresh = "Shift-backs", "shifts", 15
	actor := principalFrom(r.Context())
	s := views.Shifts{Page: pg, After: after, CanAct: actor.Role.AtLeast(identity.RoleOperator),
		MinReason: shift.MinReason, Form: views.DrainForm{Manual: true}}
	ctx := r.Context()

	alarmed := map[string]bool{} // scope/target with an open shiftback_pending
	for _, a := range u.cfg.Shifts.Alarms() {
		if a.Zone != "" {
			alarmed[shift.ScopeZone+"/"+a.Zone] = true
		} else {
			alarmed[shift.ScopeRegion] = true
		}
	}
	for _, state := range []string{shift.PendingConfirmation, shift.Draining, shift.Returning} {
		rows, err := u.cfg.Shifts.List(ctx, actor, shift.Filter{State: state, Limit: registry.MaxPageSize})
		if err != nil {
			u.log.Error("shifts page: list", "state", state, "err", err)
			s.Error = "The shifts could not be read; try again in a moment."
			return s
		}
		for _, sh := range rows {
			row := shiftRow(sh)
			row.Alarm = alarmed[sh.Scope+"/"+sh.Target] || (sh.Scope == shift.ScopeRegion && alarmed[shift.ScopeRegion])
			if state == shift.PendingConfirmation {
				s.Pending = append(s.Pending, row)
			} else {
				s.Active = append(s.Active, row)
			}
		}
	}
	slices.SortStableFunc(s.Active, func(a, b views.ShiftRow) int { return a.StartedAt.Compare(b.StartedAt) })

	f := shift.Filter{State: shift.Completed, Limit: completedPageSize + 1}
	if after != "" {
		f.After = uuid.MustParse(after)
	}
	done, err := u.cfg.Shifts.List(ctx, actor, f)
	if err != nil {
		u.log.Error("shifts page: list completed", "err", err)
		s.Error = "The completed shifts could not be read; try again in a moment."
	}
	if len(done) > completedPageSize {
		done = done[:completedPageSize]
		s.Next = done[len(done)-1].ID.String()
	}
	for _, sh := range done {
		s.Completed = append(s.Completed, shiftRow(sh))
	}
	s.Zones = u.knownZones(r, actor)
	return s
}

func shiftRow(sh shift.Shift) views.ShiftRow {
	row := views.ShiftRow{ID: sh.ID.String(), Scope: sh.Scope, Target: sh.Target, Reason: sh.Reason, Manual: sh.Manual,
		State: sh.State, Step: sh.Step, Weight: sh.TrafficWeight, StartedBy: sh.StartedBy, StartedAt: sh.StartedAt,
		LastStepBy: sh.LastStepBy, LastStepAt: sh.LastStepAt}
	if sh.NextWeight != nil && sh.NextStepAt != nil {
		row.HasNext, row.NextWeight, row.NextStepAt = true, *sh.NextWeight, *sh.NextStepAt
	}
	if sh.PendingSince != nil {
		row.PendingSince = *sh.PendingSince
	}
	if sh.ConfirmedBy != nil {
		row.ConfirmedBy = *sh.ConfirmedBy
	}
	if sh.ConfirmedAt != nil {
		row.ConfirmedAt = *sh.ConfirmedAt
	}
	if sh.EndedAt != nil {
		row.EndedAt = *sh.EndedAt
	}
	return row
}

// knownZones lists the zones of the published views, for the drain form.
// A failure only costs the suggestions: the field takes any zone name.
func (u *UI) knownZones(r *http.Request, actor identity.Principal) []string {
	zones := map[string]bool{}
	page := registry.Page{Limit: registry.MaxPageSize}
	for {
		batch, err := u.cfg.Registry.ListServices(r.Context(), actor, registry.ServiceFilter{}, page)
		if err != nil {
			u.log.Warn("shifts page: list services for zones", "err", err)
			break
		}
		for _, svc := range batch {
			if v, ok := u.cfg.Publisher.View(svc.Name); ok {
				for z := range v.Zones {
					zones[z] = true
				}
			}
		}
		if len(batch) < page.Limit {
			break
		}
		page.After = batch[len(batch)-1].Name
	}
	return slices.Sorted(maps.Keys(zones))
}

// shiftDrain starts a zone drain from the form: zone, reason, manual.
func (u *UI) shiftDrain(w http.ResponseWriter, r *http.Request, p identity.Principal) {
	form := views.DrainForm{Zone: strings.TrimSpace(r.PostFormValue("zone")), Reason: r.PostFormValue("reason"),
		Manual: r.PostFormValue("manual") != ""}
	manual := form.Manual
	sh, err := u.cfg.Shifts.Drain(r.Context(), p, shift.Request{Scope: shift.ScopeZone, Target: form.Zone,
		Reason: form.Reason, Manual: &manual})
	if err != nil {
		u.shiftRefused(w, r, err, form)
		return
	}
	how := "automatic: the steps after the first follow the dwell on their own"
	if sh.Manual {
		how = "manual: the final step back will wait for an operator's confirmation"
	}
	u.shiftDone(w, r, fmt.Sprintf("Zone %s is drained: its traffic weight is now %s (%s).", sh.Target, percent(sh.TrafficWeight), how))
}

func (u *UI) shiftStep(w http.ResponseWriter, r *http.Request, p identity.Principal) {
	id, ok := u.shiftID(w, r)
	if !ok {
		return
	}
	sh, err := u.cfg.Shifts.StepBack(r.Context(), p, id)
	if err != nil {
		u.shiftRefused(w, r, err, views.DrainForm{Manual: true})
		return
	}
	msg := fmt.Sprintf("%s %s stepped back: traffic weight now %s.", sh.Scope, sh.Target, percent(sh.TrafficWeight))
	if sh.State == shift.PendingConfirmation {
		msg += " The final step back needs an operator's confirmation."
	}
	u.shiftDone(w, r, msg)
}

func (u *UI) shiftConfirm(w http.ResponseWriter, r *http.Request, p identity.Principal) {
	id, ok := u.shiftID(w, r)
	if !ok {
		return
	}
	sh, err := u.cfg.Shifts.Confirm(r.Context(), p, id)
	if err != nil {
		u.shiftRefused(w, r, err, views.DrainForm{Manual: true})
		return
	}
	u.shiftDone(w, r, fmt.Sprintf("Confirmed: %s %s is back at traffic weight %s and the shift is %s.", sh.Scope, sh.Target, percent(sh.TrafficWeight), sh.State))
}

func (u *UI) shiftID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		u.message(w, r, http.StatusNotFound, "No such shift", "There is no shift "+truncate(r.PathValue("id"))+".")
		return uuid.Nil, false
	}
	return id, true
}

// shiftDone sends the browser back to the page (post/redirect/get) with
// what happened.
func (u *UI) shiftDone(w http.ResponseWriter, r *http.Request, msg string) {
	u.sessions.Put(r.Context(), keyShiftDone, msg)
	http.Redirect(w, r, u.cfg.BasePath+"/shifts", http.StatusSeeOther)
}

// shiftRefused renders the page again with the refusal explained.
func (u *UI) shiftRefused(w http.ResponseWriter, r *http.Request, err error, form views.DrainForm) {
	var se *refusal.Error
	if !errors.As(err, &se) {
		u.log.Error("shift action", "path", r.URL.Path, "err", err)
		u.message(w, r, http.StatusServiceUnavailable, "Not done", "muster could not complete this right now (the database or the evaluator is not answering); nothing changed. Try again in a moment.")
		return
	}
	ref, status := explainShift(se, u.cfg.Now())
	if status == http.StatusConflict && errors.Is(se, shift.ErrDwell) {
		w.Header().Set("Retry-After", fmt.Sprint(max(1, int(se.RetryAfter.Round(time.Second).Seconds()))))
	}
	s := u.buildShifts(r, u.pageFor(principalFrom(r.Context())), "")
	// No live refresh: it would replace the explanation with the page.
	s.Refusal, s.Form, s.Refresh = &ref, form, 0
	u.render(w, r, status, views.ShiftsPage(s))
}

// explainShift turns a refusal into plain words with its figures, and the
// status the page answers with.
func explainShift(se *refusal.Error, now time.Time) (views.ShiftRefusal, int) {
	ref := views.ShiftRefusal{Text: se.Detail}
	status := http.StatusConflict
	switch {
	case errors.Is(se, shift.ErrDwell):
		ref.Heading = "Not yet: the minimum dwell between steps has not elapsed"
		if at, ok := se.Figures["next_step_at"].(time.Time); ok {
			ref.NextStepAt = at
		}
		if ref.NextStepAt.IsZero() {
			ref.NextStepAt = now.Add(se.RetryAfter)
		}
	case errors.Is(se, shift.ErrBudget):
		ref.Heading = "Refused: draining this zone would take services below their minimum"
		for _, f := range shift.BudgetShortfall(se) {
			ref.Budget = append(ref.Budget, views.BudgetRow{Service: f.Service, InRotationOutside: f.InRotationOutside,
				Total: f.Total, Required: f.Required, MinHealthyFraction: f.MinHealthyFraction})
		}
	case errors.Is(se, shift.ErrNeedsConfirm):
		ref.Heading = "This step needs a confirmation"
		ref.Text = se.Detail + ". Press Confirm on the shift when the zone is known to be healthy."
	case errors.Is(se, registry.ErrForbidden):
		ref.Heading, status = "Not allowed", http.StatusForbidden
	case errors.Is(se, registry.ErrInvalid):
		ref.Heading, status = "The drain was not started: the form needs correcting", http.StatusUnprocessableEntity
		for _, f := range se.Fields {
			ref.Fields = append(ref.Fields, f.Field+" "+f.Message)
		}
	case errors.Is(se, registry.ErrNotFound):
		ref.Heading, status = "No such shift", http.StatusNotFound
	default:
		ref.Heading = "Refused"
	}
	return ref, status
}

func percent(w float64) string { return fmt.Sprintf("%.0f%%", w*100) }
