package resolver

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Snapshot is one service's routing state at one version. It is immutable
// once published and shared by every reader: the slices and map its
// methods return must not be modified.
type Snapshot struct {
	service string
	version uint64
	// eps is sorted by InstanceID. A delta copies pointers, not
	// endpoints, so applying it costs a pointer per endpoint and a hash
	// per changed one; the flat slice Endpoints returns is built once, on
	// first use, unless the snapshot came from a full view.
	eps         []*Endpoint
	flat        []Endpoint
	flatOnce    sync.Once
	zones       map[string]Zone
	generatedAt time.Time
	receivedAt  time.Time
	checksum    string
	sum         sum256 // checksum as a number, for checking deltas

	// Precomputed for Pick: the routable endpoints and their cumulative
	// weights.
	table    pickTable
	routable int // routable endpoints (by health)
	// share is the part of the routable weight the zones' traffic
	// weights let through (1 unless a shift drained a zone or the region):
	// with fallback regions (WithRegions) the rest goes to them.
	share   float64
	routIdx []int32            // their indexes, for rebuilding the table
	traffic map[string]float64 // zone traffic weights; nil when all are 1
	unknown []int32
	tripped bool
}

// pickTable is what Pick chooses from: idx[i] indexes the snapshot's
// endpoints and cum[i] is the sum of their weights up to and including i.
type pickTable struct {
	idx []int32
	cum []float64
}

// newSnapshot precomputes the routing tables; eps must be sorted and
// owned. flat, when not nil, is the same endpoints as values (eps point
// into it).
//
// Routable (what the client guards count) is about health: weight > 0
// and in rotation, or in a tripped zone. The pick table also weighs each
// endpoint by its zone's traffic weight, so a drained zone gets no picks
// without counting as a shrink. Should every routable endpoint sit in a
// zone drained to 0, the table ignores traffic weights: muster must never
// be the reason traffic stops.
func newSnapshot(service string, version uint64, eps []*Endpoint, flat []Endpoint, zones map[string]Zone, generatedAt, receivedAt time.Time, checksum string, sum sum256) *Snapshot {
	s := &Snapshot{
		service: service, version: version, eps: eps, flat: flat, zones: zones,
		generatedAt: generatedAt, receivedAt: receivedAt, checksum: checksum, sum: sum,
	}
	shifted := false
	for _, z := range zones {
		if z.Guard == GuardTripped {
			s.tripped = true
		}
		if z.Traffic() != 1 {
			shifted = true
		}
	}
	if shifted {
		s.traffic = make(map[string]float64, len(zones))
		for name, z := range zones {
			s.traffic[name] = z.Traffic()
		}
	}
	idx := make([]int32, 0, len(eps))
	// Without traffic weights (the common case) the pick table is built
	// in the same pass; it then shares idx.
	var cum []float64
	var total float64
	if !shifted {
		cum = make([]float64, 0, len(eps))
	}
	for i, e := range eps {
		if e.Health == HealthUnknown {
			s.unknown = append(s.unknown, int32(i))
		}
		// Without a tripped zone routability is the endpoint's own
		// business; skip the per-endpoint map lookup.
		if s.tripped && !routable(e, zones) || !s.tripped && !inRotation(e) {
			continue
		}
		idx = append(idx, int32(i))
		if !shifted {
			total += e.Weight
			cum = append(cum, total)
		}
	}
	s.routable, s.routIdx = len(idx), idx
	s.share = 1
	if shifted {
		var all, through float64
		for _, k := range idx {
			all += eps[k].Weight
			through += eps[k].Weight * s.traffic[eps[k].Zone]
		}
		if all > 0 {
			s.share = through / all
		}
	}
	if shifted {
		s.table = s.buildTable(idx, nil)
	} else {
		s.table = pickTable{idx: idx, cum: cum}
	}
	return s
}

// buildTable builds a pick table over the endpoints idx names, leaving
// out those skip reports (nil: none).
func (s *Snapshot) buildTable(idx []int32, skip func(*Endpoint) bool) pickTable {
	t := pickTable{idx: make([]int32, 0, len(idx)), cum: make([]float64, 0, len(idx))}
	for _, useTraffic := range []bool{s.traffic != nil, false} {
		var total float64
		for _, k := range idx {
			e := s.eps[k]
			if skip != nil && skip(e) {
				continue
			}
			w := e.Weight
			if useTraffic {
				w *= s.traffic[e.Zone]
			}
			if !(w > 0) {
				continue
			}
			total += w
			t.idx = append(t.idx, k)
			t.cum = append(t.cum, total)
		}
		if total > 0 || !useTraffic {
			return t
		}
		t.idx, t.cum = t.idx[:0], t.cum[:0] // every zone drained: ignore traffic
	}
	return t
}

