package webui

import (
	"errors"
	"net/http"
	"time"

	"github.com/musterhq/muster/internal/lagstats"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/views"
)

// lagPage shows a service's lag histograms (lagstats). Every signed-in
// role may read it.
func (u *UI) lagPage(w http.ResponseWriter, r *http.Request, pg views.Page) {
	name := r.PathValue("name")
	if !registry.ValidName(name) {
		u.message(w, r, http.StatusNotFound, "No such service", "Service names are DNS labels; there is no service "+truncate(name)+".")
		return
	}
	if u.cfg.Lags == nil {
		u.message(w, r, http.StatusNotFound, "No measurements", "This muster keeps no lag measurements.")
		return
	}
	if _, err := u.cfg.Registry.GetService(r.Context(), principalFrom(r.Context()), name); errors.Is(err, registry.ErrNotFound) {
		u.message(w, r, http.StatusNotFound, "No such service", "There is no service "+name+" in the registry.")
		return
	} else if err != nil {
		u.log.Error("lag page", "service", name, "err", err)
		u.message(w, r, http.StatusServiceUnavailable, "Lag page unavailable", "The registry could not be read; try again in a moment.")
		return
	}
	pg.Title, pg.Nav, pg.Refresh, pg.Live = name+": propagation", "overview", 15, pg.Base+"/events?service="+name
	l := views.Lag{Page: pg, Service: name}
	for _, h := range u.cfg.Lags.Of(name) {
		lh := lagHistogram(h)
		l.Histograms = append(l.Histograms, lh)
	}
	u.render(w, r, http.StatusOK, views.LagPage(l))
}

// lagHistogram is a stage's histogram as the page draws it.
func lagHistogram(h lagstats.Histogram) views.LagHistogram {
	out := views.LagHistogram{Stage: h.Stage.String(), Total: h.Total, Mean: h.Mean.Round(100 * time.Microsecond).String()}
	switch h.Stage {
	case lagstats.Published:
		out.Title = "Withdrawals: first failed sample to published"
		out.Help = "For each withdrawal, from the first failed sample muster took to the view without the instance (the publisher's measurement)."
	case lagstats.Delivered:
		out.Title = "Changes: published to each watch stream"
		out.Help = "For each view change and each watch stream it was written to, from the hub taking it to the frame written."
	case lagstats.DeliveredXDS:
		out.Title = "Changes: published to each xDS stream"
		out.Help = "For each view change and each xDS stream it was pushed to, from the hub taking it to the response carrying its assignment sent (as muster_xds_push_latency_seconds, per service)."
	}
	for i, c := range h.Counts {
		b := views.LagBucket{Count: c}
		if i < len(lagstats.Bounds) {
			b.Short = lagstats.Bounds[i].String()
			b.Label = "≤ " + b.Short
		} else {
			b.Short = ">" + lagstats.Bounds[len(lagstats.Bounds)-1].String()
			b.Label = "> " + lagstats.Bounds[len(lagstats.Bounds)-1].String()
		}
		out.Buckets = append(out.Buckets, b)
	}
	return out
}
