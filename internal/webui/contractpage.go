package webui

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/internal/preview"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/views"
)

// contractNumber is one number of the contract form: its field, label,
// help, input step, and where it lives in a registry.Contract.
type contractNumber struct {
	name, label, help, step string
	get                     func(*registry.Contract) float64
	set                     func(*registry.Contract, float64)
}

var contractNumbers = []contractNumber{
	{"removal_threshold", "Removal threshold", "Decayed failure rate at or above which an instance leaves rotation (0 to 1).", "any",
		func(c *registry.Contract) float64 { return c.RemovalThreshold }, func(c *registry.Contract, v float64) { c.RemovalThreshold = v }},
	{"reentry_threshold", "Re-entry threshold", "Rate it must fall below to come back (below the removal threshold).", "any",
		func(c *registry.Contract) float64 { return c.ReentryThreshold }, func(c *registry.Contract, v float64) { c.ReentryThreshold = v }},
	{"min_dwell_seconds", "Minimum dwell (s)", "How long an instance stays out before it may come back.", "any",
		func(c *registry.Contract) float64 { return c.MinDwellSeconds }, func(c *registry.Contract, v float64) { c.MinDwellSeconds = v }},
	{"min_healthy_fraction", "Minimum healthy fraction", "The zone guard: below this fraction in rotation, a zone keeps its instances.", "any",
		func(c *registry.Contract) float64 { return c.MinHealthyFraction }, func(c *registry.Contract, v float64) { c.MinHealthyFraction = v }},
	{"half_life_seconds", "Half-life (s)", "How fast evidence decays.", "any",
		func(c *registry.Contract) float64 { return c.HalfLifeSeconds }, func(c *registry.Contract, v float64) { c.HalfLifeSeconds = v }},
	{"interval_seconds", "Probe interval (s)", "How often probers check an instance.", "any",
		func(c *registry.Contract) float64 { return c.IntervalSeconds }, func(c *registry.Contract, v float64) { c.IntervalSeconds = v }},
	{"slow_start_seconds", "Slow start (s)", "How long a new instance's weight ramps up.", "any",
		func(c *registry.Contract) float64 { return c.SlowStartSeconds }, func(c *registry.Contract, v float64) { c.SlowStartSeconds = v }},
	{"passive_primary_rps", "Passive primary above (rps)", "Caller traffic above which caller outcomes lead and probes confirm.", "any",
		func(c *registry.Contract) float64 { return c.PassivePrimaryRPS }, func(c *registry.Contract, v float64) { c.PassivePrimaryRPS = v }},
	{"min_passive_reporters", "Minimum failing callers", "Distinct callers that must report an instance failing before caller outcomes may remove it.", "1",
		func(c *registry.Contract) float64 { return float64(c.MinPassiveReporters) }, func(c *registry.Contract, v float64) { c.MinPassiveReporters = int(v) }},
}

func (u *UI) contractRoutes() {
	b := u.cfg.BasePath
	u.mux.Handle("GET "+b+"/services/{name}/contract", u.page(u.contractPage))
	// Operators and admins; the registry decides whether this one may
	// manage this service's contract (its team's operators, or admin),
	// and audits the attempt either way.
	u.Action("/services/{name}/contract", "contract.put", identity.RoleOperator, u.contractSave)
	u.Action("/services/{name}/contract/preview", "contract.preview", identity.RoleOperator, u.contractPreview)
}

// contractPage shows the stored contract in its form.
func (u *UI) contractPage(w http.ResponseWriter, r *http.Request, pg views.Page) {
	c, ok := u.buildContract(w, r, pg)
	if !ok {
		return
	}
	c.Done = u.sessions.PopString(r.Context(), keyContractDone)
	u.render(w, r, http.StatusOK, views.ContractPage(c))
}

// keyContractDone carries a save's outcome across its redirect.
const keyContractDone = "contract_done"

