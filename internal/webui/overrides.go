package webui

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/views"
)

// The override forms, and the deregistration form (an override of its own
// kind). Each goes through policy.Service with the session's principal,
// the same checked and audited path as /v1/overrides and DELETE
// /v1/instances/{id}; Action has already refused (and audited) viewers.
func (u *UI) overrideRoutes() {
	u.Action("/services/{name}/instances/{id}/override", "override.create", identity.RoleOperator, u.createOverride)
	u.Action("/services/{name}/instances/{id}/deregister", "instance.deregister", identity.RoleOperator, u.deregisterInstance)
	u.Action("/overrides/{id}/cosign", "override.cosign", identity.RoleOperator, u.cosignOverride)
	u.Action("/overrides/{id}/lift", "override.lift", identity.RoleOperator, u.liftOverride)
	u.mux.Handle("GET "+u.cfg.BasePath+"/overrides/{id}/lift", u.page(u.confirmLift))
}

func (u *UI) createOverride(w http.ResponseWriter, r *http.Request, p identity.Principal) {
	service := r.PathValue("name")
	// Whatever the form holds goes to the policy, which refuses (and
	// audits) a bad value; a lifetime that is not a number becomes -1,
	// which the expiry check refuses.
	expires, err := strconv.ParseInt(r.PostFormValue("expires_in"), 10, 64)
	if err != nil {
		expires = -1
	}
	o, err := u.cfg.Overrides.Create(r.Context(), p, policy.Request{InstanceID: r.PathValue("id"),
		Action: policy.Action(r.PostFormValue("action")), Justification: r.PostFormValue("justification"), ExpiresIn: expires})
	if err != nil {
		retry := &views.OverrideRetry{Service: service, InstanceID: r.PathValue("id"), Action: r.PostFormValue("action"),
			Justification: r.PostFormValue("justification"), ExpiresIn: r.PostFormValue("expires_in"), Expiries: expiries}
		u.overrideRefused(w, r, p, service, "Override refused", err, retry)
		return
	}
	row := overrideRow(o, p)
	u.render(w, r, http.StatusOK, views.OverrideResultPage(views.OverrideResult{Page: u.resultPage(p, "Override applied"),
		Service: o.Service, Outcome: "accepted", Heading: "Override applied", Override: &row,
		Lines: []string{fmt.Sprintf("%s is now %s: it takes effect in the next view of %s. It expires on its own at %s.",
			o.InstanceID, actionWords(o.Action), o.Service, views.Absolute(o.ExpiresAt))}}))
}

func (u *UI) cosignOverride(w http.ResponseWriter, r *http.Request, p identity.Principal) {
	id, ok := u.overrideID(w, r)
	if !ok {
		return
	}
	o, err := u.cfg.Overrides.Cosign(r.Context(), p, id, policy.CosignRequest{Justification: r.PostFormValue("justification")})
	if err != nil {
		u.overrideRefused(w, r, p, r.PostFormValue("service"), "Co-signature refused", err, nil)
		return
	}
	row := overrideRow(o, p)
	if o.Action == policy.Deregister {
		u.render(w, r, http.StatusOK, views.OverrideResultPage(views.OverrideResult{Page: u.resultPage(p, "Deregistration co-signed"),
			Service: o.Service, Outcome: "accepted", Heading: "Deregistration co-signed and applied", Override: &row,
			Lines: []string{
				fmt.Sprintf("%s asked and you co-signed: %s is deregistered, beyond the disruption budget (%s). It leaves the next view of %s.",
					o.Actor, o.InstanceID, o.BudgetDetail, o.Service),
				"Both identities and both justifications are in the audit log.",
			}}))
		return
	}
	u.render(w, r, http.StatusOK, views.OverrideResultPage(views.OverrideResult{Page: u.resultPage(p, "Override co-signed"),
		Service: o.Service, Outcome: "accepted", Heading: "Override co-signed and applied", Override: &row,
		Lines: []string{
			fmt.Sprintf("%s asked and you co-signed: %s is now %s, beyond the disruption budget (%s).",
				o.Actor, o.InstanceID, actionWords(o.Action), o.BudgetDetail),
			"Both identities and both justifications are in the audit log. It expires at " + views.Absolute(o.ExpiresAt) + ".",
		}}))
}

