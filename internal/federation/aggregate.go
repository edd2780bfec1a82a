package federation

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/resolver"
)

// RemoteView is a peer region's view of one of its services as the
// aggregate holds it.
type RemoteView struct {
	// Region is the peer region the view comes from.
	Region string
	// View is the view, exactly as the peer published it (the peer's
	// version; endpoints with the peer's zones).
	View resolver.View
	// ReceivedAt is when this region received that version.
	ReceivedAt time.Time
	// Offset is added to the peer's version to make the version this
	// region serves the view under (Served): 0 until the peer's versions
	// once went backwards (Regression), so this region's subscribers,
	// who hold the versions served before, take the peer's new views.
	Offset uint64
	// Regressed is set while the peer's versions of this service are
	// below those this region held before they went backwards.
	Regressed *Regression
}

// Served is the version this region serves v under: the peer's, plus
// the offset a regression left.
func (v RemoteView) Served() uint64 { return v.View.Version + v.Offset }

// Regression says that a peer's versions of one of its services went
// backwards (its database restored, its history lost): this region held
// From and took the peer's To all the same, since the peer is the
// authority on its own services. It clears when the peer's version
// passes From again.
type Regression struct {
	// From is the peer's version this region held before; To the
	// (lower) one it took.
	From uint64 `json:"from_version"`
	To   uint64 `json:"to_version"`
	// Served is the version this region served To under: above every
	// version it served before, so its subscribers take it.
	Served uint64    `json:"served_version"`
	Since  time.Time `json:"since"`
}

// RegressedService is one service of a peer region whose versions went
// backwards, for GET /v1/regions and the peer_regressed alarm.
type RegressedService struct {
	Service string `json:"service"`
	Regression
}

// series is what the aggregate keeps of one remote series beyond its
// view: the offset its served versions carry and its regression. It
// outlives the view (a service the peer stops listing and lists again
// keeps its offset), so the versions served never go back.
type series struct {
	offset    uint64
	regressed *Regression
}

// PeerStatus describes the link to one peer region, for GET /v1/regions.
type PeerStatus struct {
	// Region is the peer's region name; URLs its replicas' base URLs.
	Region string   `json:"region"`
	URLs   []string `json:"urls"`
	// Connected: a watch stream to the peer is open now.
	Connected bool `json:"connected"`
	// Synced: the open stream has caught up with every service followed.
	Synced bool `json:"synced"`
	// Partitioned: the copy is not known to match the peer (it went
	// stale, or was loaded from disk at start); the next sync replaces it
	// whole and, when it was a partition or something changed, audits it.
	Partitioned bool `json:"partitioned"`
	// LastContact is when the peer last answered (an open stream, a
	// frame, a service list); zero: never since start.
	LastContact time.Time `json:"last_contact,omitzero"`
	// AgeSeconds is how old the aggregate's copy of the peer may be: the
	// time since the peer last answered (since start when it never has).
	// Remote endpoints are as fresh as this.
	AgeSeconds float64 `json:"age_seconds"`
	// Stale: no contact for longer than the stale threshold; the
	// peer_stale alarm is open.
	Stale bool `json:"stale"`
	// Services are the peer's services followed, sorted.
	Services []string `json:"services"`
	// Regressed lists the services whose versions went backwards at the
	// peer and have not passed the versions held before (peer_regressed).
	Regressed []RegressedService `json:"regressed,omitempty"`
	// Reconnects counts watch subscriptions after the first, and
	// Reconciliations the partition heals since start.
	Reconnects      uint64 `json:"reconnects"`
	Reconciliations uint64 `json:"reconciliations"`
	// LastReconciliation is when the last heal replaced the copy.
	LastReconciliation time.Time `json:"last_reconciliation,omitzero"`
	// LastError is why the last watch or service list failed; tokens are
	// never in it.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
}

// AlarmPeerStale is raised, per peer region, while the peer has not been
// reached for longer than the stale threshold: cross-region answers for
// its services come from a copy that old. Local resolution is untouched.
const AlarmPeerStale = "peer_stale"

