package server

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/musterhq/muster/internal/federation"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/stream"
)

// Cross-region resolution (ADR-14). A peer region's view of a
// service is served here as the remote series "<service>@<region>"
// (stream.RemoteSeries), from the read-only aggregate: its endpoints
// name their region and it carries the aggregate's age. Who may resolve
// it is the peer's decision: its grants, as the federation follower last
// read them (operators and tools by role, as for local services).
//
// A watch asks for remote series with regions=<region>,... (in the
// caller's order of preference): each service it names is then served
// locally when it exists here, plus from each of those regions holding
// it. The client prefers its own region and uses a remote one only when
// the local one has no routable capacity (resolver.Config.Regions).

// mayResolveSeries is MayResolve for a local service or a remote series.
func (s *Server) mayResolveSeries(actor identity.Principal, name string) error {
	svc, region, ok := stream.SplitRemote(name)
	if !ok {
		return s.cfg.Authz.MayResolve(actor, name)
	}
	granted := func(string) bool { return false }
	if s.cfg.Regions != nil {
		granted = func(caller string) bool { return s.cfg.Regions.Granted(region, svc, caller) }
	}
	return registry.MayResolveGranted(actor, svc, granted)
}

// parseRegions reads a watch's or resolve's regions parameters: region
// names, comma-separated or repeated, in the caller's order of
// preference, without duplicates.
func parseRegions(values []string) ([]string, *Problem) {
	var out []string
	for _, v := range values {
		for name := range strings.SplitSeq(v, ",") {
			name = strings.TrimSpace(name)
			if name == "" {
				continue
			}
			if !federation.ValidName(name) {
				return nil, problem(http.StatusBadRequest, "bad-parameter", fmt.Sprintf("regions: %q is not a region name (a DNS label)", name))
			}
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	return out, nil
}

// remoteView is the aggregate's view of service from region, when held.
func (s *Server) remoteView(region, service string) (federation.RemoteView, time.Duration, bool) {
	if s.cfg.Regions == nil {
		return federation.RemoteView{}, 0, false
	}
	return s.cfg.Regions.View(region, service)
}

// authoriseSeries resolves and authorises what a watch names: each local
// service as authoriseViews does, each remote series "<service>@<region>"
// against its region's grants, and, for the regions asked for, the
// remote series of every local name those regions hold. A local name that
// exists nowhere is 404; one that exists only in peer regions that did
// not grant the caller is 403. It returns the series, sorted.
func (s *Server) authoriseSeries(w http.ResponseWriter, r *http.Request, names, regions []string) ([]string, bool) {
	actor := principal(r)
	var out []string
	for _, name := range names {
		if svc, region, ok := stream.SplitRemote(name); ok {
			if !registry.ValidName(svc) || !federation.ValidName(region) {
				writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", fmt.Sprintf("%q is not a service name nor <service>@<region>", name)))
				return nil, false
			}
			if err := s.mayResolveSeries(actor, name); err != nil {
				s.writeError(w, r, err)
				return nil, false
			}
			if _, _, held := s.remoteView(region, svc); !held {
				writeProblem(w, r, problem(http.StatusNotFound, "not-found", "no view of "+svc+" from region "+region+" is held here"))
				return nil, false
			}
			out = append(out, name)
			continue
		}
		if len(regions) == 0 {
			if !s.authoriseViews(w, r, []string{name}) {
				return nil, false
			}
			out = append(out, name)
			continue
		}
		if !registry.ValidName(name) {
			writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", fmt.Sprintf("%q is not a service name", name)))
			return nil, false
		}
		exists, err := s.cfg.Authz.ServiceExists(name)
		if err != nil {
			s.writeError(w, r, err)
			return nil, false
		}
		found := exists
		if exists {
			if err := s.cfg.Authz.MayResolve(actor, name); err != nil {
				s.writeError(w, r, err)
				return nil, false
			}
			out = append(out, name)
		}
		var refused error
		for _, region := range regions {
			if _, _, held := s.remoteView(region, name); !held {
				continue
			}
			found = true
			series := stream.RemoteSeries(name, region)
			if err := s.mayResolveSeries(actor, series); err != nil {
				refused = err
				continue
			}
			out = append(out, series)
		}
		switch {
		case !found:
			writeProblem(w, r, problem(http.StatusNotFound, "not-found", "no service named "+name+" here or in regions "+strings.Join(regions, ", ")))
			return nil, false
		case !exists && refused != nil && !slices.ContainsFunc(out, func(s string) bool { sv, _, _ := stream.SplitRemote(s); return sv == name }):
			s.writeError(w, r, refused)
			return nil, false
		}
	}
	slices.Sort(out)
	return slices.Compact(out), true
}

// resolveRemote answers GET /v1/resolve for a remote series: the peer's
// view as this region holds it, with its region on the view and every
// endpoint and its age now. Age is also in the Age header (whole
// seconds, rounded up) and the region in Muster-Region.
func (s *Server) resolveRemote(w http.ResponseWriter, r *http.Request, region, service string) {
	v, age, ok := s.remoteView(region, service)
	if !ok {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "no view of "+service+" from region "+region+" is held here"))
		return
	}
	b := federation.Encode(v, age)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("ETag", `"`+strconv.FormatUint(v.Served(), 10)+`"`)
	h.Set("Muster-Region", region)
	h.Set("Age", strconv.FormatInt(int64(math.Ceil(age.Seconds())), 10))
	h.Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// pickRegion chooses the region a resolve of a service that is not local
// answers from: among regions (the caller's, else every peer, in
// configuration order) holding it and granting the caller, the first
// with a routable endpoint, else the first.
func (s *Server) pickRegion(actor identity.Principal, service string, regions []string) (string, error) {
	if s.cfg.Regions == nil {
		return "", nil
	}
	if len(regions) == 0 {
		regions = s.cfg.Regions.Peers()
	}
	first := ""
	var refused error
	for _, region := range regions {
		v, _, ok := s.remoteView(region, service)
		if !ok {
			continue
		}
		if err := s.mayResolveSeries(actor, stream.RemoteSeries(service, region)); err != nil {
			refused = err
			continue
		}
		if first == "" {
			first = region
		}
		for _, e := range v.View.Endpoints {
			if e.Weight > 0 {
				return region, nil
			}
		}
	}
	if first == "" && refused != nil {
		return "", refused
	}
	return first, nil
}
