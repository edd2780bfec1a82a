package server

import (
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
)

// Evidence an identity may not give is an attempt on capacity: a caller
// reporting passive failures about a service it may not call, a workload
// reporting a sibling unready, a prober reporting targets it was not
// assigned. Such refusals are put on the audit record, the
// way a refused override is, but evidence arrives in floods and on the hot
// path, so the handler only hands them to Config.RefusedEvidence
// (audit.RefusalSummaries), which summarises them per identity per minute
// into one audit row, off the request path.
//
// Refusals that are not about authority (a malformed item, an unknown
// instance, a stale timestamp) are not audited: they are answered in the
// response and counted in muster_samples_refused_total.

// auditedCodes are the refusal codes that are a question of authority.
var auditedCodes = map[string]bool{
	"not_granted": true, "not_own_instance": true, "wrong_identity_kind": true, "not_assigned": true,
}

// RefusedEvidence takes the report items refused for want of authority
// (audit.RefusalSummaries).
type RefusedEvidence interface {
	Record(actorKind, actor string, items []audit.RefusedItem)
}

// auditRefusedEvidence hands the batch's refusals of authority to the
// summaries.
func (s *Server) auditRefusedEvidence(actor identity.Principal, reports []evaluator.Report, res evaluator.Result) {
	if s.cfg.RefusedEvidence == nil {
		return
	}
	var items []audit.RefusedItem
	for _, r := range res.Refused {
		if !auditedCodes[r.Code] || r.Index < 0 || r.Index >= len(reports) {
			continue
		}
		rep := reports[r.Index]
		items = append(items, audit.RefusedItem{Target: rep.InstanceID.String(), Code: r.Code, Class: rep.Class, Outcome: rep.Outcome, Reason: r.Reason})
	}
	s.cfg.RefusedEvidence.Record(string(actor.Kind), actor.String(), items)
}
