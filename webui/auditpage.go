package webui

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/musterhq/muster/audit"
	"github.com/musterhq/muster/views"
)

const auditPageSize = 50

func (u *UI) auditPage(w http.ResponseWriter, r *http.Request, pg views.Page) {
	q := r.URL.Query()
	a := views.Audit{Actor: q.Get("actor"), Action: q.Get("action"), Outcome: q.Get("outcome")}
	if a.Outcome != "" && a.Outcome != string(audit.Accepted) && a.Outcome != string(audit.Refused) {
		u.message(w, r, http.StatusBadRequest, "Bad filter", "The outcome filter is accepted or refused.")
		return
	}
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			u.message(w, r, http.StatusBadRequest, "Bad page", "This page link is not one the audit page made.")
			return
		}
		a.Before = n
	}
	pg.Title, pg.Nav = "Audit", "audit"
	a.Page = pg

	ctx := r.Context()
	// One more than a page, to know whether an older page exists.
	events, err := u.cfg.Audit.List(ctx, audit.Filter{Actor: a.Actor, Action: a.Action,
		Outcome: audit.Outcome(a.Outcome), BeforeSeq: a.Before, Limit: auditPageSize + 1})
	if err != nil {
		u.log.Error("audit page: list", "err", err)
		a.Error = "The audit log could not be read; try again in a moment."
	}
	if len(events) > auditPageSize {
		events = events[:auditPageSize]
		a.Next = events[len(events)-1].Seq
	}
	for _, e := range events {
		a.Events = append(a.Events, views.AuditEvent{Seq: e.Seq, At: e.At, ActorKind: e.ActorKind, Actor: e.Actor,
			Action: e.Action, TargetKind: e.TargetKind, Target: e.Target, Outcome: string(e.Outcome), Reason: e.Reason})
	}

	a.ChainCheckedAt = u.cfg.Now()
	rep, err := u.cfg.Audit.Verify(ctx)
	var broken *audit.BrokenError
	switch {
	case errors.As(err, &broken):
		a.ChainError = broken.Error()
	case err != nil:
		u.log.Error("audit page: verify", "err", err)
		a.ChainError = "the chain could not be verified: the database did not answer"
	default:
		a.ChainOK, a.ChainRows, a.ChainHead = true, rep.Rows, rep.Head
	}
	u.render(w, r, http.StatusOK, views.AuditPage(a))
}