// AlarmPeerRegressed is raised, per peer region, while some of its
// services' versions are below those this region held before: the peer's
// database was restored or its history lost. This region serves the
// peer's current views all the same (marked regressed).
const AlarmPeerRegressed = "peer_regressed"

// Aggregate is the read-only, in-memory aggregate of the peer regions:
// per region, per service, the newest view received, and each region's
// link status. Readers never block the followers for long: every call
// takes one lock briefly. Only the followers write it.
type Aggregate struct {
	now        func() time.Time
	staleAfter time.Duration

	mu      sync.RWMutex
	regions map[string]*region
	order   []string
	sink    func([]*stream.Frame)
	// revoked is closed and replaced when a peer withdraws a grant.
	revoked chan struct{}
}

type region struct {
	views map[string]RemoteView
	// series holds each remote series' offset and regression.
	series map[string]*series
	// seriesRev counts changes to series (for the follower's copy on
	// disk).
	seriesRev uint64
	// grants are the callers the peer granted, per service, as last read.
	grants map[string][]string
	status PeerStatus
	// since is when the region's clock of staleness started: the start,
	// until the first contact.
	since time.Time
}

// NewAggregate returns an empty aggregate of peers (in that order).
func NewAggregate(peers []PeerConfig, staleAfter time.Duration, now func() time.Time) *Aggregate {
	if now == nil {
		now = time.Now
	}
	a := &Aggregate{now: now, staleAfter: staleAfter, regions: map[string]*region{}, revoked: make(chan struct{})}
	t := now()
	for _, p := range peers {
		a.regions[p.Name] = &region{views: map[string]RemoteView{}, series: map[string]*series{}, since: t,
			status: PeerStatus{Region: p.Name, URLs: slices.Clone(p.URLs), Services: []string{}}}
		a.order = append(a.order, p.Name)
	}
	return a
}

// View returns region's view of service and its age: how long ago the
// peer last answered (while its stream is open, a moment). ok is false
// when the aggregate holds no view of that service.
func (a *Aggregate) View(regionName, service string) (v RemoteView, age time.Duration, ok bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	r := a.regions[regionName]
	if r == nil {
		return RemoteView{}, 0, false
	}
	v, ok = r.views[service]
	if !ok {
		return RemoteView{}, 0, false
	}
	return v, a.viewAge(r, v, a.now()), true
}

