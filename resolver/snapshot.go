package resolver

import (
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
	table   pickTable
	unknown []int32
	tripped bool
	drained bool
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
func newSnapshot(service string, version uint64, eps []*Endpoint, flat []Endpoint, zones map[string]Zone, generatedAt, receivedAt time.Time, checksum string, sum sum256) *Snapshot {
	s := &Snapshot{
		service: service, version: version, eps: eps, flat: flat, zones: zones,
		generatedAt: generatedAt, receivedAt: receivedAt, checksum: checksum, sum: sum,
	}
	s.table.idx = make([]int32, 0, len(eps))
	s.table.cum = make([]float64, 0, len(eps))
	s.drained = len(zones) > 0
	for _, z := range zones {
		if z.Guard == GuardTripped {
			s.tripped = true
		}
		if z.Total != 0 {
			s.drained = false
		}
	}
	var total float64
	for i, e := range eps {
		if e.Health == HealthUnknown {
			s.unknown = append(s.unknown, int32(i))
		}
		// Without a tripped zone routability is the endpoint's own
		// business; skip the per-endpoint map lookup.
		if s.tripped && !routable(e, zones) || !s.tripped && !inRotation(e) {
			continue
		}
		total += e.Weight
		s.table.idx = append(s.table.idx, int32(i))
		s.table.cum = append(s.table.cum, total)
	}
	return s
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

// Drained reports whether the service was deliberately drained: it has
// zones and all of them have Total == 0.
func (s *Snapshot) Drained() bool { return s.drained }

// Routable returns the number of endpoints Pick chooses among.
func (s *Snapshot) Routable() int { return len(s.table.idx) }

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
}

// Age returns the snapshot's age at r.Now.
func (r Result) Age() time.Duration { return r.Snapshot.Age(r.Now) }

// Guarded reports whether a client guard is holding an older, larger
// routable set than the newest update describes.
func (r Result) Guarded() bool { return r.Held != r.Snapshot.Version() }
