package webui

import (
	"fmt"
	"net/http"

	"github.com/musterhq/muster/internal/federation"
	"github.com/musterhq/muster/internal/routingcontrol"
	"github.com/musterhq/muster/views"
)

// PeerRegions is what the regions page reads of the federation
// (federation.Aggregate).
type PeerRegions interface {
	Regions() []federation.PeerStatus
}

// RoutingControls is what the regions page reads of the routing controls
// (routingcontrol.Controls).
type RoutingControls interface {
	Status() routingcontrol.Status
}

// regressedRows describes a peer's regressed services for the page.
func regressedRows(rs []federation.RegressedService) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%s (held v%d, took v%d)", r.Service, r.From, r.To))
	}
	return out
}

// regionsPage shows this region, the peer regions it follows (link, age,
// staleness, heals) and the routing controls it reads, as GET
// /v1/regions and GET /v1/routing-controls do. Every signed-in role may
// read it.
func (u *UI) regionsPage(w http.ResponseWriter, r *http.Request, pg views.Page) {
	pg.Title, pg.Nav, pg.Refresh = "Regions", "regions", 10
	rp := views.Regions{Page: pg, Region: u.cfg.Region, StaleAfter: u.cfg.PeerStaleAfter}
	controls := map[string]string{}
	if u.cfg.RoutingControls != nil {
		st := u.cfg.RoutingControls.Status()
		rp.Controls, rp.ControlSource, rp.ControlStale = []views.RoutingControlRow{}, st.Source+" "+st.Location, st.Stale
		for _, c := range st.Regions {
			rp.Controls = append(rp.Controls, views.RoutingControlRow{Region: c.Region, State: string(c.State), Since: c.Since, Named: c.Named})
			controls[c.Region] = string(c.State)
		}
	}
	if u.cfg.PeerRegions != nil {
		for _, p := range u.cfg.PeerRegions.Regions() {
			control := controls[p.Region]
			if control == "" && u.cfg.RoutingControls != nil {
				control = string(routingcontrol.On) // a region the source does not name is On
			}
			rp.Peers = append(rp.Peers, views.PeerRegionRow{Region: p.Region, URLs: p.URLs, Connected: p.Connected, Synced: p.Synced,
				LastContact: p.LastContact, AgeSeconds: p.AgeSeconds, Stale: p.Stale, Services: len(p.Services), Reconnects: p.Reconnects,
				Reconciliations: p.Reconciliations, LastReconciliation: p.LastReconciliation, LastError: p.LastError, Control: control,
				Regressed: regressedRows(p.Regressed)})
		}
	}
	u.render(w, r, http.StatusOK, views.RegionsPage(rp))
}
