package assembler

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// plan is one service's next version, decided before versions are
// reserved so that a failing VersionSource leaves everything queued.
type plan struct {
	sv         *service
	ids        []uuid.UUID
	withdrawal bool
}

// Drain publishes what is due at now: for each service, its queued
// withdrawals at once if its withdrawal queue was idle when the oldest was
// queued (no withdrawal version in the WithdrawalWindow before), otherwise
// at the end of the window that began with the last withdrawal version;
// and its queued additions once the oldest has waited the current addition
// window. Each
// published service gets one fresh version; withdrawal-carrying versions
// come first (lower versions, earlier in the result), each group ordered by
// service name. If vs fails nothing is published and everything stays
// queued.
func (a *Assembler) Drain(now time.Time, vs VersionSource) ([]Published, error) {
	a.advanceRamps(now)
	a.load.advance(now)
	var plans []plan
	for _, sv := range a.dirty {
		if p, ok := a.plan(sv, now); ok {
			plans = append(plans, p)
		}
	}
	if len(plans) == 0 {
		return nil, nil
	}
	slices.SortFunc(plans, func(x, y plan) int {
		if x.withdrawal != y.withdrawal {
			if x.withdrawal {
				return -1
			}
			return 1
		}
		return strings.Compare(x.sv.name, y.sv.name)
	})
	first, err := vs.Next(len(plans))
	if err != nil {
		return nil, fmt.Errorf("reserve %d versions: %w", len(plans), err)
	}
	if first <= a.lastVer || first+uint64(len(plans)-1) < first {
		return nil, fmt.Errorf("reserve %d versions: got %d after %d: %w", len(plans), first, a.lastVer, ErrVersionNotFresh)
	}
	out := make([]Published, 0, len(plans))
	for i := range plans {
		out = append(out, a.publish(&plans[i], first+uint64(i), now))
	}
	a.lastVer = first + uint64(len(plans)-1)
	a.published += uint64(len(plans))
	return out, nil
}

// plan picks the service's changes due at now.
func (a *Assembler) plan(sv *service, now time.Time) (plan, bool) {
	wDue := sv.withdrawing() && !now.Before(sv.wDue(a.opts.WithdrawalWindow))
	aDue := !sv.aSince.IsZero() && !now.Before(sv.aDue(a.load.win))
	if !wDue && !aDue {
		return plan{}, false
	}
	p := plan{sv: sv, withdrawal: wDue}
	for id, q := range sv.pend {
		if (q.withdrawal && wDue) || (!q.withdrawal && aDue) {
			p.ids = append(p.ids, id)
		}
	}
	if wDue && !aDue && sv.nA > 0 {
		p.ids = append(p.ids, sv.shortZoneAdditions(p.ids)...)
	}
	slices.SortFunc(p.ids, func(x, y uuid.UUID) int { return bytes.Compare(x[:], y[:]) })
	return p, true
}

// shortZoneAdditions returns the queued additions that must travel with
// the withdrawals ws so that publishing the withdrawals alone does not
// leave a published zone short: fewer endpoints serving (weight > 0) than
// the guard's own set and below the minimum healthy fraction of the zone
// (or none at all). Without it a rolling replacement whose new instances
// wait on a grown addition window would be published as an empty zone.
// Zones the view has not published yet are not protected: nobody routes to
// them.
func (sv *service) shortZoneAdditions(ws []uuid.UUID) []uuid.UUID {
	type served struct{ pub, tgt int }
	byZone := map[string]served{}
	for _, e := range sv.pub {
		if e.Weight > 0 {
			s := byZone[e.Zone]
			s.pub++
			byZone[e.Zone] = s
		}
	}
	for _, id := range ws {
		if e, ok := sv.pub[id]; ok && e.Weight > 0 {
			s := byZone[e.Zone]
			s.pub--
			byZone[e.Zone] = s
		}
	}
	for _, c := range sv.cur {
		if c.inTgt && c.tgt.Weight > 0 {
			s := byZone[c.tgt.Zone]
			s.tgt++
			byZone[c.tgt.Zone] = s
		}
	}
	var short map[string]bool
	for z, s := range byZone {
		if _, known := sv.pubZones[z]; !known || s.pub >= s.tgt {
			continue
		}
		if s.pub <= 0 || tripped(s.pub, sv.zones[z].Total, sv.frac) {
			if short == nil {
				short = map[string]bool{}
			}
			short[z] = true
		}
	}
	if short == nil {
		return nil
	}
	var out []uuid.UUID
	for id, q := range sv.pend {
		if !q.withdrawal && short[q.zone] {
			out = append(out, id)
		}
	}
	return out
}

