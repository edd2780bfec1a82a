package server

import (
	"net/http"
	"strconv"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
)

func (s *Server) auditList(w http.ResponseWriter, r *http.Request) {
	p := principal(r)
	if (p.Kind != identity.KindOperator && p.Kind != identity.KindTool) || !p.Role.AtLeast(identity.RoleViewer) {
		writeProblem(w, r, problem(http.StatusForbidden, "forbidden", "reading the audit log needs an operator or tool identity with the viewer role or higher"))
		return
	}
	limit, after, prob := pageParams(r)
	if prob != nil {
		writeProblem(w, r, prob)
		return
	}
	var before int64
	if after != "" {
		n, err := strconv.ParseInt(after, 10, 64)
		if err != nil || n < 1 {
			writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", "cursor is not one this API issued"))
			return
		}
		before = n
	}
	q := r.URL.Query()
	f := audit.Filter{
		Actor: q.Get("actor"), Action: q.Get("action"), TargetKind: q.Get("target_kind"),
		Target: q.Get("target"), Service: q.Get("service"), Outcome: audit.Outcome(q.Get("outcome")), BeforeSeq: before, Limit: limit,
	}
	if f.Outcome != "" && f.Outcome != audit.Accepted && f.Outcome != audit.Refused {
		writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", "outcome must be accepted or refused"))
		return
	}
	items, err := s.cfg.Audit.List(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := list[audit.Event]{Items: items}
	if len(items) > 0 {
		out.NextCursor = nextCursor(len(items), limit, strconv.FormatInt(items[len(items)-1].Seq, 10))
	}
	writeJSON(w, http.StatusOK, out)
}
