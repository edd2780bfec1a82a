package xds

import (
	"context"
	"fmt"
	jsonv2 "github.com/go-json-experiment/json"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/resolver"
)

// node is one principal's share of the cache: every stream it opened
// reads the same snapshot, the resources of the services it may resolve.
type node struct {
	key       string
	principal identity.Principal
	streams   int
	visible   map[string]access // only services it sees
}

// follow is the feeder's loop: it follows the hub for every service it
// holds a view of (and the peer regions' series, followed), rebuilds a service's resources when its view changes,
// and each node's snapshot when what it sees changes. It re-reads the
// hub's services and every node's authority every Rescan, and at once
// when the authorisation copy says authority was withdrawn.
func (s *Server) follow(ctx context.Context) {
	var (
		sub        *stream.Subscription
		subscribed []string
		hubClosed  bool
	)
	defer func() {
		if sub != nil {
			sub.Close()
		}
	}()
	resubscribe := func() {
		names := s.followed()
		if hubClosed || (sub != nil && slices.Equal(names, subscribed)) {
			return
		}
		next, err := s.cfg.Hub.Follow(names, 0)
		if err != nil {
			// The hub is closing: keep serving what is held.
			hubClosed = true
			return
		}
		if sub != nil {
			sub.Close()
		}
		sub, subscribed = next, names
		s.apply(sub.Initial)
	}
	resubscribe()
	if s.cfg.Ready() {
		s.becomeReady()
	}
	rescan := time.NewTicker(s.cfg.Rescan)
	defer rescan.Stop()
	revoked := s.cfg.Authz.Revoked()
	batch := make([]*stream.Frame, 0, 64)
	for {
		var frames <-chan *stream.Frame
		var resync <-chan struct{}
		if sub != nil {
			frames, resync = sub.C(), sub.Resync()
		}
		select {
		case <-ctx.Done():
			return
		case f := <-frames:
			batch = append(batch[:0], f)
		more:
			for len(batch) < cap(batch) {
				select {
				case f = <-frames:
					batch = append(batch, f)
				default:
					break more
				}
			}
			if slices.ContainsFunc(batch, func(f *stream.Frame) bool { return f.Kind == stream.KindDrain }) {
				// Shutting down: what is held keeps being served
				// until the streams drain.
				sub.Close()
				sub, hubClosed = nil, true
			}
			s.apply(batch)
		case <-resync:
			s.apply(sub.TakeResync())
		case <-rescan.C:
			resubscribe()
			if !s.ready.Load() && s.cfg.Ready() {
				s.becomeReady()
			}
			s.reauthorise()
		case <-revoked:
			revoked = s.cfg.Authz.Revoked()
			s.reauthorise()
		}
	}
}

// followed is what the feeder follows: every local service the hub
// holds a view of, then, when peer regions are configured, the remote
// series of those regions it holds.
func (s *Server) followed() []string {
	names := s.cfg.Hub.Services()
	if !s.remoteEnabled() {
		return names
	}
	for _, series := range s.cfg.Hub.RemoteSeries() {
		if _, region, ok := stream.SplitRemote(series); ok && slices.Contains(s.cfg.Regions, region) {
			names = append(names, series)
		}
	}
	return names
}

// remoteEnabled: peer regions' series take part in assignments.
func (s *Server) remoteEnabled() bool {
	return len(s.cfg.Regions) > 0 && s.cfg.MayResolveRemote != nil
}