// buildContract reads the service's stored contract into the page; false
// when it answered already (no such service, registry unreadable).
func (u *UI) buildContract(w http.ResponseWriter, r *http.Request, pg views.Page) (views.Contract, bool) {
	name := r.PathValue("name")
	if !registry.ValidName(name) {
		u.message(w, r, http.StatusNotFound, "No such service", "Service names are DNS labels; there is no service "+truncate(name)+".")
		return views.Contract{}, false
	}
	actor := principalFrom(r.Context())
	stored, err := u.cfg.Registry.GetContract(r.Context(), actor, name)
	switch {
	case errors.Is(err, registry.ErrNotFound):
		u.message(w, r, http.StatusNotFound, "No such service", "There is no service "+name+" in the registry.")
		return views.Contract{}, false
	case err != nil:
		u.log.Error("contract page", "service", name, "err", err)
		u.message(w, r, http.StatusServiceUnavailable, "Contract unavailable", "The registry could not be read; try again in a moment.")
		return views.Contract{}, false
	}
	pg.Title, pg.Nav = name+": contract", "overview"
	c := views.Contract{Page: pg, Service: name, Version: stored.Version, UpdatedBy: stored.UpdatedBy, UpdatedAt: stored.UpdatedAt,
		RequireReadiness: stored.Contract.RequireReadiness, CanEdit: actor.Role.AtLeast(identity.RoleOperator)}
	for _, f := range contractNumbers {
		c.Fields = append(c.Fields, views.ContractField{Name: f.name, Label: f.label, Help: f.help, Step: f.step,
			Value: strconv.FormatFloat(f.get(&stored.Contract), 'g', -1, 64)})
	}
	return c, true
}

// proposed is the contract the form proposes: the stored one (weights and
// dependencies kept) with the form's numbers; the page keeps what was
// typed. A number that does not parse is refused before anything is
// asked of the registry.
func (u *UI) proposed(w http.ResponseWriter, r *http.Request, p identity.Principal) (views.Contract, registry.Contract, bool) {
	c, ok := u.buildContract(w, r, u.pageFor(p))
	if !ok {
		return c, registry.Contract{}, false
	}
	stored, err := u.cfg.Registry.GetContract(r.Context(), p, c.Service)
	if err != nil {
		u.message(w, r, http.StatusServiceUnavailable, "Contract unavailable", "The registry could not be read; try again in a moment.")
		return c, registry.Contract{}, false
	}
	next := stored.Contract
	var bad []string
	for i, f := range contractNumbers {
		raw := strings.TrimSpace(r.PostFormValue(f.name))
		c.Fields[i].Value = raw
		v, err := strconv.ParseFloat(raw, 64)
		if err != nil || v != v {
			bad = append(bad, f.label)
			continue
		}
		f.set(&next, v)
	}
	next.RequireReadiness = r.PostFormValue("require_readiness") == "true"
	c.RequireReadiness = next.RequireReadiness
	if len(bad) > 0 {
		c.Refused = "Not a number: " + strings.Join(bad, ", ") + ". Nothing was changed."
		u.render(w, r, http.StatusUnprocessableEntity, views.ContractPage(c))
		return c, registry.Contract{}, false
	}
	return c, next, true
}

// contractPreview shows what the proposed contract would have done beside
// the one in force; it changes nothing.
func (u *UI) contractPreview(w http.ResponseWriter, r *http.Request, p identity.Principal) {
	if u.cfg.ContractPreview == nil {
		u.message(w, r, http.StatusNotFound, "No preview", "This muster does not offer contract previews.")
		return
	}
	c, next, ok := u.proposed(w, r, p)
	if !ok {
		return
	}
	res, err := u.cfg.ContractPreview(r.Context(), p, c.Service, next)
	if status, refused := u.contractRefusal(err); refused != "" {
		c.Refused = "Preview refused: " + refused
		u.render(w, r, status, views.ContractPage(c))
		return
	}
	c.Preview = previewView(res)
	u.render(w, r, http.StatusOK, views.ContractPage(c))
}