func (u *UI) liftOverride(w http.ResponseWriter, r *http.Request, p identity.Principal) {
	id, ok := u.overrideID(w, r)
	if !ok {
		return
	}
	o, err := u.cfg.Overrides.Lift(r.Context(), p, id)
	if err != nil {
		u.overrideRefused(w, r, p, r.PostFormValue("service"), "Lift refused", err, nil)
		return
	}
	row := overrideRow(o, p)
	if o.Action == policy.Deregister {
		u.render(w, r, http.StatusOK, views.OverrideResultPage(views.OverrideResult{Page: u.resultPage(p, "Deregistration withdrawn"),
			Service: o.Service, Outcome: "accepted", Heading: "Deregistration withdrawn", Override: &row,
			Lines: []string{fmt.Sprintf("The deregistration of %s waits for no co-signer any more: the instance stays registered.", o.InstanceID)}}))
		return
	}
	u.render(w, r, http.StatusOK, views.OverrideResultPage(views.OverrideResult{Page: u.resultPage(p, "Override lifted"),
		Service: o.Service, Outcome: "accepted", Heading: "Override lifted", Override: &row,
		Lines: []string{fmt.Sprintf("The override on %s is lifted: the instance follows its own verdict again from the next view of %s.",
			o.InstanceID, o.Service)}}))
}

// confirmLift asks before lifting, so a stray click does not.
func (u *UI) confirmLift(w http.ResponseWriter, r *http.Request, pg views.Page) {
	p := principalFrom(r.Context())
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil || u.cfg.Overrides == nil {
		u.message(w, r, http.StatusNotFound, "No such override", "This link does not name an override.")
		return
	}
	o, err := u.cfg.Overrides.Get(r.Context(), p, id)
	if err != nil {
		var pe *refusal.Error
		if errors.As(err, &pe) {
			u.message(w, r, http.StatusNotFound, "No such override", pe.Detail)
			return
		}
		u.log.Error("lift confirmation", "err", err)
		u.message(w, r, http.StatusServiceUnavailable, "Override unavailable", "The override could not be read; try again in a moment.")
		return
	}
	pg.Title = "Lift override"
	if o.Action == policy.Deregister {
		pg.Title = "Withdraw deregistration"
	}
	u.render(w, r, http.StatusOK, views.LiftConfirmPage(views.LiftConfirm{Page: pg, Service: o.Service, Override: overrideRow(o, p)}))
}

func (u *UI) overrideID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		u.message(w, r, http.StatusNotFound, "No such override", "This form does not name an override.")
		return uuid.Nil, false
	}
	return id, true
}

func (u *UI) resultPage(p identity.Principal, title string) views.Page {
	pg := u.pageFor(p)
	pg.Title, pg.Nav = title, "overview"
	return pg
}

func actionWords(a policy.Action) string {
	if a == policy.MarkEligible {
		return "forced eligible"
	}
	return "marked ineligible"
}