// Services lists the services of region the aggregate holds a view of.
func (a *Aggregate) Services(regionName string) []string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	r := a.regions[regionName]
	if r == nil {
		return nil
	}
	out := make([]string, 0, len(r.views))
	for s := range r.views {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Regions lists the peer regions' link status, in configuration order.
func (a *Aggregate) Regions() []PeerStatus {
	a.mu.RLock()
	defer a.mu.RUnlock()
	now := a.now()
	out := make([]PeerStatus, 0, len(a.order))
	for _, name := range a.order {
		out = append(out, a.statusOf(a.regions[name], now))
	}
	return out
}

// statusOf is r's status at now, its age and staleness computed.
func (a *Aggregate) statusOf(r *region, now time.Time) PeerStatus {
	st := r.status
	st.URLs = slices.Clone(st.URLs)
	st.Services = slices.Clone(st.Services)
	st.Regressed = r.regressed()
	age := a.age(r, now)
	st.AgeSeconds = age.Seconds()
	st.Stale = age > a.staleAfter
	return st
}

func (a *Aggregate) age(r *region, now time.Time) time.Duration {
	from := r.status.LastContact
	if from.IsZero() {
		from = r.since
	}
	return max(now.Sub(from), 0)
}

// Alarms returns an AlarmPeerRegressed for each peer region with
// regressed services and an AlarmPeerStale for each peer region not
// reached for longer than the stale threshold.
func (a *Aggregate) Alarms() []assembler.Alarm {
	out := a.regressedAlarms()
	now := a.now()
	for _, st := range a.Regions() {
		if !st.Stale {
			continue
		}
		since := st.LastContact
		why := "never reached since start"
		if since.IsZero() {
			since = now.Add(-time.Duration(st.AgeSeconds * float64(time.Second)))
		} else {
			why = "last reached " + since.UTC().Format(time.RFC3339)
		}
		if st.LastError != "" {
			why += "; last error: " + st.LastError
		}
		out = append(out, assembler.Alarm{Kind: AlarmPeerStale, Since: since, Detail: fmt.Sprintf(
			"peer region %s (%s) has not been reached for %s (%s): cross-region answers for its %d services come from a copy that old; this region's own resolution is unaffected",
			st.Region, strings.Join(st.URLs, ", "), time.Duration(st.AgeSeconds*float64(time.Second)).Truncate(time.Second), why, len(st.Services))})
	}
	return out
}

// regressed lists r's regressed services, sorted. Called with a.mu held.
func (r *region) regressed() []RegressedService {
	var out []RegressedService
	for name, s := range r.series {
		if s.regressed != nil {
			out = append(out, RegressedService{Service: name, Regression: *s.regressed})
		}
	}
	slices.SortFunc(out, func(a, b RegressedService) int { return cmp.Compare(a.Service, b.Service) })
	return out
}

// regressedAlarms returns an AlarmPeerRegressed per peer region with
// regressed services, naming them with their figures.
func (a *Aggregate) regressedAlarms() []assembler.Alarm {
	var out []assembler.Alarm
	for _, st := range a.Regions() {
		if len(st.Regressed) == 0 {
			continue
		}
		since := st.Regressed[0].Since
		var parts []string
		for i, r := range st.Regressed {
			if r.Since.Before(since) {
				since = r.Since
			}
			if i < 10 {
				parts = append(parts, fmt.Sprintf("%s (held v%d, took v%d, served as v%d)", r.Service, r.From, r.To, r.Served))
			}
		}
		if len(st.Regressed) > 10 {
			parts = append(parts, fmt.Sprintf("and %d more", len(st.Regressed)-10))
		}
		out = append(out, assembler.Alarm{Kind: AlarmPeerRegressed, Since: since, Detail: fmt.Sprintf(
			"peer region %s's versions went backwards for %d services: %s. Its database was restored or its history lost; this region serves its current views all the same (the peer is the authority on its own services), marked regressed, under versions above those served before. The alarm clears for a service when the peer's version passes the one held before",
			st.Region, len(st.Regressed), strings.Join(parts, ", "))})
	}
	return out
}

// update changes region's status under the lock.
func (a *Aggregate) update(regionName string, f func(st *PeerStatus)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r := a.regions[regionName]; r != nil {
		f(&r.status)
	}
}

// stale reports whether region is stale now.
func (a *Aggregate) stale(regionName string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	r := a.regions[regionName]
	return r != nil && a.age(r, a.now()) > a.staleAfter
}

// put takes v when it is newer (by version, never by time) than the
// copy held; it reports whether it did. The view takes its series'
// offset; a regression ends when the peer's version passes the one held
// before.
func (a *Aggregate) put(v RemoteView) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.regions[v.Region]
	if r == nil {
		return false
	}
	if old, ok := r.views[v.View.Service]; ok && old.View.Version >= v.View.Version {
		return false
	}
	s := r.seriesOf(v.View.Service)
	if v.View.Version > math.MaxUint64-s.offset {
		return false // no version to serve it under (a peer at the top of the range)
	}
	if s.regressed != nil && v.View.Version > s.regressed.From {
		s.regressed = nil
		r.seriesRev++
	}
	v.Offset, v.Regressed = s.offset, s.regressed
	r.views[v.View.Service] = v
	return true
}

// seriesOf returns service's series state, made when missing. Called
// with a.mu held for writing.
func (r *region) seriesOf(service string) *series {
	s := r.series[service]
	if s == nil {
		s = &series{}
		r.series[service] = s
	}
	return s
}

