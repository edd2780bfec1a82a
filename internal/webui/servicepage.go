package webui

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/views"
)

// What the service page reads back.
const (
	guardHistoryLimit = 50
	flapWindow        = 24 * time.Hour
	flapLimit         = 50
	overrideListLimit = 500
)

// expiries are the override lifetimes the form offers.
var expiries = [][2]string{{"900", "15 min"}, {"3600", "1 h"}, {"14400", "4 h"}, {"86400", "24 h"}}

func (u *UI) servicePage(w http.ResponseWriter, r *http.Request, pg views.Page) {
	name := r.PathValue("name")
	if !registry.ValidName(name) {
		u.message(w, r, http.StatusNotFound, "No such service", "Service names are DNS labels; there is no service "+truncate(name)+".")
		return
	}
	pg.Title, pg.Nav, pg.Refresh, pg.Live = name, "overview", 15, pg.Base+"/events?service="+name
	sp, err := u.buildServicePage(r.Context(), principalFrom(r.Context()), pg, name)
	if errors.Is(err, registry.ErrNotFound) {
		u.message(w, r, http.StatusNotFound, "No such service", "There is no service "+name+" in the registry.")
		return
	}
	if err != nil {
		u.log.Error("service page", "service", name, "err", err)
		u.message(w, r, http.StatusServiceUnavailable, "Service page unavailable", "The registry could not be read; try again in a moment.")
		return
	}
	u.render(w, r, http.StatusOK, views.ServicePageView(sp))
}

