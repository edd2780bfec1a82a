package webui

import (
	"context"
	"net/http"

	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/views"
)

// Reconciliation is what the reconciliation page reads
// (reconcile.Reconciler): the diff GET /v1/reconcile/diff answers.
type Reconciliation interface {
	Diff(ctx context.Context) (reconcile.Diff, error)
}

// reconcilePage shows each source's state and the reconciliation diff.
// Every signed-in role may read it, as every role reads the overview.
func (u *UI) reconcilePage(w http.ResponseWriter, r *http.Request, pg views.Page) {
	pg.Title, pg.Nav, pg.Refresh = "Reconciliation", "reconcile", 15
	rc := views.Reconcile{Page: pg, Counts: map[string]int{}}
	for _, k := range reconcile.DiffKinds {
		rc.Kinds = append(rc.Kinds, string(k))
	}
	if u.cfg.Reconcile == nil {
		u.render(w, r, http.StatusOK, views.ReconcilePage(rc))
		return
	}
	rc.Configured = true
	d, err := u.cfg.Reconcile.Diff(r.Context())
	if err != nil {
		u.log.Error("reconcile page: diff", "err", err)
		rc.Error = "The registry could not be read for the diff; try again in a moment."
	}
	for _, s := range d.Sources {
		src := views.ReconcileSource{Name: s.Source, LastPass: s.LastPass, LastReading: s.LastReading, Endpoints: s.Endpoints,
			Live: s.Live, Error: s.Error, Stale: s.Stale}
		if s.Hold != nil {
			src.Held, src.Had, src.HeldSince = s.Hold.Lacking, s.Hold.Had, s.Hold.Since
		}
		rc.Sources = append(rc.Sources, src)
	}
	for k, n := range d.Counts {
		rc.Counts[string(k)] = n
	}
	for _, it := range d.Items {
		rc.Items = append(rc.Items, views.ReconcileItem{Kind: string(it.Kind), Source: it.Source, Service: it.Service,
			Instance: it.Instance.String(), Key: it.Key, Address: it.Address, Port: it.Port, Zone: it.Zone, Detail: it.Detail})
	}
	u.render(w, r, http.StatusOK, views.ReconcilePage(rc))
}