// apply takes the series the frames name, rebuilds the services whose
// local view or peer region's series in the hub is newer than what is
// held (a frame of SERVICE@REGION rebuilds SERVICE), and sets the
// snapshot of every node that sees one of them.
func (s *Server) apply(frames []*stream.Frame) {
	var names []string
	for _, f := range frames {
		if (f.Kind == stream.KindView || f.Kind == stream.KindDelta) && !slices.Contains(names, f.Service) {
			names = append(names, f.Service)
		}
	}
	if len(names) == 0 {
		return
	}
	now := s.cfg.Now()
	built := map[string]*serviceResources{}
	for _, series := range names {
		service, region, remote := stream.SplitRemote(series)
		if !remote {
			service = series
		} else if !s.remoteEnabled() || !slices.Contains(s.cfg.Regions, region) {
			continue
		}
		f, ok := s.cfg.Hub.View(series)
		if !ok {
			continue
		}
		sr := built[service]
		if sr == nil {
			s.mu.Lock()
			sr = s.services[service]
			s.mu.Unlock()
		}
		held := sr.part(region, remote)
		if held != nil && held.version >= f.Version {
			continue
		}
		p, err := buildPart(series, f, now)
		if err != nil {
			// A view the hub holds always decodes; should one not, the
			// last good resources keep serving.
			s.log.Error("build xDS resources; the last ones keep serving", "series", series, "version", f.Version, "err", err)
			continue
		}
		if built[service] == nil {
			if sr, err = s.successor(service, sr); err != nil {
				s.log.Error("build xDS resources; the last ones keep serving", "service", service, "err", err)
				continue
			}
			built[service] = sr
		}
		if remote {
			sr.remote[region] = p
		} else {
			sr.local, sr.version = p, p.version
			s.notePublished(f.Version, service, f.PublishedAt)
		}
	}
	if len(built) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, sr := range built {
		s.services[name] = sr
	}
	for _, n := range s.nodes {
		touched := false
		for name, sr := range built {
			if a := s.accessOf(n.principal, sr); a.visible() {
				n.visible[name], touched = a, true
			} else if _, ok := n.visible[name]; ok {
				delete(n.visible, name)
				touched = true
			}
		}
		if touched {
			s.setSnapshot(n)
		}
	}
}

// part is the held part of the local view (remote false) or of region's
// series; nil when none is held.
func (sr *serviceResources) part(region string, remote bool) *part {
	switch {
	case sr == nil:
		return nil
	case remote:
		return sr.remote[region]
	}
	return sr.local
}

// buildPart decodes a view frame of series into its assignment.
func buildPart(series string, f *stream.Frame, now time.Time) (*part, error) {
	var v resolver.View
	if err := jsonv2.Unmarshal(f.JSON, &v); err != nil {
		return nil, fmt.Errorf("decode view: %w", err)
	}
	snap, err := resolver.SnapshotOf(v, now)
	if err != nil {
		return nil, err
	}
	return &part{series: series, version: v.Version, cla: Assignment(snap), share: snap.TrafficShare()}, nil
}

// successor is a copy of have (nil: none yet) to change parts of, with
// its static resources (built when have is nil) and no assignments.
func (s *Server) successor(service string, have *serviceResources) (*serviceResources, error) {
	if have != nil {
		sr := *have
		sr.remote = maps.Clone(have.remote)
		sr.assignments = map[access]*assignment{}
		return &sr, nil
	}
	sr := &serviceResources{name: service, remote: map[string]*part{}, assignments: map[access]*assignment{}}
	l, r, c, err := staticResources(service)
	if err != nil {
		return nil, err
	}
	for _, x := range []struct {
		r  proto.Message
		to **shared
	}{{l, &sr.listener}, {r, &sr.route}, {c, &sr.cluster}} {
		v, err := contentVersion(x.r)
		if err != nil {
			return nil, err
		}
		if *x.to, err = newShared(service, v, x.r, 0); err != nil {
			return nil, err
		}
	}
	return sr, nil
}

// reauthorise recomputes what every node sees, and sets the snapshot of
// those whose set changed (a grant given or withdrawn, here or in a peer
// region; a service gone).
func (s *Server) reauthorise() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.nodes {
		visible := s.visibleTo(n.principal)
		if !maps.Equal(visible, n.visible) {
			n.visible = visible
			s.setSnapshot(n)
		}
	}
}

// visibleTo is what p sees of each held service it sees anything of.
// s.mu held.
func (s *Server) visibleTo(p identity.Principal) map[string]access {
	out := map[string]access{}
	for name, sr := range s.services {
		if a := s.accessOf(p, sr); a.visible() {
			out[name] = a
		}
	}
	return out
}

