package stream

import (
	"slices"
	"strings"

	"github.com/musterhq/muster/resolver"
)

// A remote series carries a peer region's view of one of its services
// through this region's hub, so the watch stream, held=
// resumption and the surfaces that follow the hub serve it as they serve
// a local service. Its name is "<service>@<region>": a service name
// cannot hold '@', so no local service is ever taken for one. Its
// versions are the peer's own (issued by the peer's owner of the
// service), the same on every replica of this region that follows the
// peer.
//
// Remote series are not local services: Services, Snapshot and Views
// leave them out (no publisher restores one, no peer relays one, the
// readiness count ignores them); RemoteSeries lists them.

// RemoteSeries names the series of service's view in a peer region
// (resolver.RemoteSeries: the client library names it the same way).
func RemoteSeries(service, region string) string { return resolver.RemoteSeries(service, region) }

// SplitRemote splits a remote series name into its service and region;
// ok is false for a local service's name.
func SplitRemote(name string) (service, region string, ok bool) { return resolver.SplitSeries(name) }

// isRemote reports whether name is a remote series.
func isRemote(name string) bool { return strings.IndexByte(name, '@') >= 0 }

// RemoteSeries lists the remote series the hub holds a view of, sorted.
func (h *Hub) RemoteSeries() []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []string
	for name, st := range h.services {
		if st.view != nil && isRemote(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// PublishRemote records views of remote series (a peer region's views,
// as this region's federation follower received them) and delivers them
// to their subscribers. As Relay, a view at or below the version held is
// dropped, so every replica following the peer serves the same series;
// unlike Publish and Relay, nothing goes to the taps (each replica
// follows the peers itself) or counts as relayed. Frames whose service is
// not a remote series are ignored.
func (h *Hub) PublishRemote(views []*Frame) int {
	updates := make([]Update, 0, len(views))
	for _, f := range views {
		if f != nil && isRemote(f.Service) {
			updates = append(updates, Update{View: f})
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.apply(updates))
}