// contractSave stores the proposed contract, unless it changed since the
// page was read.
func (u *UI) contractSave(w http.ResponseWriter, r *http.Request, p identity.Principal) {
	c, next, ok := u.proposed(w, r, p)
	if !ok {
		return
	}
	version, err := strconv.ParseInt(r.PostFormValue("version"), 10, 64)
	if err != nil || version < 0 {
		c.Refused = "The form lost the contract's version; reload the page. Nothing was changed."
		u.render(w, r, http.StatusBadRequest, views.ContractPage(c))
		return
	}
	stored, err := u.cfg.Registry.PutContract(r.Context(), p, c.Service, next, version)
	if status, refused := u.contractRefusal(err); refused != "" {
		c.Refused = "Not saved: " + refused
		u.render(w, r, status, views.ContractPage(c))
		return
	}
	u.sessions.Put(r.Context(), keyContractDone, fmt.Sprintf("Saved: the contract of %s is now version %d.", c.Service, stored.Version))
	http.Redirect(w, r, u.cfg.BasePath+"/services/"+c.Service+"/contract", http.StatusSeeOther)
}

// contractRefusal is the status and text of a refused or failed contract
// action ("" when err is nil).
func (u *UI) contractRefusal(err error) (int, string) {
	if err == nil {
		return http.StatusOK, ""
	}
	var se *refusal.Error
	if errors.As(err, &se) {
		return refusalStatus(se), se.Detail + fieldsText(se.Fields) + " Nothing was changed."
	}
	var away *ownerread.OwnerUnreachableError
	if errors.As(err, &away) {
		return http.StatusServiceUnavailable, fmt.Sprintf("Replica %s owns this service and holds its evidence, and it did not answer: the preview could not be run. "+
			"Nothing was changed; try again in a moment (if %s is down, another replica takes its shards within 9 s).", away.Owner, away.Owner)
	}
	u.log.Error("contract action", "err", err)
	return http.StatusServiceUnavailable, "muster could not do it right now (the database or the evaluator is not answering); nothing was changed. Try again in a moment."
}

// previewView is a preview's result as the page shows it.
func previewView(res preview.Result) *views.ContractPreview {
	outcome := func(o preview.Outcome) views.ContractOutcome {
		return views.ContractOutcome{Removed: o.Removed, Removals: o.Removals, Degraded: o.Degraded, Unknown: o.Unknown,
			PeakIneligible: o.PeakIneligible, FirstRemovalAt: o.FirstRemovalAt, PeakAt: o.PeakAt,
			GuardTripped: o.Guard.Tripped, GuardFirstAt: o.Guard.FirstTrippedAt, GuardZones: o.Guard.Zones,
			MinHealthyFraction: o.Guard.MinHealthyFraction, FinalEligible: o.Final.Eligible, FinalIneligible: o.Final.Ineligible}
	}
	verdict := func(v preview.Verdict) string {
		n := "removals"
		if v.Removals == 1 {
			n = "removal"
		}
		return fmt.Sprintf("%s (worst %s), %d %s", v.Final, v.Worst, v.Removals, n)
	}
	p := &views.ContractPreview{From: res.From, To: res.To, Instances: res.Instances, Windows: res.Windows,
		Current: outcome(res.Current), Proposed: outcome(res.Proposed), DifferencesTotal: res.DiffsTotal,
		MoreRemovals: res.Proposed.Removals > res.Current.Removals, FewerRemovals: res.Proposed.Removals < res.Current.Removals}
	for _, d := range res.Differences {
		p.Differences = append(p.Differences, views.ContractDifference{InstanceID: d.InstanceID.String(), Zone: d.Zone,
			Current: verdict(d.Current), Proposed: verdict(d.Proposed)})
	}
	return p
}
