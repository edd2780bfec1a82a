package webui

import (
	"fmt"
	"net/http"
	"net/netip"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/views"
)

// deregisterInstance is the service page's "Deregister…" form. It goes
// through policy.Service.Deregister with the session's principal, the
// checked and audited path of DELETE /v1/instances/{id}: a signed-in
// operator is never the instance itself, so it is always an override.
// Action has already refused (and audited) viewers.
func (u *UI) deregisterInstance(w http.ResponseWriter, r *http.Request, p identity.Principal) {
	service := r.PathValue("name")
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		u.message(w, r, http.StatusNotFound, "No such instance", "This form does not name an instance.")
		return
	}
	just := r.PostFormValue("justification")
	// No source address and no instance credential: the UI's peer is the
	// operator's browser, never the instance.
	d, err := u.cfg.Overrides.Deregister(r.Context(), p, netip.Addr{}, registry.Credential{}, id, policy.DeregisterRequest{Justification: just})
	if err != nil {
		retry := &views.OverrideRetry{Service: service, InstanceID: id.String(), Action: string(policy.Deregister), Justification: just}
		u.overrideRefused(w, r, p, service, "Deregistration refused", err, retry)
		return
	}
	in := d.Instance
	res := views.OverrideResult{Page: u.resultPage(p, "Instance deregistered"), Service: in.Service, Outcome: "accepted",
		Heading: "Instance deregistered"}
	if d.Override == nil {
		res.Heading = "Already ended"
		res.Lines = []string{fmt.Sprintf("Instance %s had already ended (%s); nothing changed. The attempt is recorded in the audit log.", in.ID, in.State)}
	} else {
		row := overrideRow(*d.Override, p)
		res.Override = &row
		res.Lines = []string{
			fmt.Sprintf("%s (%s:%d in %s) is deregistered: it leaves the next view of %s and is never routed to again. Its process comes back only by registering again, as a new instance.",
				in.ID, in.Address, in.Port, in.Zone, in.Service),
			"It was within the disruption budget. The decision and your justification are in the audit log.",
		}
	}
	u.render(w, r, http.StatusOK, views.OverrideResultPage(res))
}
