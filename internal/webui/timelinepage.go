package webui

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/views"
)

// What the timeline reads back at most.
const (
	timelineChangeLimit   = 200000
	timelineGuardLimit    = 500
	timelineOverrideLimit = 1000
	timelineShiftPages    = 10
)

// serviceTimeline is GET /ui/services/{name}/timeline?span=1h|24h&end=RFC3339:
// the service's state timeline as inline SVG with a text equivalent.
func (u *UI) serviceTimeline(w http.ResponseWriter, r *http.Request, pg views.Page) {
	name := r.PathValue("name")
	if !registry.ValidName(name) {
		u.message(w, r, http.StatusNotFound, "No such service", "Service names are DNS labels; there is no service "+truncate(name)+".")
		return
	}
	q := r.URL.Query()
	from, to, chosen, err := timelineWindow(q.Get("span"), q.Get("end"), pg.Now)
	if err != nil {
		u.message(w, r, http.StatusBadRequest, "Timeline window not understood", err.Error())
		return
	}
	pg.Title, pg.Nav = name+" timeline", "overview"
	tl := views.Timeline{Page: pg, Service: name}
	for _, d := range timelineOffered {
		tl.Spans = append(tl.Spans, spanText(d))
	}
	if q.Get("end") != "" {
		tl.EndParam = to.Format(time.RFC3339)
	}
	err = u.buildTimeline(r.Context(), principalFrom(r.Context()), &tl, from, to, chosen)
	if errors.Is(err, registry.ErrNotFound) {
		u.message(w, r, http.StatusNotFound, "No such service", "There is no service "+name+" in the registry.")
		return
	}
	if err != nil {
		u.log.Error("service timeline", "service", name, "err", err)
		u.message(w, r, http.StatusServiceUnavailable, "Timeline unavailable", "The registry or the transitions log could not be read; try again in a moment.")
		return
	}
	u.render(w, r, http.StatusOK, views.TimelinePage(tl))
}

// buildTimeline reads the instances registered in the window from the
// registry, their verdicts from memory, the transitions, guard trips,
// overrides and shifts from PostgreSQL, and lays them out. Unless the span
// was chosen, the window is narrowed to fit the service's activity
// (fitSpan) once the instances are read. The registry and the transitions
// are needed; a part of the rest that cannot be read is said on the page.
func (u *UI) buildTimeline(ctx context.Context, actor identity.Principal, tl *views.Timeline, from, to time.Time, chosen bool) error {
	name := tl.Service
	if _, err := u.cfg.Registry.GetService(ctx, actor, name); err != nil {
		return err
	}
	states := map[uuid.UUID]string{}
	if el, err := u.cfg.Evaluator.Eligibility(ctx, name); err == nil {
		for _, in := range el.Instances {
			states[in.InstanceID] = in.State
		}
	} else if !errors.Is(err, evaluator.ErrNotReady) && !errors.Is(err, ownerread.ErrOwnerUnreachable) {
		// Without the owner the timeline still shows what PostgreSQL
		// holds; only the current states are left out.
		return err
	}
	var insts []timelineInstance
	var first time.Time
	page := registry.Page{Limit: registry.MaxPageSize}
	for {
		batch, err := u.cfg.Registry.InstancesDuring(ctx, actor, name, from, to, page)
		if err != nil {
			return err
		}
		for _, in := range batch {
			ti := timelineInstance{ID: in.ID, Label: in.Address + ":" + strconv.Itoa(in.Port), Zone: in.Zone, Registered: in.CreatedAt}
			if in.State == "active" {
				ti.State = "unknown"
				if st, ok := states[in.ID]; ok {
					ti.State = st
				}
			} else {
				// An end muster did not stamp (ended by hand) is taken
				// as the row's last change.
				end := in.UpdatedAt
				if in.EndedAt != nil {
					end = *in.EndedAt
				}
				ti.Ended, ti.EndState = &end, in.State
			}
			if first.IsZero() || in.CreatedAt.Before(first) {
				first = in.CreatedAt
			}
			insts = append(insts, ti)
		}
		if len(batch) < page.Limit {
			break
		}
		page.After = batch[len(batch)-1].ID.String()
	}
	if !chosen {
		from = to.Add(-fitSpan(to, first))
	}
	span := to.Sub(from)
	tl.Span = spanText(span)
	if fit := fitSpan(to, first); fit < span {
		tl.FitSpan = spanText(fit)
	}
	tl.Earlier = from.Format(time.RFC3339)
	if later := to.Add(span); later.Before(tl.Now) {
		tl.Later, tl.LaterOK = later.Format(time.RFC3339), true
	} else {
		tl.LaterOK = tl.EndParam != ""
	}
	d := timelineData{From: from, To: to, Tick: tickFor(span), Instances: insts}
	ids := make([]uuid.UUID, 0, len(insts))
	for _, in := range insts {
		ids = append(ids, in.ID)
	}
	var err error
	if d.Changes, tl.Truncated, err = evaluator.Window(ctx, u.cfg.Pool, name, from, to, timelineChangeLimit); err != nil {
		return err
	}
	if d.StateAt, err = evaluator.StatesAt(ctx, u.cfg.Pool, ids, from); err != nil {
		return err
	}

	if u.cfg.Guards == nil {
		tl.Notes = append(tl.Notes, "The guard-trip history is not kept on this server.")
	} else if d.Guards, err = u.cfg.Guards.List(ctx, name, timelineGuardLimit); err != nil {
		u.log.Warn("service timeline: guard history", "service", name, "err", err)
		tl.Notes = append(tl.Notes, "The guard-trip history could not be read.")
	}
	if u.cfg.Overrides == nil {
		tl.Notes = append(tl.Notes, "Overrides are not available on this server.")
	} else if d.Overrides, err = u.cfg.Overrides.List(ctx, actor, policy.Filter{Service: name, Limit: timelineOverrideLimit}); err != nil {
		u.log.Warn("service timeline: overrides", "service", name, "err", err)
		tl.Notes = append(tl.Notes, "Overrides could not be read.")
	}
	if u.cfg.Shifts != nil {
		f := shift.Filter{Limit: registry.MaxPageSize}
		for range timelineShiftPages {
			batch, err := u.cfg.Shifts.List(ctx, actor, f)
			if err != nil {
				u.log.Warn("service timeline: shifts", "service", name, "err", err)
				tl.Notes = append(tl.Notes, "Shift-backs could not be read.")
				break
			}
			d.Shifts = append(d.Shifts, batch...)
			if len(batch) < f.Limit {
				break
			}
			f.After = batch[len(batch)-1].ID
		}
	}
	layoutTimeline(tl, d)
	return nil
}
