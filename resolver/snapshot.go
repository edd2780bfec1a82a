package resolver

import (
	"time"
)

// Snapshot is one service's routing state at one version. It is immutable
// once published and shared by every reader: the slices and map its
// methods return must not be modified.
type Snapshot struct {
	service     string
	version     uint64
	endpoints   []Endpoint // sorted by InstanceID
	zones       map[string]Zone
	generatedAt time.Time
	receivedAt  time.Time
	checksum    string

	// Precomputed for Pick: routable[i] indexes endpoints, cum[i] is the
	// sum of their weights up to and including i.
	routable []int32
	cum      []float64
	unknown  []int32
	tripped  bool
	drained  bool
}

// newSnapshot precomputes the routing tables; eps must be sorted and owned.
func newSnapshot(service string, version uint64, eps []Endpoint, zones map[string]Zone, generatedAt, receivedAt time.Time, checksum string) *Snapshot {
	s := &Snapshot{
		service: service, version: version, endpoints: eps, zones: zones,
		generatedAt: generatedAt, receivedAt: receivedAt, checksum: checksum,
	}
	s.routable = make([]int32, 0, len(eps))
	s.cum = make([]float64, 0, len(eps))
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
	for i := range eps {
		e := &eps[i]
		if e.Health == HealthUnknown {
			s.unknown = append(s.unknown, int32(i))
		}
		if !routable(e, zones) {
			continue
		}
		total += e.Weight
		s.routable = append(s.routable, int32(i))
		s.cum = append(s.cum, total)
	}
	return s
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
	return e.State != StateIneligible && !e.Quarantined
}

// Service returns the service's name.
func (s *Snapshot) Service() string { return s.service }

// Version returns the view's version.
func (s *Snapshot) Version() uint64 { return s.version }

// Checksum returns the checksum of Endpoints.
func (s *Snapshot) Checksum() string { return s.checksum }

// Endpoints returns every published endpoint, routable or not, sorted by
// instance id. The slice is shared: do not modify it.
func (s *Snapshot) Endpoints() []Endpoint { return s.endpoints }

// Zones returns the per-zone guard status. The map is shared: do not
// modify it.
func (s *Snapshot) Zones() map[string]Zone { return s.zones }

// Tripped reports whether any zone's guard is tripped.
func (s *Snapshot) Tripped() bool { return s.tripped }

// Drained reports whether the service was deliberately drained: it has
// zones and all of them have Total == 0.
func (s *Snapshot) Drained() bool { return s.drained }

// Routable returns the number of endpoints Pick chooses among.
func (s *Snapshot) Routable() int { return len(s.routable) }

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
		Service: s.service, Version: s.version, Endpoints: s.endpoints, Zones: s.zones,
		GeneratedAt: s.generatedAt, Checksum: s.checksum,
	}
}

// pick chooses a routable endpoint with probability proportional to its
// weight; r is a uniformly random 64-bit value.
func (s *Snapshot) pick(r uint64) (Endpoint, bool) {
	n := len(s.cum)
	if n == 0 {
		return Endpoint{}, false
	}
	x := float64(r>>11) * 0x1p-53 * s.cum[n-1]
	lo, hi := 0, n-1
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.cum[m] <= x {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return s.endpoints[s.routable[lo]], true
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
}

// Age returns the snapshot's age at r.Now.
func (r Result) Age() time.Duration { return r.Snapshot.Age(r.Now) }

// Guarded reports whether a client guard is holding an older, larger
// routable set than the newest update describes.
func (r Result) Guarded() bool { return r.Held != r.Snapshot.Version() }
