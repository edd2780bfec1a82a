package server

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/shift"
)

// Shifts is the shift-back API (ADR-13), implemented by shift.Service.
type Shifts interface {
	Drain(ctx context.Context, actor identity.Principal, req shift.Request) (shift.Shift, error)
	StepBack(ctx context.Context, actor identity.Principal, id uuid.UUID) (shift.Shift, error)
	Confirm(ctx context.Context, actor identity.Principal, id uuid.UUID) (shift.Shift, error)
	Get(ctx context.Context, actor identity.Principal, id uuid.UUID) (shift.Shift, error)
	List(ctx context.Context, actor identity.Principal, f shift.Filter) ([]shift.Shift, error)
	// Alarms lists the open shiftback_pending alarms.
	Alarms() []assembler.Alarm
}

// shiftsEnabled answers 404 when this server runs without shift-backs.
func (s *Server) shiftsEnabled(w http.ResponseWriter, r *http.Request) bool {
	if s.cfg.Shifts == nil {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "shift-backs are not enabled on this server"))
		return false
	}
	return true
}

func (s *Server) shiftID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	if !s.shiftsEnabled(w, r) {
		return uuid.Nil, false
	}
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "no shift "+chi.URLParam(r, "id")+": shift ids are UUIDs"))
		return uuid.Nil, false
	}
	return id, true
}

func (s *Server) shiftStart(w http.ResponseWriter, r *http.Request) {
	if !s.shiftsEnabled(w, r) {
		return
	}
	var req shift.Request
	if p := s.decodeJSON(w, r, &req); p != nil {
		writeProblem(w, r, p)
		return
	}
	kind := req.Scope
	if kind != shift.ScopeRegion {
		kind = shift.ScopeZone // as Drain files refusals of a bad scope
	}
	if !s.limitWrite(w, r, "shifts", "shift.start", kind, req.Target) {
		return
	}
	sh, err := s.cfg.Shifts.Drain(r.Context(), principal(r), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/shifts/"+sh.ID.String())
	writeJSON(w, http.StatusCreated, sh)
}

func (s *Server) shiftsList(w http.ResponseWriter, r *http.Request) {
	if !s.shiftsEnabled(w, r) {
		return
	}
	limit, after, p := pageParams(r)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	f := shift.Filter{Limit: limit, State: r.URL.Query().Get("state")}
	if after != "" {
		id, err := uuid.Parse(after)
		if err != nil {
			writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", "cursor is not one this API issued"))
			return
		}
		f.After = id
	}
	switch f.State {
	case "", shift.Draining, shift.Returning, shift.PendingConfirmation, shift.Completed, shift.Cancelled:
	default:
		writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", "state must be one of draining, returning, pending_confirmation, completed, cancelled"))
		return
	}
	items, err := s.cfg.Shifts.List(r.Context(), principal(r), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := list[shift.Shift]{Items: items}
	if len(items) > 0 {
		out.NextCursor = nextCursor(len(items), limit, items[len(items)-1].ID.String())
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) shiftGet(w http.ResponseWriter, r *http.Request) {
	id, ok := s.shiftID(w, r)
	if !ok {
		return
	}
	sh, err := s.cfg.Shifts.Get(r.Context(), principal(r), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sh)
}

func (s *Server) shiftStep(w http.ResponseWriter, r *http.Request) {
	id, ok := s.shiftID(w, r)
	if !ok {
		return
	}
	if !s.limitWrite(w, r, "shifts", "shift.step", "shift", id.String()) {
		return
	}
	sh, err := s.cfg.Shifts.StepBack(r.Context(), principal(r), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sh)
}

func (s *Server) shiftConfirm(w http.ResponseWriter, r *http.Request) {
	id, ok := s.shiftID(w, r)
	if !ok {
		return
	}
	if !s.limitWrite(w, r, "shifts", "shift.confirm", "shift", id.String()) {
		return
	}
	sh, err := s.cfg.Shifts.Confirm(r.Context(), principal(r), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sh)
}
