package shift

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/seal"
)

// Seals (package seal; migration 000016). A shift drains traffic from a
// zone or the region, so every write of one through this package (drain,
// step, confirmation, the worker's automatic steps) seals the row as
// written, in the same transaction, with the region's key. Reload applies
// only the active shifts whose seal verifies: a row inserted by hand, or
// a weight set back to 0 by hand, drains nothing (the zone keeps full
// traffic), is listed by Unsealed, counted in muster_shifts_unsealed and
// raised as a shift_unsealed alarm. A step or confirmation of such a row is
// refused, and the worker leaves it alone, so no write of muster's ever
// seals what someone else wrote. A row returned by hand to an earlier
// sealed version of itself (a restore of its old bytes) still verifies:
// the seal proves muster wrote it once, not that it is the newest. A
// restored step is applied; a restored shift muster ended is not, by the
// record of its end (sealRow, Reload; docs/keys.md, "Replays").

// AlarmShiftUnsealed is open while an active shift is not applied
// because its seal does not verify.
const AlarmShiftUnsealed = "shift_unsealed"

const sealDomain = "muster shift seal v1"

// sealed is what a shift's seal covers: everything that decides which
// target it drains, how far, in whose name and where it stands.
type sealed struct {
	ID         string  `json:"id"`
	Scope      string  `json:"scope"`
	Target     string  `json:"target"`
	Manual     bool    `json:"manual"`
	State      string  `json:"state"`
	Step       int32   `json:"step"`
	Weight     float64 `json:"weight"`
	StartedBy  string  `json:"started_by"`
	StartedAt  int64   `json:"started_at"` // microseconds since the epoch, as stored
	LastStepAt int64   `json:"last_step_at"`
	LastStepBy string  `json:"last_step_by"`
}

func sealedOf(r db.Shift) sealed {
	return sealed{
		ID: r.ID.String(), Scope: r.Scope, Target: r.Target, Manual: r.Manual, State: r.State,
		Step: r.Step, Weight: r.Weight, StartedBy: r.StartedBy, StartedAt: r.StartedAt.UnixMicro(),
		LastStepAt: r.LastStepAt.UnixMicro(), LastStepBy: r.LastStepBy,
	}
}

// sealRow seals row r as just written in q's transaction; without a
// Sealer it returns r as it is.
// A shift that ends (completed, cancelled) is also recorded as ended in
// the audit chain (audit.RecordEnd), so that its row written back to an
// earlier, sealed, draining version of itself is not applied (Reload).
func (s *Service) sealRow(ctx context.Context, q *db.Queries, r db.Shift) (db.Shift, error) {
	r, err := seal.Store(ctx, s.cfg.Sealer, sealDomain, "shift "+r.ID.String(), sealedOf(r), r, func(sig []byte, kid *string) (db.Shift, error) {
		return q.ShiftSeal(ctx, db.ShiftSealParams{ID: r.ID, Seal: sig, SealKey: kid})
	})
	if err != nil || (r.State != Completed && r.State != Cancelled) {
		return r, err
	}
	ended := r.LastStepAt
	if r.EndedAt != nil {
		ended = *r.EndedAt
	}
	return r, audit.RecordEnd(ctx, q, s.cfg.Sealer, audit.End{Kind: audit.EndShift, ID: r.ID, State: r.State, EndedAt: ended})
}

// AlarmShiftReplayed is open while an active shift by the table, sealed,
// is not applied because muster has a record of ending it: its earlier
// bytes were written back by hand.
const AlarmShiftReplayed = "shift_replayed"

// replayed returns which of rows muster has a record of ending.
func (s *Service) replayed(ctx context.Context, q *db.Queries, rows []db.Shift) (map[uuid.UUID]audit.End, int, error) {
	ids := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	return audit.Ends(ctx, q, s.trust.Keys(), audit.EndShift, ids)
}

// Replayed lists the active shifts by the table not applied because
// muster ended them, oldest first.
func (s *Service) Replayed() []Unsealed {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.replays)
	slices.SortFunc(out, func(a, b Unsealed) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// verify checks r's seal; with no keys configured every row passes.
func (s *Service) verify(r db.Shift) error {
	return s.trust.For(r.Seal, r.SealKey).Verify(sealDomain, sealedOf(r), r.Seal, r.SealKey)
}

// sealedOnly returns the rows whose seal verifies.
func (s *Service) sealedOnly(rows []db.Shift) []db.Shift {
	return slices.DeleteFunc(slices.Clone(rows), func(r db.Shift) bool { return s.verify(r) != nil })
}

// Unsealed is an active shift by the table that is not applied: its seal
// does not verify, so muster did not write it as it stands.
type Unsealed struct {
	ID     string    `json:"id"`
	Scope  string    `json:"scope"`
	Target string    `json:"target"`
	Weight float64   `json:"weight"`
	Actor  string    `json:"actor"` // who the row says started it
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"` // when this process first read it
}

// Unsealed lists the active shifts not applied for their seal, oldest
// first.
func (s *Service) Unsealed() []Unsealed {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.unsealed)
	slices.SortFunc(out, func(a, b Unsealed) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// unsealedAlarms are the shift_unsealed alarms.
func (s *Service) unsealedAlarms() []assembler.Alarm {
	var out []assembler.Alarm
	for _, u := range s.Unsealed() {
		a := assembler.Alarm{Kind: AlarmShiftUnsealed, Since: u.Since,
			Detail: fmt.Sprintf("shift %s (%s %s at traffic weight %.2f, started by %s by its row) is active by the shifts table but not applied: %s; the table was written outside muster",
				u.ID, u.Scope, u.Target, u.Weight, u.Actor, u.Reason)}
		if u.Scope == ScopeZone {
			a.Zone = u.Target
		}
		out = append(out, a)
	}
	for _, u := range s.Replayed() {
		a := assembler.Alarm{Kind: AlarmShiftReplayed, Since: u.Since,
			Detail: fmt.Sprintf("shift %s (%s %s at traffic weight %.2f, started by %s) is active by the shifts table but not applied: %s; the table was written back outside muster",
				u.ID, u.Scope, u.Target, u.Weight, u.Actor, u.Reason)}
		if u.Scope == ScopeZone {
			a.Zone = u.Target
		}
		out = append(out, a)
	}
	return out
}
