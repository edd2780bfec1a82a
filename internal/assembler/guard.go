package assembler

import "math"

// The capacity rule (ADR-08), once. The fraction guard in Update counts
// every zone with Capacity; the override budget (policy) and the drain
// budget (policy's shifts) count with the same Capacity on the same input
// (the evaluator's snapshot), so that no check can allow what the guard
// then undoes, and none can refuse what the guard would allow.

// Routable reports whether the guard counts x as in rotation: never when
// its lease expired; otherwise an override decides outright, and without
// one the instance's own verdict, unless quarantined.
func Routable(x *InstanceInput) bool { return routable(x) }

// Counted reports whether the guard counts x as capacity, the
// denominator of the minimum healthy fraction: everything in rotation,
// and everything out of it except an instance awaiting its first success
// (Awaiting), which was never capacity. A surge deploy's new instances do
// not trip the guard, and a brand-new service is not "below its minimum".
func Counted(x *InstanceInput) bool { return counted(x) }

// Tripped reports whether a zone with routable of total (counted)
// instances is below the minimum healthy fraction frac (normalised as the
// guard does), i.e. whether the guard publishes the zone's capacity.
func Tripped(routable, total int, frac float64) bool {
	return tripped(routable, total, normFraction(frac))
}

// NormFraction is a minimum healthy fraction as the guard applies it: one
// outside (0,1] (NaN included) cannot switch the guard off, so 0 or less
// reads as DefaultMinHealthyFraction and more than 1 as 1.
func NormFraction(f float64) float64 { return normFraction(f) }

// Capacity is a zone's (or, summed, a region's) count as the guard makes
// it: the one rule the guard, the override budget and the drain budget
// share.
type Capacity struct {
	Routable int // instances in rotation (Routable)
	Counted  int // capacity that was there (Counted): the denominator
}

// Add counts x.
func (c *Capacity) Add(x *InstanceInput) { c.add(x, false) }

// add counts x, as capacity also when served: clients route to it in the
// published view, whatever x.Awaiting says (service.serving).
func (c *Capacity) add(x *InstanceInput, served bool) {
	if counted(x) || served {
		c.Counted++
	}
	if routable(x) {
		c.Routable++
	}
}

// Tripped reports whether the guard trips on c at fraction frac.
func (c Capacity) Tripped(frac float64) bool { return Tripped(c.Routable, c.Counted, frac) }

// Required returns the fewest routable instances of c.Counted that keep
// the guard from tripping at fraction frac (normalised as the guard
// does): the guard's own comparison, searched, so the two never differ
// by rounding.
func (c Capacity) Required(frac float64) int {
	frac = normFraction(frac)
	n := int(math.Ceil(frac * float64(c.Counted)))
	n = min(max(n, 0), c.Counted)
	for n > 0 && !tripped(n-1, c.Counted, frac) {
		n--
	}
	for n < c.Counted && tripped(n, c.Counted, frac) {
		n++
	}
	return n
}

func counted(x *InstanceInput) bool { return !x.Awaiting || routable(x) }

func routable(x *InstanceInput) bool {
	if x.LeaseExpired {
		return false
	}
	if x.Override != nil {
		switch x.Override.Action {
		case OverrideIneligible:
			return false
		case OverrideEligible:
			return true
		}
	}
	return !x.Quarantined && normState(x.State).InRotation()
}

// tripped reports whether routable of total is below frac. The division is
// correctly rounded, so a fraction met exactly (3 of 10 at 0.3) holds.
func tripped(routable, total int, frac float64) bool {
	return total > 0 && float64(routable)/float64(total) < frac
}

func normFraction(f float64) float64 {
	switch {
	case !(f > 0): // also NaN
		return DefaultMinHealthyFraction
	case f > 1:
		return 1
	}
	return f
}
