package shift

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
)

// Held shifts: a drain is never ended by a verification
// failure. A shift muster applied (its seal verified) whose row then
// stops verifying (changed outside muster, or sealed by a key this
// replica no longer trusts) or goes (deleted, or set to an end muster
// did not seal) is not dropped: muster goes on applying the copy it last
// verified, raises shift_held, and the shift returns only in ADR-13's
// steps: an operator's step or confirmation, or the worker's automatic
// steps, write muster's own copy back (ShiftRestore) and move it from
// there, sealed as any step. A shift ends only by an end muster sealed.
// What a hand-written row can do is therefore what it could before:
// drain nothing (an unverified row is never applied unless muster applied
// it verified first) and, now, end nothing either.
//
// The copy is this process's: a replica that starts after the row went
// bad never verified it, and applies nothing for it (the row is listed
// as unsealed), as before.

// AlarmShiftHeld is open while a shift is applied from muster's own last
// verified copy because its row no longer verifies or is gone.
const AlarmShiftHeld = "shift_held"

// Held is a shift applied from muster's last verified copy.
type Held struct {
	Row    db.Shift  // as muster last verified it
	Reason string    // what became of its row
	Since  time.Time // when this process first found it so
}

// hold works out the held shifts after a load: prev are the shifts
// applied before it (verified, or held), rows the active rows by the
// table and applied those of them that verify. A shift of prev that is
// not applied now is held unless its row carries an end muster sealed;
// a held shift whose row verifies again (in applied) is released.
func (s *Service) hold(ctx context.Context, q *db.Queries, prev []db.Shift, held map[uuid.UUID]Held, rows, applied []db.Shift, now time.Time) (map[uuid.UUID]Held, error) {
	out := map[uuid.UUID]Held{}
	for _, p := range prev {
		if slices.ContainsFunc(applied, func(r db.Shift) bool { return r.ID == p.ID }) {
			continue
		}
		var reason string
		if i := slices.IndexFunc(rows, func(r db.Shift) bool { return r.ID == p.ID }); i >= 0 {
			if s.verify(rows[i]) == nil {
				continue // verified yet not applied: muster's record says it ended it (a replay)
			}
			reason = fmt.Sprintf("its row (traffic weight %.2f, state %s) does not verify: %v", rows[i].Weight, rows[i].State, s.verify(rows[i]))
		} else {
			r, err := q.ShiftGet(ctx, p.ID)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				reason = "its row was deleted outside muster"
			case err != nil:
				return nil, fmt.Errorf("read shift %s: %w", p.ID, err)
			case s.verify(r) == nil:
				continue // ended by muster: the end is sealed
			default:
				reason = fmt.Sprintf("its row reads %s, but that end does not verify (%v): muster did not end it", r.State, s.verify(r))
			}
		}
		h := Held{Row: p, Reason: reason, Since: now}
		if old, ok := held[p.ID]; ok {
			h.Row, h.Since = old.Row, old.Since
		} else {
			s.log.Error("a shift muster applied is held as muster last verified it: a drain is never ended by a verification failure",
				"shift", p.ID, "scope", p.Scope, "target", p.Target, "weight", p.Weight, "reason", reason)
		}
		out[p.ID] = h
	}
	return out, nil
}

// heldRow returns the held copy of shift id.
func (s *Service) heldRow(id uuid.UUID) (Held, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.held[id]
	return h, ok
}

// dueHeld lists the held automatic shifts on their way back whose last
// step was at or before cutoff.
func (s *Service) dueHeld(cutoff time.Time) []Held {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Held
	for _, h := range s.held {
		if !h.Row.Manual && h.Row.State == Returning && !h.Row.LastStepAt.After(cutoff) {
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(a, b Held) int { return a.Row.LastStepAt.Compare(b.Row.LastStepAt) })
	return out
}

// restore writes h's copy back as muster last verified it, seal
// included, and returns the row as stored, locked by q's transaction.
func restore(ctx context.Context, q *db.Queries, h Held) (db.Shift, error) {
	r := h.Row
	row, err := q.ShiftRestore(ctx, db.ShiftRestoreParams{ID: r.ID, Scope: r.Scope, Target: r.Target, Reason: r.Reason,
		Manual: r.Manual, State: r.State, Step: r.Step, Weight: r.Weight, StartedBy: r.StartedBy, StartedAt: r.StartedAt,
		LastStepAt: r.LastStepAt, LastStepBy: r.LastStepBy, PendingSince: r.PendingSince, ConfirmedBy: r.ConfirmedBy,
		ConfirmedAt: r.ConfirmedAt, EndedAt: r.EndedAt, UpdatedAt: r.UpdatedAt, Seal: r.Seal, SealKey: r.SealKey})
	if err != nil {
		return db.Shift{}, fmt.Errorf("write back held shift %s: %w", r.ID, err)
	}
	return row, nil
}

// Held lists the held shifts, by id.
func (s *Service) Held() []Held {
	s.mu.Lock()
	out := make([]Held, 0, len(s.held))
	for _, h := range s.held {
		out = append(out, h)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Held) int { return strings.Compare(a.Row.ID.String(), b.Row.ID.String()) })
	return out
}

// heldAlarms are the shift_held alarms.
func (s *Service) heldAlarms() []assembler.Alarm {
	var out []assembler.Alarm
	for _, h := range s.Held() {
		r := h.Row
		a := assembler.Alarm{Kind: AlarmShiftHeld, Since: h.Since,
			Detail: fmt.Sprintf("shift %s (%s %s) stays applied at traffic weight %.2f as muster last verified it: %s. A drain is never ended by a verification failure; it returns in steps (POST /v1/shifts/%s/step, or the worker's automatic steps), which write muster's copy back",
				r.ID, r.Scope, r.Target, r.Weight, h.Reason, r.ID)}
		if r.Scope == ScopeZone {
			a.Zone = r.Target
		}
		out = append(out, a)
	}
	return out
}
