package webui

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/zonehistory"
	"github.com/musterhq/muster/views"
)

// Overview filters and sorts, as query parameters.
var (
	overviewStates = []string{"", "alarm", "tripped", "unknown", "ineligible", "degraded", "healthy", "empty"}
	overviewSorts  = []string{"", "name", "owner", "unknown", "ineligible", "age"}
)

func (u *UI) overview(w http.ResponseWriter, r *http.Request, pg views.Page) {
	q := r.URL.Query()
	owner, state, sort := q.Get("owner"), q.Get("state"), q.Get("sort")
	if !slices.Contains(overviewStates, state) || !slices.Contains(overviewSorts, sort) || (owner != "" && !registry.ValidName(owner)) {
		u.message(w, r, http.StatusBadRequest, "Bad filter", "The overview filters by owner (a team name), state and sort from its own form; this link has a value it does not know.")
		return
	}
	pg.Title, pg.Nav, pg.Refresh, pg.Live = "Overview", "overview", 15, pg.Base+"/events"
	o, err := u.buildOverview(r, principalFrom(r.Context()), pg, owner, state, sort)
	if err != nil {
		u.log.Error("overview", "err", err)
		u.message(w, r, http.StatusServiceUnavailable, "Overview unavailable", "The registry could not be read; try again in a moment.")
		return
	}
	u.render(w, r, http.StatusOK, views.OverviewPage(o))
}

// buildOverview reads every service (one registry query per 1000 services),
// then the evaluator's verdicts and the publisher's views and alarms from
// memory, and applies the filter and sort.
func (u *UI) buildOverview(r *http.Request, actor identity.Principal, pg views.Page, owner, state, sortBy string) (views.Overview, error) {
	o := views.Overview{Page: pg, Owner: owner, State: state, Sort: sortBy, Evaluated: pg.Now}
	if u.cfg.ZoneHistory != nil {
		o.ZonesShown, o.ZonesEvery = true, u.cfg.ZoneHistoryEvery.String()
		o.Zones = zoneTrends(u.cfg.ZoneHistory.Since(r.Context(), pg.Now.Add(-time.Hour)))
	}
	if u.cfg.ProberHistory != nil {
		o.ProbersShown, o.ZonesEvery = true, u.cfg.ZoneHistoryEvery.String()
		o.Probers = proberTrends(u.cfg.ProberHistory.Since(r.Context(), pg.Now.Add(-time.Hour)))
	}
	var services []registry.Service
	page := registry.Page{Limit: registry.MaxPageSize}
	for {
		batch, err := u.cfg.Registry.ListServices(r.Context(), actor, registry.ServiceFilter{}, page)
		if err != nil {
			return o, err
		}
		services = append(services, batch...)
		if len(batch) < page.Limit {
			break
		}
		page.After = batch[len(batch)-1].Name
	}

	var alarms []assembler.Alarm
	if u.cfg.Alarms != nil {
		alarms = u.cfg.Alarms()
	} else {
		alarms = u.cfg.Publisher.Alarms()
		if u.cfg.Shifts != nil {
			alarms = append(alarms, u.cfg.Shifts.Alarms()...)
		}
	}
	alarmsBy := map[string]int{}
	for _, a := range alarms {
		o.Alarms = append(o.Alarms, views.Alarm{Kind: a.Kind, Service: a.Service, Zone: a.Zone, Detail: a.Detail, Since: a.Since})
		alarmsBy[a.Service]++
	}

	// One pass over the evaluator's instances for every service's counts:
	// asking for each service's full verdicts would cost 60,000 verdicts
	// with reasons per page at region scale.
	stats, at, unanswered, err := u.cfg.Evaluator.Stats(r.Context())
	switch {
	case errors.Is(err, evaluator.ErrNotReady):
		o.Unavailable = "The evaluator is still rebuilding its state: instance counts are not known yet and show as 0."
	case err != nil:
		return o, err
	default:
		o.Evaluated = at
	}
	if len(unanswered) > 0 {
		o.Unavailable = strings.TrimSpace(o.Unavailable + " " + fmt.Sprintf(
			"Replicas %s own services and did not answer: the counts of their services are not known here and show as 0 (not unknown); reload in a moment.",
			strings.Join(unanswered, ", ")))
	}
	statsBy := make(map[string]*eligibility.ServiceStats, len(stats))
	for i := range stats {
		statsBy[stats[i].Service] = &stats[i]
	}
	var overridden map[string]policy.OverrideCount
	if u.cfg.InForce != nil {
		overridden = u.cfg.InForce.Counts()
	}
	owners := map[string]bool{}
	for _, s := range services {
		owners[s.Owner] = true
		row := views.Service{Name: s.Name, Owner: s.Owner, Alarms: alarmsBy[s.Name]}
		if st := statsBy[s.Name]; st != nil {
			fillStats(&row, st)
		}
		row.OverriddenOut, row.OverriddenIn = overridden[s.Name].Out, overridden[s.Name].In
		if v, ok := u.cfg.Publisher.View(s.Name); ok {
			row.HasView, row.Version, row.ViewAt = true, v.Version, v.GeneratedAt
			for _, name := range slices.Sorted(maps.Keys(v.Zones)) {
				z := v.Zones[name]
				row.Zones = append(row.Zones, views.Zone{Name: name, Guard: z.Guard, Eligible: z.Eligible, Total: z.Total, MinHealthyFraction: z.MinHealthyFraction})
			}
		}
		row.State = summarise(row)
		o.Total++
		if (owner == "" || row.Owner == owner) && (state == "" || row.State == state || matchesState(row, state)) {
			o.Services = append(o.Services, row)
		}
	}
	o.Owners = slices.Sorted(maps.Keys(owners))
	if u.cfg.Overrides != nil {
		pending, err := u.cfg.Overrides.List(r.Context(), actor, policy.Filter{State: policy.StatePending, Limit: 20})
		if err != nil {
			u.log.Warn("overview: pending co-signs", "err", err)
		}
		for _, p := range pending {
			o.Pending = append(o.Pending, overrideRow(p, actor))
		}
	}
	sortServices(o.Services, sortBy)
	return o, nil
}