// pointers returns pointers to the elements of flat.
func pointers(flat []Endpoint) []*Endpoint {
	p := make([]*Endpoint, len(flat))
	for i := range flat {
		p[i] = &flat[i]
	}
	return p
}

// routable: positive weight and in rotation by its own verdict, or in a
// zone whose guard tripped (muster then publishes the zone's full set and
// health is disregarded).
func routable(e *Endpoint, zones map[string]Zone) bool {
	if !(e.Weight > 0) {
		return false
	}
	if zones[e.Zone].Guard == GuardTripped {
		return true
	}
	return inRotation(e)
}

// inRotation: positive weight and in rotation by its own verdict.
func inRotation(e *Endpoint) bool {
	return e.Weight > 0 && e.State != StateIneligible && !e.Quarantined
}

// TrafficShare is the part of the routable weight that the zones'
// traffic weights let through: 1 unless a shift-back drained zones (0
// when every zone, or the region, is drained). A client with fallback
// regions sends the rest there (WithRegions); without, it routes on the
// routable set whatever the weights (never the reason traffic stops).
func (s *Snapshot) TrafficShare() float64 { return s.share }

// Service returns the service's name.
func (s *Snapshot) Service() string { return s.service }

// Version returns the view's version.
func (s *Snapshot) Version() uint64 { return s.version }

// Checksum returns the checksum of Endpoints.
func (s *Snapshot) Checksum() string { return s.checksum }

// Endpoints returns every published endpoint, routable or not, sorted by
// instance id. The slice is shared: do not modify it.
func (s *Snapshot) Endpoints() []Endpoint {
	s.flatOnce.Do(func() {
		if s.flat != nil || len(s.eps) == 0 {
			return
		}
		s.flat = make([]Endpoint, len(s.eps))
		for i, e := range s.eps {
			s.flat[i] = *e
		}
	})
	return s.flat
}

// Zones returns the per-zone guard status. The map is shared: do not
// modify it.
func (s *Snapshot) Zones() map[string]Zone { return s.zones }

// Tripped reports whether any zone's guard is tripped.
func (s *Snapshot) Tripped() bool { return s.tripped }

// Registered returns how many instances the registry lists for the
// service, all zones together; ok is false when a zone does not say
// (Zone.Registered nil, a server from before zones carried it). A view with no
// zones has no registered instance.
func (s *Snapshot) Registered() (n int, ok bool) {
	for _, z := range s.zones {
		if z.Registered == nil {
			return 0, false
		}
		n += *z.Registered
	}
	return n, true
}

// Routable returns the number of endpoints in rotation by health (what
// the client guards count). Pick chooses among them, weighted by their
// zones' traffic weights; a drained zone's endpoints count here but are
// not picked.
func (s *Snapshot) Routable() int { return s.routable }

// HealthUnknown returns the indexes into Endpoints of the endpoints whose
// health is unknown. The slice is shared: do not modify it.
func (s *Snapshot) HealthUnknown() []int32 { return s.unknown }

// GeneratedAt returns when muster generated the view.
func (s *Snapshot) GeneratedAt() time.Time { return s.generatedAt }

// ReceivedAt returns when this client applied it (or loaded it from disk).
func (s *Snapshot) ReceivedAt() time.Time { return s.receivedAt }

// Age returns how old the view's data is at now, measured from GeneratedAt.
func (s *Snapshot) Age(now time.Time) time.Duration { return now.Sub(s.generatedAt) }

// View returns the snapshot as a View, sharing its slices and map.
func (s *Snapshot) View() View {
	return View{
		Service: s.service, Version: s.version, Endpoints: s.Endpoints(), Zones: s.zones,
		GeneratedAt: s.generatedAt, Checksum: s.checksum,
	}
}