// accessOf is what p sees of sr: the local view when it may resolve the
// service here, and each peer region's series held whose grants let it
// resolve the service there (Config.MayResolveRemote). A service this
// region holds a view of and p may not resolve here is not seen at all,
// as /v1/watch refuses it; one held only by peer regions is seen with
// their priorities alone. s.mu held.
func (s *Server) accessOf(p identity.Principal, sr *serviceResources) access {
	var a access
	if sr.local != nil {
		if !s.mayResolve(p, sr.name) {
			return access{}
		}
		a.local = true
	}
	if !s.remoteEnabled() || len(sr.remote) == 0 {
		return a
	}
	var regions []string
	for _, r := range s.cfg.Regions {
		if sr.remote[r] != nil && s.cfg.MayResolveRemote(p, r, sr.name) {
			regions = append(regions, r)
		}
	}
	a.regions = strings.Join(regions, ",")
	return a
}

// assignmentOf is sr's assignment as a node with access a sees it, built
// once per change of sr and shared. s.mu held.
func (s *Server) assignmentOf(sr *serviceResources, a access) (*assignment, error) {
	if x := sr.assignments[a]; x != nil {
		return x, nil
	}
	var local *tier
	if a.local && sr.local != nil {
		region := ""
		if s.remoteEnabled() {
			region = s.cfg.Region
		}
		local = &tier{region: region, series: sr.local.series, version: sr.local.version, cla: sr.local.cla, share: sr.local.share}
	}
	var remotes []*tier
	if a.regions != "" {
		for r := range strings.SplitSeq(a.regions, ",") {
			if p := sr.remote[r]; p != nil {
				remotes = append(remotes, &tier{region: r, series: p.series, version: p.version, cla: p.cla, share: p.share})
			}
		}
	}
	cla, version, lead := mergeTiers(sr.name, local, remotes)
	sh, err := newShared(sr.name, version, cla, lead)
	if err != nil {
		return nil, err
	}
	x := &assignment{cla: cla, version: version, lead: lead, shared: sh}
	sr.assignments[a] = x
	return x, nil
}

// mayResolve is the authorisation copy's decision; a copy not loaded yet
// (or any error) sees nothing.
func (s *Server) mayResolve(p identity.Principal, service string) bool {
	return s.cfg.Authz.MayResolve(p, service) == nil
}

// becomeReady gives every node its snapshot, once muster can answer for
// what exists (Config.Ready).
func (s *Server) becomeReady() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready.Store(true)
	for _, n := range s.nodes {
		n.visible = s.visibleTo(n.principal)
		s.setSnapshot(n)
	}
	s.log.Info("xDS answering: views and authorisations are in", "services", len(s.services), "nodes", len(s.nodes))
}

// setSnapshot gives n's streams the resources it may see; nothing until
// the server is ready. s.mu held.
func (s *Server) setSnapshot(n *node) {
	if !s.ready.Load() {
		return
	}
	list := make([]nodeService, 0, len(n.visible))
	for name, a := range n.visible {
		sr := s.services[name]
		if sr == nil {
			continue
		}
		x, err := s.assignmentOf(sr, a)
		if err != nil {
			// Never expected (the resource encodes); the node goes on
			// without the service rather than without its snapshot.
			s.log.Error("build xDS assignment", "service", name, "err", err)
			continue
		}
		list = append(list, nodeService{sr, x})
	}
	s.cache.SetSnapshot(n.key, newNodeSnapshot(list))
}

// publication is when the hub received a local view, and its service.
type publication struct {
	at      time.Time
	service string
}

// notePublished remembers, for the last 4096 local views built, when
// the hub received their version and whose it is (for the push latency
// histograms).
func (s *Server) notePublished(version uint64, service string, at time.Time) {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	s.published[version] = publication{at: at, service: service}
	s.pubOrder = append(s.pubOrder, version)
	if len(s.pubOrder) > 4096 {
		for _, v := range s.pubOrder[:1024] {
			delete(s.published, v)
		}
		s.pubOrder = slices.Delete(s.pubOrder, 0, 1024)
	}
}

// publishedAt returns when the hub received version, and its service.
func (s *Server) publishedAt(version uint64) (publication, bool) {
	s.pubMu.RLock()
	defer s.pubMu.RUnlock()
	at, ok := s.published[version]
	return at, ok
}