// regress takes v although its version is below the one held: the
// peer's versions went backwards. It is served under the version after
// the last one served, and marked regressed. It reports whether it took
// v (not when nothing is held, v is not below it, or no version is left
// to serve it under).
func (a *Aggregate) regress(v RemoteView, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.regions[v.Region]
	if r == nil {
		return false
	}
	return r.regress(v, now)
}

// regress is Aggregate.regress, with a.mu held.
func (r *region) regress(v RemoteView, now time.Time) bool {
	old, ok := r.views[v.View.Service]
	if !ok || v.View.Version >= old.View.Version {
		return false
	}
	s := r.seriesOf(v.View.Service)
	if !s.rebase(old, v.View.Version, now) {
		return false
	}
	r.seriesRev++
	v.Offset, v.Regressed = s.offset, s.regressed
	r.views[v.View.Service] = v
	return true
}

// rebase moves s's offset so that the peer's version to is served
// under the version after old's, and marks the regression from old's
// version (or the one an earlier regression was from, when higher). It
// reports false when old was served at the top of the range.
func (s *series) rebase(old RemoteView, to uint64, now time.Time) bool {
	served := old.Served()
	if served == math.MaxUint64 {
		return false
	}
	from := old.View.Version
	if s.regressed != nil {
		from = max(from, s.regressed.From)
	}
	s.offset = served + 1 - to
	s.regressed = &Regression{From: from, To: to, Served: served + 1, Since: now}
	return true
}

// SeriesState is a remote series' offset and regression as the
// follower keeps them on disk, so a restart serves the same versions.
type SeriesState struct {
	Offset    uint64      `json:"offset"`
	Regressed *Regression `json:"regressed,omitempty"`
}

// seriesStates returns region's series with an offset, and the
// revision they are at.
func (a *Aggregate) seriesStates(regionName string) (map[string]SeriesState, uint64) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	r := a.regions[regionName]
	if r == nil {
		return nil, 0
	}
	out := map[string]SeriesState{}
	for name, s := range r.series {
		if s.offset != 0 || s.regressed != nil {
			out[name] = SeriesState{Offset: s.offset, Regressed: s.regressed}
		}
	}
	return out, r.seriesRev
}

// setSeriesStates restores region's series from disk (at start, before
// any view is put).
func (a *Aggregate) setSeriesStates(regionName string, states map[string]SeriesState) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.regions[regionName]
	if r == nil {
		return
	}
	for name, st := range states {
		s := r.seriesOf(name)
		s.offset, s.regressed = st.Offset, st.Regressed
	}
}

// replace puts views in place of everything region held (a partition
// heal: the peer's current views, whole) and returns what changed.
func (a *Aggregate) replace(regionName string, views []RemoteView) Reconciliation {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.regions[regionName]
	if r == nil {
		return Reconciliation{Region: regionName}
	}
	old := map[string]resolver.View{}
	for s, v := range r.views {
		old[s] = v.View
	}
	next := map[string]RemoteView{}
	nv := map[string]resolver.View{}
	for _, v := range views {
		// Served versions never go back: a heal that finds a version
		// below the one held takes it as a regression, and every view
		// keeps its series' offset.
		s := r.seriesOf(v.View.Service)
		if o, ok := r.views[v.View.Service]; ok && v.View.Version < o.View.Version && s.rebase(o, v.View.Version, a.now()) {
			r.seriesRev++
		} else if s.regressed != nil && v.View.Version > s.regressed.From {
			s.regressed = nil
			r.seriesRev++
		}
		v.Offset, v.Regressed = s.offset, s.regressed
		next[v.View.Service], nv[v.View.Service] = v, v.View
	}
	r.views = next
	rec := Diff(old, nv)
	rec.Region = regionName
	return rec
}

// Reconciliation is what a partition heal changed in one region's copy,
// as its audit row records it.
type Reconciliation struct {
	Region string `json:"region"`
	// Services lists the services that changed, appeared or vanished,
	// by name.
	Services []ServiceChange `json:"services"`
	// Changed, Appeared, Vanished and Unchanged count services.
	Changed   int `json:"changed"`
	Appeared  int `json:"appeared"`
	Vanished  int `json:"vanished"`
	Unchanged int `json:"unchanged"`
}

