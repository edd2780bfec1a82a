package webui

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/views"
)

const auditPageSize = 50

func (u *UI) auditPage(w http.ResponseWriter, r *http.Request, pg views.Page) {
	q := r.URL.Query()
	a := views.Audit{Actor: q.Get("actor"), Action: q.Get("action"), Service: q.Get("service"), Outcome: q.Get("outcome")}
	if a.Outcome != "" && a.Outcome != string(audit.Accepted) && a.Outcome != string(audit.Refused) {
		u.message(w, r, http.StatusBadRequest, "Bad filter", "The outcome filter is accepted or refused.")
		return
	}
	if a.Service != "" && !registry.ValidName(a.Service) {
		u.message(w, r, http.StatusBadRequest, "Bad filter", "The service filter takes a service name (lower-case letters, digits and dashes, such as checkout).")
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
	events, err := u.cfg.Audit.List(ctx, audit.Filter{Actor: a.Actor, Action: a.Action, Service: a.Service,
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

	rep, checkedAt, err := u.verifyChain(r)
	a.ChainCheckedAt = checkedAt
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

// verifyEvery bounds how often the audit page walks the whole chain; the
// page says when the result it shows was computed.
const verifyEvery = 30 * time.Second

type chainCheck struct {
	at  time.Time
	rep audit.Report
	err error
}

// verifyChain returns the last verification when it is recent, else walks
// the chain again. Failures to reach the database are not kept.
func (u *UI) verifyChain(r *http.Request) (audit.Report, time.Time, error) {
	u.chainMu.Lock()
	defer u.chainMu.Unlock()
	now := u.cfg.Now()
	if c := u.chain; c != nil && now.Sub(c.at) < verifyEvery && now.Sub(c.at) >= 0 {
		return c.rep, c.at, c.err
	}
	rep, err := u.cfg.Audit.Verify(r.Context())
	var broken *audit.BrokenError
	if err == nil || errors.As(err, &broken) {
		u.chain = &chainCheck{at: now, rep: rep, err: err}
	}
	return rep, now, err
}
