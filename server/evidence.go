package server

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/musterhq/muster/audit"
	"github.com/musterhq/muster/evaluator"
	"github.com/musterhq/muster/identity"
)

// Evidence an identity may not give is an attempt on capacity: a caller
// reporting passive failures about a service it may not call, a workload
// reporting a sibling unready, a prober reporting targets it was not
// assigned. Such refusals are audited (issue 13), the way a refused
// override is, but evidence arrives in floods and on the hot path, so:
//
//   - one audit row per identity per evidenceAuditEvery at most; the
//     refusals in between are counted into the next row;
//   - never while the database monitor says PostgreSQL is down (the
//     refusal stands; the row is counted as unaudited);
//   - bounded by the request's own database budget.
//
// Refusals that are not about authority (a malformed item, an unknown
// instance, a stale timestamp) are not audited: they are answered in the
// response and counted in muster_samples_refused_total.
const evidenceAuditEvery = 10 * time.Second

// auditedCodes are the refusal codes that are a question of authority.
var auditedCodes = map[string]bool{
	"not_granted": true, "not_own_instance": true, "wrong_identity_kind": true, "not_assigned": true,
}

type evidenceAudit struct {
	mu   sync.Mutex
	last map[string]time.Time // by actor: when its last row was written
	owed map[string]int       // by actor: refusals since, not yet in a row
}

// auditRefusedEvidence writes, at most once per identity per
// evidenceAuditEvery, an audit row for the batch's refusals of authority.
func (s *Server) auditRefusedEvidence(ctx context.Context, actor identity.Principal, reports []evaluator.Report, res evaluator.Result) {
	var refused []evaluator.Refusal
	for _, r := range res.Refused {
		if auditedCodes[r.Code] {
			refused = append(refused, r)
		}
	}
	if len(refused) == 0 {
		return
	}
	key, now := actor.String(), time.Now()
	e := &s.evidence
	e.mu.Lock()
	if e.last == nil || len(e.last) > 100_000 {
		e.last, e.owed = map[string]time.Time{}, map[string]int{}
	}
	earlier := e.owed[key]
	if now.Sub(e.last[key]) < evidenceAuditEvery || (s.cfg.Database != nil && !s.cfg.Database.Up()) {
		e.owed[key] = earlier + len(refused)
		e.mu.Unlock()
		s.metrics.evidenceUnaudited.Add(float64(len(refused)))
		return
	}
	e.last[key], e.owed[key] = now, 0
	e.mu.Unlock()

	codes := map[string]int{}
	for _, r := range refused {
		codes[r.Code]++
	}
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(codes)) {
		parts = append(parts, fmt.Sprintf("%d %s", codes[c], c))
	}
	type item struct {
		InstanceID string `json:"instance_id"`
		Class      string `json:"class"`
		Outcome    string `json:"outcome,omitempty"`
		Code       string `json:"code"`
		Reason     string `json:"reason"`
	}
	var items []item
	for _, r := range refused[:min(len(refused), 10)] {
		rep := reports[r.Index]
		items = append(items, item{InstanceID: rep.InstanceID.String(), Class: audit.Clip(rep.Class, 32), Outcome: audit.Clip(rep.Outcome, 32), Code: r.Code, Reason: r.Reason})
	}
	first := reports[refused[0].Index].InstanceID.String()
	entry := audit.Entry{
		ActorKind: string(actor.Kind), Actor: key, Action: "evidence.report", TargetKind: "instance", Target: first,
		Outcome: audit.Refused,
		Reason: fmt.Sprintf("%d of %d reports refused for want of authority (%s): %s", len(refused), len(reports),
			strings.Join(parts, ", "), refused[0].Reason),
		After: map[string]any{"refused": items, "refused_total": len(refused), "refused_since_last_row": earlier},
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.DBTimeout)
	defer cancel()
	if _, err := s.cfg.Audit.Append(actx, now, entry); err != nil {
		s.metrics.evidenceUnaudited.Add(float64(len(refused)))
		s.log.Warn("audit refused evidence", "actor", key, "err", err)
	}
}