// overrideRefused explains a refusal in plain words with its numbers.
// retry, for a create, is the form as sent: it is offered again, filled
// in, when the refusal is one the operator can fix by editing it.
func (u *UI) overrideRefused(w http.ResponseWriter, r *http.Request, p identity.Principal, service, heading string, err error, retry *views.OverrideRetry) {
	var pe *refusal.Error
	if !errors.As(err, &pe) {
		u.log.Error("override form", "err", err)
		u.message(w, r, http.StatusServiceUnavailable, "Not done", "muster could not reach its database, so nothing was changed; try again in a moment.")
		return
	}
	if !registry.ValidName(service) {
		service = "" // from the form or path: only a service name makes a link back
	}
	res := views.OverrideResult{Page: u.resultPage(p, heading), Service: service, Outcome: "refused", Heading: heading}
	what := "this override"
	if retry != nil && retry.Action == string(policy.Deregister) {
		what = "this deregistration"
	}
	pending, _ := policy.PendingOverride(pe)
	if pending != nil {
		row := overrideRow(*pending, p)
		res.Override, res.Service = &row, pending.Service
	}
	status := http.StatusUnprocessableEntity
	switch {
	case errors.Is(pe, policy.ErrBudget):
		status = http.StatusConflict
		res.Heading = "Refused by the disruption budget"
		res.Lines = []string{"Applied now, " + what + " " + budgetWords(pe.Figures) + "."}
		if o := pending; o != nil && o.CosignBy != nil {
			res.Outcome, res.CosignBy = "pending", *o.CosignBy
			res.Lines = append(res.Lines,
				fmt.Sprintf("It now waits for a co-signer: a second operator of the owning team (or an admin) may co-sign it on the %s page until %s (%s). A co-signature applies it anyway; without one it expires and nothing changes.",
					o.Service, views.Absolute(*o.CosignBy), views.Ago(res.Now, *o.CosignBy)))
		}
	case errors.Is(pe, policy.ErrLastInstance):
		status = http.StatusConflict
		res.Heading = "Refused: the last eligible instance"
		res.Lines = []string{budgetWords(pe.Figures) + ".", "muster never removes the last eligible instance of a service in the region, not even with a co-signer. Restore capacity first."}
	case errors.Is(pe, policy.ErrRateLimited):
		status = http.StatusTooManyRequests
		res.Heading = "Refused: too many override attempts"
		if d := pe.Quota; d != nil {
			wait := time.Duration(d.ResetSeconds()) * time.Second
			res.RetryAt = res.Now.Add(wait)
			w.Header().Set("Retry-After", strconv.Itoa(d.ResetSeconds()))
			res.Lines = []string{fmt.Sprintf("You have made %d override attempts on this service within %s, the most allowed per operator; refused attempts and deregistrations count too.", d.Max, d.Window),
				fmt.Sprintf("Retry in %d s, at %s.", d.ResetSeconds(), views.Absolute(res.RetryAt))}
		} else {
			res.Lines = []string{pe.Detail}
		}
	case errors.Is(pe, policy.ErrJustification):
		res.Heading = "Refused: the justification"
		res.Lines = []string{"What is wrong: " + pe.Detail + ".", "Say what you saw and why this instance, and submit again below."}
		res.Retry = validRetry(retry)
	case errors.Is(pe, policy.ErrExpiry):
		res.Heading = "Refused: the expiry"
		res.Lines = []string{pe.Detail + "."}
		res.Retry = validRetry(retry)
	case errors.Is(pe, policy.ErrSelfCosign):
		status = http.StatusForbidden
		res.Heading = "You cannot co-sign your own override"
		res.Lines = []string{"You asked for this override, so your signature is already on it. A co-signature must come from a second operator of the owning team or an admin: ask a colleague to open the service page and co-sign it."}
	case errors.Is(pe, policy.ErrForbidden):
		status = http.StatusForbidden
		res.Heading = "Not allowed"
		res.Lines = []string{pe.Detail + "."}
	case errors.Is(pe, policy.ErrCosignExpired):
		status = http.StatusGone
		res.Heading = "Too late to co-sign"
		res.Lines = []string{pe.Detail + "."}
	case errors.Is(pe, policy.ErrNotFound):
		status = http.StatusNotFound
		res.Lines = []string{pe.Detail + "."}
	case errors.Is(pe, policy.ErrConflict):
		status = http.StatusConflict
		res.Lines = []string{pe.Detail + "."}
	default:
		res.Lines = []string{pe.Detail + "."}
	}
	res.Lines = append(res.Lines, "This attempt is recorded in the audit log ("+pe.Check+" check).")
	u.render(w, r, status, views.OverrideResultPage(res))
}

// validRetry keeps a retry form only when its path parts are well formed
// (they come from the request and go back into a URL).
func validRetry(f *views.OverrideRetry) *views.OverrideRetry {
	if f == nil || !registry.ValidName(f.Service) {
		return nil
	}
	if _, err := uuid.Parse(f.InstanceID); err != nil {
		return nil
	}
	return f
}

// budgetWords renders the budget check's figures: "would leave 2 of 6
// eligible in zone az1; the contract requires 3".
func budgetWords(f map[string]any) string {
	if f == nil {
		return "would take the zone below the contract's minimum"
	}
	if f["region_eligible_after"] == 0 {
		return fmt.Sprintf("would leave 0 of %v eligible in the region", f["region_total"])
	}
	return fmt.Sprintf("would leave %v of %v eligible in zone %v; the contract requires %v (minimum healthy fraction %v)",
		f["zone_eligible_after"], f["zone_total"], f["zone"], f["zone_required"], f["min_healthy_fraction"])
}