// fillStats takes the counts, the evidence classes, single-class
// standing and flap figures of a service.
func fillStats(row *views.Service, st *eligibility.ServiceStats) {
	row.Counts = views.Counts{Eligible: st.Eligible, Degraded: st.Degraded, Ineligible: st.Ineligible, Unknown: st.Unknown}
	for _, c := range st.Classes {
		row.Classes = append(row.Classes, c.String())
	}
	row.SingleClass = st.SingleClass && st.Instances > 0
	row.FlapRate, row.Quarantined = st.FlapRate, st.Quarantined
}

// summarise names the most pressing condition of a service.
func summarise(s views.Service) string {
	tripped := false
	for _, z := range s.Zones {
		tripped = tripped || z.Guard == "tripped"
	}
	c := s.Counts
	switch {
	case s.Alarms > 0:
		return "alarm"
	case tripped:
		return "tripped"
	case c.Unknown > 0:
		return "unknown"
	case c.Ineligible > 0:
		return "ineligible"
	case c.Degraded > 0:
		return "degraded"
	case c.Eligible > 0:
		return "healthy"
	}
	return "empty"
}

// matchesState lets a filter find every service having the condition, not
// only those where it is the most pressing one.
func matchesState(s views.Service, state string) bool {
	switch state {
	case "alarm":
		return s.Alarms > 0
	case "tripped":
		for _, z := range s.Zones {
			if z.Guard == "tripped" {
				return true
			}
		}
	case "unknown":
		return s.Counts.Unknown > 0
	case "ineligible":
		return s.Counts.Ineligible > 0
	case "degraded":
		return s.Counts.Degraded > 0
	}
	return false
}

func sortServices(ss []views.Service, by string) {
	slices.SortStableFunc(ss, func(a, b views.Service) int {
		switch by {
		case "owner":
			return cmp.Or(cmp.Compare(a.Owner, b.Owner), cmp.Compare(a.Name, b.Name))
		case "unknown":
			return cmp.Or(cmp.Compare(b.Counts.Unknown, a.Counts.Unknown), cmp.Compare(a.Name, b.Name))
		case "ineligible":
			return cmp.Or(cmp.Compare(b.Counts.Ineligible, a.Counts.Ineligible), cmp.Compare(a.Name, b.Name))
		case "age": // oldest view first; unpublished services first of all
			return cmp.Or(compareTime(a.ViewAt, b.ViewAt), cmp.Compare(a.Name, b.Name))
		}
		return cmp.Compare(a.Name, b.Name)
	})
}

func compareTime(a, b time.Time) int { return a.Compare(b) }

// zoneTrends turns each zone's samples into its two sparklines: unknown
// instances (scaled to the zone's highest count in the hour, at least 1)
// and the eligible fraction of the guard's capacity (0 to 100%).
func zoneTrends(series []zonehistory.Series) []views.ZoneTrend {
	out := make([]views.ZoneTrend, 0, len(series))
	for _, s := range series {
		z := views.ZoneTrend{Zone: s.Zone,
			Unknown:  views.Spark{Name: "unknown instances", Top: 1},
			Fraction: views.Spark{Name: "eligible fraction", Top: 1, Percent: true}}
		for _, x := range s.Samples {
			z.Unknown.Values = append(z.Unknown.Values, float64(x.Unknown))
			z.Unknown.Top = max(z.Unknown.Top, float64(x.Unknown))
			z.Fraction.Values = append(z.Fraction.Values, x.Fraction())
		}
		out = append(out, z)
	}
	return out
}

// proberTrends turns each prober's samples into its reach sparkline
// (targets reported on, of those assigned: 0 to 100%) and its state at
// the last sample.
func proberTrends(series []zonehistory.Series) []views.ProberTrend {
	out := make([]views.ProberTrend, 0, len(series))
	for _, s := range series {
		p := views.ProberTrend{Prober: s.Zone, Reach: views.Spark{Name: "targets reported on", Top: 1, Percent: true}, State: "reporting"}
		for _, x := range s.Samples {
			p.Reach.Values = append(p.Reach.Values, x.Fraction())
		}
		last := s.Samples[len(s.Samples)-1]
		p.Targets = last.Total
		if last.State != "" {
			p.State = last.State
		}
		out = append(out, p)
	}
	return out
}
