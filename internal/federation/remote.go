package federation

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/resolver"
)

// Cross-region resolution: a peer region's view of a service
// reaches this region's callers as the remote series
// "<service>@<region>" (stream.RemoteSeries) through the hub, and
// through GET /v1/resolve. Its endpoints name their region; the view
// names it and the aggregate's age when it was encoded.

// Encode returns v as this region serves it: the peer's view under its
// remote series name, with region set on the view and on every endpoint
// and age_seconds the aggregate's age at encoding. The checksum is the
// peer's: it covers what the peer published, which the region fields are
// not part of, so a client verifies the peer's view end to end.
//
// After the peer's versions went backwards, the version is the one this
// region serves the view under (RemoteView.Served, above every version
// served before, so its subscribers take it) and "regressed" says so
// with the figures, until the peer's version passes the one held before.
func Encode(v RemoteView, age time.Duration) []byte {
	out := struct {
		resolver.View
		Regressed *Regression `json:"regressed,omitempty"`
	}{View: v.View, Regressed: v.Regressed}
	out.Version = v.Served()
	out.Service = stream.RemoteSeries(v.View.Service, v.Region)
	out.Region = v.Region
	out.AgeSeconds = max(age, 0).Seconds()
	out.Endpoints = slices.Clone(v.View.Endpoints)
	for i := range out.Endpoints {
		out.Endpoints[i].Region = v.Region
	}
	b, err := json.Marshal(out)
	if err != nil {
		// A View holds nothing json cannot encode; should it ever,
		// nothing is served rather than half a view.
		return nil
	}
	return b
}

// Frame is v as a hub frame of its remote series.
func Frame(v RemoteView, age time.Duration) *stream.Frame {
	b := Encode(v, age)
	if b == nil {
		return nil
	}
	return &stream.Frame{Kind: stream.KindView, Service: stream.RemoteSeries(v.View.Service, v.Region), Version: v.Served(), JSON: b}
}

// SetSink has every view the aggregate takes (a newer version, or a
// partition heal's replacement) handed to sink as hub frames of their
// remote series, outside the aggregate's lock, in the follower's
// goroutine: the app publishes them into the hub (Hub.PublishRemote).
// Views already held are handed over at once.
func (a *Aggregate) SetSink(sink func([]*stream.Frame)) {
	a.mu.Lock()
	a.sink = sink
	var held []RemoteView
	for _, name := range a.order {
		for _, v := range a.regions[name].views {
			held = append(held, v)
		}
	}
	a.mu.Unlock()
	a.emit(held)
}

// Granted reports whether the peer region's grants of service (as last
// read from the peer) name caller. The peer is the authority on who may
// resolve its services; this region enforces what it said.
func (a *Aggregate) Granted(regionName, service, caller string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	r := a.regions[regionName]
	return r != nil && slices.Contains(r.grants[service], caller)
}

// Peers lists the peer regions' names, in configuration order.
func (a *Aggregate) Peers() []string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return slices.Clone(a.order)
}

// setGrants records the callers the peer granted for some of its
// services; services not in grants keep what was held (a failed read is
// no revocation).
func (a *Aggregate) setGrants(regionName string, grants map[string][]string, services []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.regions[regionName]
	if r == nil {
		return
	}
	if r.grants == nil {
		r.grants = map[string][]string{}
	}
	revoked := false
	for s, callers := range grants {
		for _, c := range r.grants[s] {
			if !slices.Contains(callers, c) {
				revoked = true
			}
		}
		r.grants[s] = callers
	}
	// A service the peer no longer lists has no grants.
	for s := range r.grants {
		if !slices.Contains(services, s) {
			revoked = revoked || len(r.grants[s]) > 0
			delete(r.grants, s)
		}
	}
	if revoked {
		close(a.revoked)
		a.revoked = make(chan struct{})
	}
}

// Revoked returns a channel closed when a peer region withdraws a grant
// it had given (a caller gone from a service's grants, or a service gone):
// open streams of remote series check their authority again, as a local
// revocation makes them (registry.AuthzCache.Revoked).
func (a *Aggregate) Revoked() <-chan struct{} {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.revoked
}

// emit hands views to the sink as frames. Called without a.mu.
func (a *Aggregate) emit(views []RemoteView) {
	a.mu.RLock()
	sink := a.sink
	now := a.now()
	frames := make([]*stream.Frame, 0, len(views))
	for _, v := range views {
		if r := a.regions[v.Region]; r != nil {
			// Served under its series' offset, as the aggregate holds it.
			if s := r.series[v.View.Service]; s != nil {
				v.Offset, v.Regressed = s.offset, s.regressed
			}
			if f := Frame(v, a.viewAge(r, v, now)); f != nil {
				frames = append(frames, f)
			}
		}
	}
	a.mu.RUnlock()
	if sink != nil && len(frames) > 0 {
		sink(frames)
	}
}

// viewAge is how old v may be at now: the region's age (the time since
// the peer last answered), or, for a region not reached since start (a
// copy loaded from disk), the time since v was received. Called with a.mu
// held.
func (a *Aggregate) viewAge(r *region, v RemoteView, now time.Time) time.Duration {
	if r.status.LastContact.IsZero() && !v.ReceivedAt.IsZero() {
		return max(now.Sub(v.ReceivedAt), a.age(r, now))
	}
	return a.age(r, now)
}