// buildServicePage reads the service, its contract and instances from the
// registry, the verdicts and view from memory, and the overrides, guard
// history and quarantine transitions from PostgreSQL. A part that cannot
// be read is reported on the page rather than shown as empty.
func (u *UI) buildServicePage(ctx context.Context, actor identity.Principal, pg views.Page, name string) (views.ServicePage, error) {
	sp := views.ServicePage{Page: pg, Name: name, Expiries: expiries}
	svc, err := u.cfg.Registry.GetService(ctx, actor, name)
	if err != nil {
		return sp, err
	}
	sp.Owner = svc.Owner
	for _, c := range svc.Capabilities {
		sp.Capabilities = append(sp.Capabilities, string(c))
	}
	sp.CanAct = u.cfg.Overrides != nil && policy.MayOverride(actor, svc.Owner)

	if sc, err := u.cfg.Registry.GetContract(ctx, actor, name); err != nil {
		u.log.Warn("service page: contract", "service", name, "err", err)
		sp.ContractError = "The health contract could not be read."
	} else {
		sp.ContractVersion, sp.ContractUpdatedAt, sp.ContractUpdatedBy = sc.Version, sc.UpdatedAt, sc.UpdatedBy
		sp.Contract = contractFields(sc.Contract)
	}

	addresses, err := u.addresses(ctx, actor, name)
	if err != nil {
		return sp, err
	}

	// Overrides: active ones and attempts awaiting a co-signer.
	byInstance, pendingBy := map[uuid.UUID]*views.OverrideRow{}, map[uuid.UUID]*views.OverrideRow{}
	if u.cfg.Overrides == nil {
		sp.OverridesError = "Overrides are not available on this server."
	} else {
		for _, st := range []policy.State{policy.StateActive, policy.StatePending} {
			list, err := u.cfg.Overrides.List(ctx, actor, policy.Filter{Service: name, State: st, Limit: overrideListLimit})
			if err != nil {
				u.log.Warn("service page: overrides", "service", name, "err", err)
				sp.OverridesError = "Overrides could not be read; the instance table may not show them all."
				break
			}
			for _, o := range list {
				row := overrideRow(o, actor)
				if st == policy.StateActive {
					sp.Active = append(sp.Active, row)
				} else {
					sp.Pending = append(sp.Pending, row)
				}
			}
		}
		// Pointers taken after the slices stop growing.
		for i := range sp.Active {
			byInstance[uuid.MustParse(sp.Active[i].InstanceID)] = &sp.Active[i]
		}
		for i := range sp.Pending {
			pendingBy[uuid.MustParse(sp.Pending[i].InstanceID)] = &sp.Pending[i]
		}
	}

	el, err := u.cfg.Evaluator.Eligibility(ctx, name)
	var away *ownerread.OwnerUnreachableError
	switch {
	case errors.Is(err, evaluator.ErrNotReady):
		sp.Unavailable = "The evaluator is still rebuilding its state: verdicts are not known yet."
	case errors.As(err, &away):
		sp.Unavailable = fmt.Sprintf("Replica %s owns this service and holds its verdicts, and it did not answer: they are not known here (not unknown). "+
			"Reload in a moment; if %s is down, another replica takes its shards within 9 s.", away.Owner, away.Owner)
	case err != nil:
		return sp, err
	default:
		sp.Evaluated = el.GeneratedAt
		sp.Counts = views.Counts{Eligible: el.Counts["eligible"], Degraded: el.Counts["degraded"],
			Ineligible: el.Counts["ineligible"], Unknown: el.Counts["unknown"]}
		sp.Instances = make([]views.Instance, 0, len(el.Instances))
		for _, in := range el.Instances {
			row := views.Instance{ID: in.InstanceID.String(), Address: addresses[in.InstanceID], Zone: in.Zone,
				State: in.State, Weight: in.Weight, Health: in.Health, SingleClass: in.SingleClass, Primary: in.Primary,
				Reasons: in.Reasons, Override: byInstance[in.InstanceID], Pending: pendingBy[in.InstanceID]}
			if in.QuarantineUntil != nil {
				row.QuarantineUntil = *in.QuarantineUntil
			}
			for _, c := range slices.Sorted(maps.Keys(in.Evidence)) {
				ev := in.Evidence[c]
				e := views.Evidence{Class: c, Present: ev.Present, Silent: ev.Silent, FailureRate: ev.FailureRate}
				if ev.LastSampleAt != nil {
					e.LastSampleAt, e.HasLastSample = *ev.LastSampleAt, true
				}
				row.Evidence = append(row.Evidence, e)
			}
			sp.Instances = append(sp.Instances, row)
		}
		slices.SortStableFunc(sp.Instances, func(a, b views.Instance) int {
			if a.Zone != b.Zone {
				if a.Zone < b.Zone {
					return -1
				}
				return 1
			}
			return 0
		})
	}

	tripped := map[string]bool{}
	if v, ok := u.cfg.Publisher.View(name); ok {
		sp.HasView, sp.Version, sp.ViewAt = true, v.Version, v.GeneratedAt
		for _, zn := range slices.Sorted(maps.Keys(v.Zones)) {
			z := v.Zones[zn]
			sp.Zones = append(sp.Zones, views.Zone{Name: zn, Guard: z.Guard, Eligible: z.Eligible, Total: z.Total, Registered: z.Registered,
				MinHealthyFraction: z.MinHealthyFraction, TrafficWeight: z.TrafficWeight})
			tripped[zn] = z.Guard == "tripped"
		}
	}

	if u.cfg.Guards == nil {
		sp.GuardsError = "The guard-trip history is not kept on this server."
	} else if eps, err := u.cfg.Guards.List(ctx, name, guardHistoryLimit); err != nil {
		u.log.Warn("service page: guard history", "service", name, "err", err)
		sp.GuardsError = "The guard-trip history could not be read."
	} else {
		for _, e := range eps {
			g := views.GuardEpisode{Zone: e.Zone, Detail: e.Detail, TrippedAt: e.TrippedAt}
			if e.ClearedAt != nil {
				g.ClearedAt = *e.ClearedAt
			} else {
				g.Open = tripped[e.Zone]
			}
			sp.Guards = append(sp.Guards, g)
		}
	}

	flaps, err := u.flapReport(ctx, name, pg.Now, sp.Instances)
	if err != nil {
		u.log.Warn("service page: flap report", "service", name, "err", err)
		sp.FlapsError = "The quarantine histories could not be read."
	}
	sp.Flaps = flaps
	return sp, nil
}

// addresses maps the service's live instances to address:port.
func (u *UI) addresses(ctx context.Context, actor identity.Principal, name string) (map[uuid.UUID]string, error) {
	out := map[uuid.UUID]string{}
	page := registry.Page{Limit: registry.MaxPageSize}
	for {
		batch, err := u.cfg.Registry.ListInstances(ctx, actor, name, registry.InstanceFilter{}, page)
		if err != nil {
			return nil, err
		}
		for _, in := range batch {
			out[in.ID] = in.Address + ":" + strconv.Itoa(in.Port)
		}
		if len(batch) < page.Limit {
			return out, nil
		}
		page.After = batch[len(batch)-1].ID.String()
	}
}