// pick returns the index of an entry of t chosen with probability
// proportional to its weight; r is a uniformly random 64-bit value.
func (t *pickTable) pick(r uint64) (int32, bool) {
	n := len(t.cum)
	if n == 0 {
		return 0, false
	}
	x := float64(r>>11) * 0x1p-53 * t.cum[n-1]
	lo, hi := 0, n-1
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if t.cum[m] <= x {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return t.idx[lo], true
}

// Result is what Resolve returns: the snapshot routing uses and the
// moment it was resolved at. It is a value; copying it is cheap.
type Result struct {
	*Snapshot
	// Now is the cache clock's reading when Resolve ran.
	Now time.Time
	// Held is the version of the newest update recorded for the service.
	// It is above Snapshot.Version while a client guard holds a larger
	// set.
	Held uint64
	// Ejected is how many of the snapshot's routable endpoints Pick skips
	// because local passive ejection took them out.
	Ejected int
	// Hold is the shrink guard's hold while it keeps routing on a larger
	// set than the newest update describes, else nil. It is shared: do not
	// modify it.
	Hold *Hold
}

// Hold describes a client guard holding back a smaller routable set: the
// newest update would remove more than the shrink cap allows (or every
// routable endpoint) and the registry does not account for it. Routing
// stays on the held set until the server has stood by smaller sets for
// the confirm time (WithConfirmAfter): at FollowAt, on the next update or
// the next Sweep, routing follows the newest update. An update the guard
// takes ends the hold; so does Release.
type Hold struct {
	// Reason is ErrShrinkCapped or ErrWouldEmpty: why the newest update
	// was refused.
	Reason error
	// Since is when the hold began, by the Cache's clock: the first
	// refusal since routing last switched. Later refusals do not move it.
	Since time.Time
	// FollowAt is Since plus the confirm time.
	FollowAt time.Time
	// HeldVersion and HeldRoutable describe the view routing keeps.
	HeldVersion  uint64
	HeldRoutable int
	// NewestVersion and NewestRoutable describe the newest update, the
	// one routing will follow.
	NewestVersion  uint64
	NewestRoutable int
}

// Age returns the snapshot's age at r.Now.
func (r Result) Age() time.Duration { return r.Snapshot.Age(r.Now) }

// Guarded reports whether a client guard is holding an older, larger
// routable set than the newest update describes.
func (r Result) Guarded() bool { return r.Held != r.Snapshot.Version() }

// Target is an endpoint traffic is sent to, with the share of traffic it
// gets: its weight multiplied by its zone's traffic weight.
type Target struct {
	Endpoint
	// Share is the endpoint's weight times its zone's traffic weight
	// (both as muster published them); always > 0.
	Share float64
}

// Targets returns the endpoints Pick chooses from, in instance-id order,
// with their shares: the endpoints in rotation (eligible, degraded, and
// health unknown, ADR-16) and every endpoint of a zone whose guard
// tripped, with a positive weight. A drained zone (traffic weight 0) has
// none, unless every routable endpoint sits in a drained zone: then the
// traffic weights are ignored, because muster must never be the reason
// traffic stops.
//
// It is what a surface that is not a Go client (a load balancer's target
// group, an xDS assignment, a DNS answer) publishes from a snapshot, so
// every surface routes exactly as the resolver does. Local passive
// ejection (a Cache's own observations) is not applied here.
func (s *Snapshot) Targets() []Target {
	out := make([]Target, 0, len(s.table.idx))
	prev := 0.0
	for i, k := range s.table.idx {
		out = append(out, Target{Endpoint: *s.eps[k], Share: s.table.cum[i] - prev})
		prev = s.table.cum[i]
	}
	return out
}

// SnapshotOf checks a full view (unique instance ids, its checksum) and
// returns its snapshot, as a Cache would hold it, for programs that take
// views from somewhere other than a Cache (muster's own surfaces read the
// hub). It applies no client guard: that is a Cache's, across versions.
func SnapshotOf(v View, receivedAt time.Time) (*Snapshot, error) {
	eps := slices.Clone(v.Endpoints)
	if !slices.IsSortedFunc(eps, compareEndpoints) {
		slices.SortFunc(eps, compareEndpoints)
	}
	if err := checkUnique(eps); err != nil {
		return nil, fmt.Errorf("view %s v%d: %w: %w", v.Service, v.Version, err, ErrInvalid)
	}
	sum := sumOf(eps)
	if !sum.matches(v.Checksum) {
		return nil, fmt.Errorf("view %s v%d: got %s, view says %s: %w", v.Service, v.Version, sum, v.Checksum, ErrChecksum)
	}
	return newSnapshot(v.Service, v.Version, pointers(eps), eps, maps.Clone(v.Zones), v.GeneratedAt, receivedAt, v.Checksum, sum), nil
}
