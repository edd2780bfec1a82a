package assembler

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/musterhq/muster/internal/eligibility"
)

// ErrRestore is wrapped by every error Restore returns: the view was not
// restored and the assembler is unchanged.
var ErrRestore = errors.New("assembler: cannot restore view")

// Restore seeds the assembler with a view that an earlier process (or an
// earlier owner of the service's publication) published, so that what
// follows is compared with what clients hold rather than with nothing: the
// view becomes the service's published state, the service's first Update
// queues only the difference against it, a last_instance alarm opens if
// the view had an instance in rotation and the first Update has none, and
// the next version's Delta has FromVersion = v.Version. The first Update
// always publishes a version, even when nothing changed (see "Restart" in
// the package documentation). Restore does not make the service due: until
// its first Update nothing of it is published.
//
// Restore must come before the service's first Update; a service the
// assembler already holds is refused, as is a view whose checksum does not
// match its endpoints, with a duplicate instance id, or with version 0.
// Versions handed to Drain afterwards must be above v.Version (Drain
// returns ErrVersionNotFresh otherwise). v is not modified or kept.
func (a *Assembler) Restore(v *View) error {
	if v == nil || v.Service == "" || v.Version == 0 {
		return fmt.Errorf("%w: a view needs a service and a version", ErrRestore)
	}
	if _, ok := a.svcs[v.Service]; ok {
		return fmt.Errorf("%w of %s: the service is already held", ErrRestore, v.Service)
	}
	eps := slices.Clone(v.Endpoints)
	slices.SortFunc(eps, compareEndpoints)
	for i := range eps {
		if i > 0 && eps[i].InstanceID == eps[i-1].InstanceID {
			return fmt.Errorf("%w of %s v%d: instance %s appears twice", ErrRestore, v.Service, v.Version, eps[i].InstanceID)
		}
		if eps[i].Capabilities == nil {
			// The assembler never publishes a nil list: keep the
			// encoding byte-identical to the one clients received.
			eps[i].Capabilities = []string{}
		}
	}
	if sum := checksumSorted(eps, &a.scratch); sum != v.Checksum {
		return fmt.Errorf("%w of %s v%d: checksum %s does not match its endpoints (%s)", ErrRestore, v.Service, v.Version, v.Checksum, sum)
	}

	sv := newService(v.Service)
	for i := range eps {
		e := eps[i]
		sv.pub[e.InstanceID] = e
		sv.pubJSON[e.InstanceID] = encode(&e)
		// A candidate of generation 0: the first Update (generation 1)
		// either lists the instance again or queues its withdrawal.
		sv.cur[e.InstanceID] = &cand{inTgt: true, tgt: e}
		// A published endpoint is in rotation unless it shows
		// ineligible (out of rotation, quarantined or forced out, and
		// published by a tripped guard).
		if e.State != eligibility.Ineligible.String() {
			sv.routable++
		}
	}
	sv.hadRoutable = sv.routable > 0
	zones := maps.Clone(v.Zones)
	if zones == nil {
		zones = map[string]ZoneStatus{}
	}
	sv.pubZones = zones
	view := &View{Service: v.Service, Version: v.Version, Endpoints: eps, Zones: zones, GeneratedAt: v.GeneratedAt, Checksum: v.Checksum, Signature: v.Signature}
	view.enc = a.encodeView(view, sv.pubJSON)
	sv.view = view
	sv.restated = true
	a.svcs[v.Service] = sv
	a.lastVer = max(a.lastVer, v.Version)
	return nil
}
