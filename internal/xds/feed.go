package xds

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"

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
	visible   map[string]bool
}

// follow is the feeder's loop: it follows the hub for every service it
// holds a view of, rebuilds a service's resources when its view changes,
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
		names := s.cfg.Hub.Services()
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

// apply takes the services the frames name, rebuilds those whose view in
// the hub is newer than what is held, and sets the snapshot of every node
// that sees one of them.
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
	built := make(map[string]*serviceResources, len(names))
	for _, name := range names {
		f, ok := s.cfg.Hub.View(name)
		if !ok {
			continue
		}
		s.mu.Lock()
		have := s.services[name]
		s.mu.Unlock()
		if have != nil && have.version >= f.Version {
			continue
		}
		sr, err := s.build(f, have, now)
		if err != nil {
			// A view the hub holds always decodes; should one not, the
			// last good resources keep serving.
			s.log.Error("build xDS resources; the last ones keep serving", "service", name, "version", f.Version, "err", err)
			continue
		}
		built[name] = sr
		s.notePublished(f.Version, f.PublishedAt, sr.claHash)
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
		for name := range built {
			if !n.visible[name] && s.mayResolve(n.principal, name) {
				n.visible[name] = true
			}
			touched = touched || n.visible[name]
		}
		if touched {
			s.setSnapshot(n)
		}
	}
}

// build decodes a view frame into the service's resources, reusing the
// static ones already built.
func (s *Server) build(f *stream.Frame, have *serviceResources, now time.Time) (*serviceResources, error) {
	var v resolver.View
	if err := json.Unmarshal(f.JSON, &v); err != nil {
		return nil, fmt.Errorf("decode view: %w", err)
	}
	snap, err := resolver.SnapshotOf(v, now)
	if err != nil {
		return nil, err
	}
	sr := &serviceResources{name: v.Service, version: v.Version, cla: Assignment(snap)}
	if sr.claHash, err = contentVersion(sr.cla); err != nil {
		return nil, err
	}
	if have != nil {
		sr.listener, sr.route, sr.cluster = have.listener, have.route, have.cluster
		sr.listenerVersion, sr.routeVersion, sr.clusterVersion = have.listenerVersion, have.routeVersion, have.clusterVersion
		return sr, nil
	}
	if sr.listener, sr.route, sr.cluster, err = staticResources(v.Service); err != nil {
		return nil, err
	}
	for _, x := range []struct {
		r types.Resource
		v *string
	}{{sr.listener, &sr.listenerVersion}, {sr.route, &sr.routeVersion}, {sr.cluster, &sr.clusterVersion}} {
		if *x.v, err = contentVersion(x.r); err != nil {
			return nil, err
		}
	}
	return sr, nil
}

// reauthorise recomputes what every node sees, and sets the snapshot of
// those whose set changed (a grant given or withdrawn, a service gone).
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

// visibleTo is the set of held services p may resolve. s.mu held.
func (s *Server) visibleTo(p identity.Principal) map[string]bool {
	out := map[string]bool{}
	for name := range s.services {
		if s.mayResolve(p, name) {
			out[name] = true
		}
	}
	return out
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
	list := make([]*serviceResources, 0, len(n.visible))
	for name := range n.visible {
		if sr := s.services[name]; sr != nil {
			list = append(list, sr)
		}
	}
	if err := s.cache.SetSnapshot(context.Background(), n.key, newNodeSnapshot(list)); err != nil {
		s.log.Error("set xDS snapshot", "node", n.key, "err", err)
	}
}

// notePublished remembers, for the last 4096 assignments built, when the
// hub received their version (for the push latency histogram) and which
// version an assignment's bytes belong to: go-control-plane's delta
// responses name a resource's version by a hash of its bytes, and muster
// sends its view version instead (deltaVersions).
func (s *Server) notePublished(version uint64, at time.Time, claHash string) {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	s.published[version] = at
	s.claVersions[claHash] = version
	s.pubOrder = append(s.pubOrder, published{version, claHash})
	if len(s.pubOrder) > 4096 {
		for _, p := range s.pubOrder[:1024] {
			delete(s.published, p.version)
			if s.claVersions[p.hash] == p.version {
				delete(s.claVersions, p.hash)
			}
		}
		s.pubOrder = slices.Delete(s.pubOrder, 0, 1024)
	}
}

type published struct {
	version uint64
	hash    string
}

// claVersion is the view version of service's assignment whose bytes
// hash to h: the held assignment's when it is those bytes, else that of
// one of the last 4096 built. The held one comes first because the
// remembered hashes are this process's history: a service whose view has
// not changed while 4096 others were built would otherwise be sent under
// its hash on this replica and under its view version on one that built
// it later (issue 27: every replica names a resource alike).
func (s *Server) claVersion(service, h string) (uint64, bool) {
	s.mu.Lock()
	sr := s.services[service]
	s.mu.Unlock()
	if sr != nil && sr.claHash == h {
		return sr.version, true
	}
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	v, ok := s.claVersions[h]
	return v, ok
}

// publishedAt returns when the hub received version.
func (s *Server) publishedAt(version uint64) (time.Time, bool) {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	at, ok := s.published[version]
	return at, ok
}