// Summary says what changed in one line.
func (r Reconciliation) Summary() string {
	return fmt.Sprintf("region %s reconciled from its current views: %d services changed, %d appeared, %d vanished, %d unchanged",
		r.Region, r.Changed, r.Appeared, r.Vanished, r.Unchanged)
}

// Kinds of ServiceChange.
const (
	ChangeChanged  = "changed"
	ChangeAppeared = "appeared"
	ChangeVanished = "vanished"
	// ChangeRegressed: the peer's version is below the one held (its
	// history was lost: a restore). The peer is the authority on its
	// own services, so its view is taken all the same, and said so.
	ChangeRegressed = "regressed"
)

// ServiceChange is one service's change in a reconciliation.
type ServiceChange struct {
	Service    string `json:"service"`
	Change     string `json:"change"`
	OldVersion uint64 `json:"old_version,omitempty"`
	NewVersion uint64 `json:"new_version,omitempty"`
	// EndpointsAdded, EndpointsRemoved and EndpointsChanged count
	// endpoints by instance id: new ones, gone ones, and ones whose
	// address, port, zone, state, weight, health or capabilities differ.
	EndpointsAdded   int `json:"endpoints_added"`
	EndpointsRemoved int `json:"endpoints_removed"`
	EndpointsChanged int `json:"endpoints_changed"`
}

// Diff compares two copies of a region's views by service. Versions
// decide: the same version is the same view (the peer never publishes
// two views under one version), whatever the times say; timestamps are
// never compared. Endpoints are compared only to say what a new version
// changed.
func Diff(old, next map[string]resolver.View) Reconciliation {
	var rec Reconciliation
	for s, n := range next {
		o, ok := old[s]
		switch {
		case !ok:
			rec.Appeared++
			rec.Services = append(rec.Services, ServiceChange{Service: s, Change: ChangeAppeared, NewVersion: n.Version, EndpointsAdded: len(n.Endpoints)})
		case o.Version == n.Version:
			rec.Unchanged++
		default:
			c := ServiceChange{Service: s, Change: ChangeChanged, OldVersion: o.Version, NewVersion: n.Version}
			if n.Version < o.Version {
				c.Change = ChangeRegressed
			}
			c.EndpointsAdded, c.EndpointsRemoved, c.EndpointsChanged = diffEndpoints(o.Endpoints, n.Endpoints)
			rec.Changed++
			rec.Services = append(rec.Services, c)
		}
	}
	for s, o := range old {
		if _, ok := next[s]; !ok {
			rec.Vanished++
			rec.Services = append(rec.Services, ServiceChange{Service: s, Change: ChangeVanished, OldVersion: o.Version, EndpointsRemoved: len(o.Endpoints)})
		}
	}
	slices.SortFunc(rec.Services, func(a, b ServiceChange) int { return cmp.Compare(a.Service, b.Service) })
	if rec.Services == nil {
		rec.Services = []ServiceChange{}
	}
	return rec
}

// diffEndpoints counts endpoints added, removed and changed by instance id.
func diffEndpoints(old, next []resolver.Endpoint) (added, removed, changed int) {
	byID := make(map[string]resolver.Endpoint, len(old))
	for _, e := range old {
		byID[e.InstanceID] = e
	}
	seen := make(map[string]bool, len(next))
	for _, e := range next {
		seen[e.InstanceID] = true
		o, ok := byID[e.InstanceID]
		switch {
		case !ok:
			added++
		case !sameEndpoint(o, e):
			changed++
		}
	}
	for _, e := range old {
		if !seen[e.InstanceID] {
			removed++
		}
	}
	return added, removed, changed
}

func sameEndpoint(a, b resolver.Endpoint) bool {
	return a.Address == b.Address && a.Port == b.Port && a.Zone == b.Zone && a.State == b.State &&
		a.Weight == b.Weight && a.Health == b.Health && slices.Equal(a.Capabilities, b.Capabilities) &&
		a.Quarantined == b.Quarantined
}
