package evaluator

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/eligibility"
)

// Quarantine is a transition that started a quarantine, as the evaluator
// wrote it, with the eligibility changes that led to it.
type Quarantine struct {
	TransitionID int64
	InstanceID   uuid.UUID
	At           time.Time
	Reason       string
	History      []HistoryStep
}

// HistoryStep is one eligibility change in a quarantine's history.
type HistoryStep struct {
	From, To string
	At       time.Time
	Reason   string
}

// QuarantineHistory returns the quarantines of service started since
// since, newest first, at most limit of them. The history is the
// evaluator's own encoding (historyEntry); a row whose history cannot be
// read is returned without it, and counted in bad, rather than hiding
// the quarantine.
func QuarantineHistory(ctx context.Context, pool *pgxpool.Pool, service string, since time.Time, limit int32) (out []Quarantine, bad int, err error) {
	rows, err := db.New(pool).TransitionsQuarantines(ctx, db.TransitionsQuarantinesParams{Service: service, Since: since, Lim: limit})
	if err != nil {
		return nil, 0, fmt.Errorf("quarantine history of %s: %w", service, err)
	}
	out = make([]Quarantine, 0, len(rows))
	for _, t := range rows {
		q := Quarantine{TransitionID: t.ID, InstanceID: t.InstanceID, At: t.At, Reason: t.Reason}
		var hist []historyEntry
		if err := json.Unmarshal(t.History, &hist); err != nil {
			bad++
		}
		for _, h := range hist {
			q.History = append(q.History, HistoryStep(h))
		}
		out = append(out, q)
	}
	return out, bad, nil
}

// AlarmInstanceQuarantined is the kind of the alarm a flap quarantine
// raises for its service's owning team (ADR-09: quarantine is surfaced to
// the owner with the transition history that produced it). It is not in
// GET /v1/alarms: the flap report shows it; internal/notify sends it.
const AlarmInstanceQuarantined = "instance_quarantined"

// QuarantineAlarm is a quarantine in force, as the notifier sends it.
type QuarantineAlarm struct {
	InstanceID uuid.UUID
	Service    string
	Zone       string
	Address    string
	Port       int
	At, Until  time.Time
	Reason     string
	// History is the eligibility changes that led to the quarantine;
	// empty for one restored after a restart (the flap report reads it
	// from the database).
	History []HistoryStep
}

// quarantineNote is a quarantine the evaluator saw start (or restored), kept
// until it ends, for QuarantineAlarms.
type quarantineNote struct {
	at, until time.Time
	reason    string
	history   []HistoryStep
}

// noteQuarantines keeps the quarantines ts start. Called with e.mu held.
func (e *Evaluator) noteQuarantines(ts []eligibility.Transition) {
	for _, t := range ts {
		if t.QuarantinedUntil.IsZero() {
			continue
		}
		c := quarantineNote{at: t.At, until: t.QuarantinedUntil, reason: t.Reason}
		for _, h := range t.History {
			c.history = append(c.history, HistoryStep{From: h.From.String(), To: h.To.String(), At: h.At, Reason: h.Reason})
		}
		e.quarantined[uuid.UUID(t.Instance)] = c
	}
}

// QuarantineAlarms lists the quarantines in force, by service and
// instance; nil while the evaluator is rebuilding. A quarantine the
// engine no longer holds (it ended, or the instance went) is forgotten.
func (e *Evaluator) QuarantineAlarms() []QuarantineAlarm {
	if !e.ready.Load() {
		return nil
	}
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []QuarantineAlarm
	for id, c := range e.quarantined {
		info, known := e.instances[id]
		v, ok := e.engine.Verdict(eligibility.InstanceID(id), now)
		if !known || !ok || !v.QuarantinedUntil.After(now) {
			delete(e.quarantined, id)
			continue
		}
		out = append(out, QuarantineAlarm{InstanceID: id, Service: info.service, Zone: info.zone, Address: info.address, Port: info.port,
			At: c.at, Until: v.QuarantinedUntil, Reason: c.reason, History: slices.Clone(c.history)})
	}
	slices.SortFunc(out, func(a, b QuarantineAlarm) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), slices.Compare(a.InstanceID[:], b.InstanceID[:]))
	})
	return out
}

// Detail is the alarm's text: the instance, how long it is held, and
// the flap history that produced the quarantine.
func (q QuarantineAlarm) Detail() string {
	var b strings.Builder
	fmt.Fprintf(&b, "instance %s (%s:%d, zone %s) of %s is quarantined until %s: %s", q.InstanceID, q.Address, q.Port, q.Zone, q.Service,
		q.Until.UTC().Format(time.RFC3339), q.Reason)
	if len(q.History) == 0 {
		b.WriteString("; its flap history is in the service's flap report")
		return b.String()
	}
	b.WriteString("; flap history:")
	for _, h := range q.History {
		fmt.Fprintf(&b, "\n  %s %s -> %s (%s)", h.At.UTC().Format(time.RFC3339), h.From, h.To, h.Reason)
	}
	return b.String()
}