// publish applies p as version v and encodes the result once.
func (a *Assembler) publish(p *plan, v uint64, now time.Time) Published {
	sv := p.sv
	d := &Delta{Service: sv.name, Version: v, GeneratedAt: now}
	if sv.view != nil {
		d.FromVersion = sv.view.Version
	}
	var lags []time.Duration
	for _, id := range p.ids {
		q := sv.pend[id]
		delete(sv.pend, id)
		if c := sv.cur[id]; c != nil && c.inTgt {
			d.Upserts = append(d.Upserts, c.tgt)
			sv.pub[id] = c.tgt
			sv.pubJSON[id] = encode(&c.tgt)
		} else {
			d.Removals = append(d.Removals, id)
			delete(sv.pub, id)
			delete(sv.pubJSON, id)
		}
		if q.withdrawal {
			d.Withdrawal = true
			if !q.firstFail.IsZero() {
				lags = append(lags, now.Sub(q.firstFail))
			}
		}
	}
	zones := sv.pubZones
	if !sv.zonesSince.IsZero() {
		// Zone statuses ride on every version of the service.
		zones = maps.Clone(sv.zones)
		if zones == nil {
			zones = map[string]ZoneStatus{}
		}
		for z, st := range zones {
			if old, ok := sv.pubZones[z]; !ok || old != st {
				if d.Zones == nil {
					d.Zones = map[string]ZoneStatus{}
				}
				d.Zones[z] = st
			}
		}
		for z := range sv.pubZones {
			if _, ok := zones[z]; !ok {
				d.RemovedZones = append(d.RemovedZones, z)
			}
		}
		slices.Sort(d.RemovedZones)
		if !sv.drainSince.IsZero() {
			// A zone's traffic draining takes capacity away like a
			// withdrawal.
			d.Withdrawal = true
		}
		sv.pubZones, sv.zonesSince, sv.drainSince = zones, time.Time{}, time.Time{}
	}

	eps := make([]Endpoint, 0, len(sv.pub))
	for _, e := range sv.pub {
		eps = append(eps, e)
	}
	slices.SortFunc(eps, compareEndpoints)
	view := &View{
		Service: sv.name, Version: v, Endpoints: eps, Zones: zones, GeneratedAt: now,
		Checksum: checksumSorted(eps, &a.scratch),
	}
	// Signed once here, as it is encoded: every subscriber and peer
	// shares these bytes.
	view.Signature = a.sign(view)
	view.enc = a.encodeView(view, sv.pubJSON)
	out := Published{View: view, ViewJSON: view.enc, WithdrawalLags: lags}
	if sv.view != nil {
		d.Checksum, d.Signature = view.Checksum, view.Signature
		d.enc = encode(d)
		out.Delta, out.DeltaJSON = d, d.enc
	}
	if p.withdrawal {
		sv.wLast = now
	}
	sv.view, sv.restated = view, false
	sv.recount()
	a.markDirty(sv)
	return out
}

// encodeView encodes v exactly as encoding/json would, splicing in the
// endpoints' encodings kept from when each was published, so a version
// costs the bytes it changed plus a copy rather than a full re-encoding.
func (a *Assembler) encodeView(v *View, frags map[uuid.UUID][]byte) []byte {
	n := 256
	for _, e := range v.Endpoints {
		n += len(frags[e.InstanceID]) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, `{"service":`...)
	b = append(b, encode(v.Service)...)
	b = append(b, `,"version":`...)
	b = strconv.AppendUint(b, v.Version, 10)
	b = append(b, `,"endpoints":[`...)
	for i, e := range v.Endpoints {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, frags[e.InstanceID]...)
	}
	b = append(b, `],"zones":`...)
	b = append(b, encode(v.Zones)...)
	b = append(b, `,"generated_at":`...)
	b = append(b, encode(v.GeneratedAt)...)
	b = append(b, `,"checksum":`...)
	b = append(b, encode(v.Checksum)...)
	if v.Signature != nil {
		b = append(b, `,"signature":`...)
		b = append(b, encode(v.Signature)...)
	}
	return append(b, '}')
}