// flapReport lists the quarantines of the last day (the transitions that
// started them carry their histories), currently quarantined instances
// first; an instance quarantined now whose transition is not written yet
// is listed without history.
func (u *UI) flapReport(ctx context.Context, service string, now time.Time, instances []views.Instance) ([]views.Flap, error) {
	until := map[string]time.Time{}
	for _, in := range instances {
		if !in.QuarantineUntil.IsZero() {
			until[in.ID] = in.QuarantineUntil
		}
	}
	rows, bad, err := evaluator.QuarantineHistory(ctx, u.cfg.Pool, service, now.Add(-flapWindow), flapLimit)
	if bad > 0 {
		u.log.Warn("flap report: quarantine histories that could not be read", "service", service, "count", bad)
	}
	var out []views.Flap
	seen := map[string]bool{}
	for _, t := range rows {
		id := t.InstanceID.String()
		f := views.Flap{InstanceID: id, Reason: t.Reason, At: t.At}
		if !seen[id] {
			f.Until, f.Current = until[id], !until[id].IsZero()
		}
		seen[id] = true
		for _, h := range t.History {
			f.History = append(f.History, views.FlapStep{From: h.From, To: h.To, At: h.At, Reason: h.Reason})
		}
		out = append(out, f)
	}
	for _, id := range slices.Sorted(maps.Keys(until)) {
		if !seen[id] {
			out = append(out, views.Flap{InstanceID: id, Until: until[id], Current: true,
				Reason: "quarantined; its history has not been written to the database yet"})
		}
	}
	slices.SortStableFunc(out, func(a, b views.Flap) int {
		switch {
		case a.Current == b.Current:
			return 0
		case a.Current:
			return -1
		}
		return 1
	})
	return out, err
}

func overrideRow(o policy.Override, actor identity.Principal) views.OverrideRow {
	r := views.OverrideRow{ID: o.ID.String(), Service: o.Service, InstanceID: o.InstanceID.String(), Zone: o.Zone, Action: string(o.Action),
		State: string(o.State), Actor: o.Actor, Justification: o.Justification, Cosigner: o.Cosigner,
		CosignJustification: o.CosignJustification, BudgetDetail: o.BudgetDetail, CreatedAt: o.CreatedAt,
		ExpiresAt: o.ExpiresAt, Own: o.Actor == actor.String()}
	if o.CosignBy != nil {
		r.CosignBy = *o.CosignBy
	}
	return r
}

// contractFields lays the contract out for reading.
func contractFields(c registry.Contract) []views.Field {
	sec := func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) + " s" }
	num := func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
	fs := []views.Field{
		{Label: "Probe interval", Value: sec(c.IntervalSeconds), Note: ""},
		{Label: "Failure-rate half-life", Value: sec(c.HalfLifeSeconds), Note: ""},
		{Label: "Removal threshold", Value: num(c.RemovalThreshold), Note: "decayed failure rate at which an instance leaves rotation"},
		{Label: "Re-entry threshold", Value: num(c.ReentryThreshold), Note: "it must fall below this to come back"},
		{Label: "Minimum dwell", Value: sec(c.MinDwellSeconds), Note: "before re-entry"},
		{Label: "Minimum healthy fraction", Value: num(c.MinHealthyFraction), Note: "per zone; below it the guard trips and the disruption budget refuses"},
		{Label: "Slow start", Value: sec(c.SlowStartSeconds), Note: "weight ramp after (re-)entry"},
		{Label: "Passive primary above", Value: num(c.PassivePrimaryRPS) + " req/s", Note: "caller traffic above which passive outcomes lead"},
		{Label: "Passive callers to remove", Value: strconv.Itoa(c.MinPassiveReporters), Note: "distinct callers that must agree before passive evidence removes an instance alone"},
		{Label: "Requires readiness", Value: strconv.FormatBool(c.RequireReadiness), Note: ""},
	}
	for _, k := range slices.Sorted(maps.Keys(c.Weights)) {
		fs = append(fs, views.Field{Label: "Weight of " + string(k) + " evidence", Value: num(c.Weights[k])})
	}
	for _, d := range c.Dependencies {
		note := "not shared"
		if d.Shared {
			note = "shared: may not make instances unready"
		}
		fs = append(fs, views.Field{Label: "Dependency " + d.Name, Value: string(d.Authority), Note: note})
	}
	return fs
}
