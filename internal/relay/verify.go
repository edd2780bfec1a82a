package relay

import (
	"context"
	"errors"
	"fmt"
	jsonv2 "github.com/go-json-experiment/json"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/tenure"
)

// Alarms raised by what a peer's stream carries.
const (
	// AlarmRelayForged is raised, per peer, when a record's view is not
	// signed by a trusted key over exactly its contents, or its delta does
	// not produce it: whoever answered as that peer (a rogue server the
	// peer's address leads to, or something on the network path) can
	// write views but not sign them. Nothing of the record is applied.
	AlarmRelayForged = "relay_forged"
	// AlarmViewOutsideTenure is raised, per peer, when a signed view's
	// version epoch is not a sealed tenure of its service's shard held by
	// the replica that signed it. The view is not applied.
	AlarmViewOutsideTenure = "view_outside_tenure"
)

// ErrForged is wrapped by the error that ends a stream for a record that
// does not verify.
var ErrForged = errors.New("forged peer record")

// errOutsideTenure refuses a record without ending its stream: the view
// is genuine (signed by the region's key) but not its signer's to sign.
var errOutsideTenure = errors.New("view outside its shard's tenures")

// Tenures looks up who may sign a shard's views under a version epoch
// (tenure.Book). Owner returns tenure.ErrNone when nobody may; any other
// error means it could not tell (the database is unreachable).
type Tenures interface {
	Owner(ctx context.Context, shard int, epoch uint64) (string, error)
}

// forgedAlarmFor is how long relay_forged and view_outside_tenure stay
// raised after the last record that raised them.
const forgedAlarmFor = 15 * time.Minute

// refusal is an open relay_forged or view_outside_tenure alarm.
type refusal struct {
	kind, peer, address string
	since, last         time.Time
	count               uint64
	why                 string
}

// verify checks a snapshot or update record before it reaches the hub
// (see "Signed views" in doc.go). It returns nil when the record may be
// applied (its delta possibly dropped: rec is updated), an error wrapping
// ErrForged when the stream must end, or errOutsideTenure.
func (r *Relay) verify(ctx context.Context, c *conn, rec *Record) error {
	var v assembler.View
	if err := jsonv2.Unmarshal(rec.View, &v); err != nil {
		return fmt.Errorf("%w: the view of %s@%d does not decode: %w", ErrForged, rec.Service, rec.Version, err)
	}
	if v.Service != rec.Service || v.Version != rec.Version {
		return fmt.Errorf("%w: a record of %s@%d carries a view of %s@%d", ErrForged, rec.Service, rec.Version, v.Service, v.Version)
	}
	sig, err := assembler.VerifyView(r.cfg.ViewKeys, &v)
	unsigned := errors.Is(err, assembler.ErrUnsigned)
	if err != nil && !(unsigned && r.cfg.AcceptUnsigned) {
		return fmt.Errorf("%w: view of %s@%d: %w", ErrForged, v.Service, v.Version, err)
	}
	if rec.Delta != nil {
		if err := r.verifyDelta(rec, &v); err != nil {
			return err
		}
	}
	if unsigned {
		// A peer of the release before, in a rolling upgrade: it signs
		// nothing and records no tenures.
		r.metrics.unsigned.WithLabelValues(c.peer.ID).Inc()
	} else if err := r.checkTenure(ctx, c, &v, sig); err != nil {
		return err
	}
	r.remember(&v)
	return nil
}

// verifyDelta checks that an update's delta is the delta to its view:
// same service and versions, the view's checksum and signature, and,
// when the base it applies to is known here, that base plus delta is the
// view (endpoints and zones). A delta whose base is not known here is
// dropped (the hub sends its subscribers the view instead): it could not
// be checked.
func (r *Relay) verifyDelta(rec *Record, v *assembler.View) error {
	var d assembler.Delta
	if err := jsonv2.Unmarshal(rec.Delta, &d); err != nil {
		return fmt.Errorf("%w: the delta of %s@%d does not decode: %w", ErrForged, rec.Service, rec.Version, err)
	}
	switch {
	case d.Service != v.Service || d.Version != v.Version || d.FromVersion != rec.FromVersion:
		return fmt.Errorf("%w: update of %s@%d from %d carries a delta of %s from %d to %d", ErrForged, v.Service, v.Version, rec.FromVersion, d.Service, d.FromVersion, d.Version)
	case d.Checksum != v.Checksum:
		return fmt.Errorf("%w: the delta of %s@%d does not carry its view's checksum", ErrForged, v.Service, v.Version)
	case !sameSignature(d.Signature, v.Signature):
		return fmt.Errorf("%w: the delta of %s@%d does not carry its view's signature", ErrForged, v.Service, v.Version)
	}
	base := r.base(v.Service, d.FromVersion)
	if base == nil {
		rec.Delta, rec.FromVersion, rec.Withdrawal, rec.Rebased = nil, 0, false, false
		return nil
	}
	eps, zones := applyDelta(base, &d)
	if sum := assembler.Checksum(eps); sum != v.Checksum {
		return fmt.Errorf("%w: the delta of %s from %d to %d does not produce its view (checksum %s, the view's %s)", ErrForged, v.Service, d.FromVersion, d.Version, sum, v.Checksum)
	}
	if assembler.ZonesDigest(zones) != assembler.ZonesDigest(v.Zones) {
		return fmt.Errorf("%w: the delta of %s from %d to %d does not produce its view's zones", ErrForged, v.Service, d.FromVersion, d.Version)
	}
	return nil
}

func sameSignature(a, b *assembler.Signature) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// applyDelta returns base's endpoints and zones with d applied.
func applyDelta(base *assembler.View, d *assembler.Delta) ([]assembler.Endpoint, map[string]assembler.ZoneStatus) {
	byID := make(map[uuid.UUID]assembler.Endpoint, len(base.Endpoints)+len(d.Upserts))
	for _, e := range base.Endpoints {
		byID[e.InstanceID] = e
	}
	for _, id := range d.Removals {
		delete(byID, id)
	}
	for _, e := range d.Upserts {
		byID[e.InstanceID] = e
	}
	zones := maps.Clone(base.Zones)
	if zones == nil {
		zones = map[string]assembler.ZoneStatus{}
	}
	maps.Copy(zones, d.Zones)
	for _, z := range d.RemovedZones {
		delete(zones, z)
	}
	return slices.Collect(maps.Values(byID)), zones
}

// base returns the view of service at version, as verified here or held
// by the hub; nil when neither holds it.
func (r *Relay) base(service string, version uint64) *assembler.View {
	r.viewsMu.Lock()
	v := r.views[service]
	r.viewsMu.Unlock()
	if v != nil && v.Version == version {
		return v
	}
	f, ok := r.cfg.Hub.View(service)
	if !ok || f.Version != version {
		return nil
	}
	// The hub holds only views this replica published or verified.
	var hv assembler.View
	if err := jsonv2.Unmarshal(f.JSON, &hv); err != nil || hv.Service != service || hv.Version != version {
		return nil
	}
	return &hv
}

// remember keeps the last verified view of each service, the base the
// next delta is checked against.
func (r *Relay) remember(v *assembler.View) {
	r.viewsMu.Lock()
	defer r.viewsMu.Unlock()
	if old := r.views[v.Service]; old == nil || old.Version < v.Version {
		r.views[v.Service] = v
	}
}

// checkTenure refuses a signed view whose version epoch is not a sealed
// tenure of its service's shard held by the replica that signed it. When
// that cannot be told (the shard count or the tenures cannot be read:
// PostgreSQL is away) the view is believed on its signature alone and
// counted: a database outage must not stop relaying.
func (r *Relay) checkTenure(ctx context.Context, c *conn, v *assembler.View, sig *assembler.Signature) error {
	if r.cfg.Tenures == nil || r.cfg.ShardOf == nil {
		return nil
	}
	shard, ok := r.cfg.ShardOf(v.Service)
	if !ok {
		r.metrics.unchecked.Inc()
		return nil
	}
	epoch := v.Version >> assembler.CounterBits
	owner, err := r.cfg.Tenures.Owner(ctx, shard, epoch)
	switch {
	case err == nil && owner == sig.Replica:
		r.noteTenureEpoch(epoch)
		return nil
	case err == nil:
		r.noteTenureEpoch(epoch)
		return fmt.Errorf("%w: %s@%d is signed by replica %s, but shard %d's tenure under epoch %d is replica %s's", errOutsideTenure, v.Service, v.Version, sig.Replica, shard, epoch, owner)
	case errors.Is(err, tenure.ErrNone) && epoch <= r.maxTenureEpoch.Load():
		// No sealed tenure for this shard, under an epoch the region has
		// issued (a sealed tenure of some shard under it or a later one
		// was seen): an absence, which is never believed on its own. A
		// tenure row deleted by hand, or one the owner had not recorded
		// when it published, must not stop the region relaying views its
		// key signed; it is alarmed and counted. An epoch above every
		// tenure seen (a version that would freeze the service) is
		// refused below.
		r.refuse(c, fmt.Errorf("%w: %s@%d (signed by replica %s): shard %d has no sealed tenure under epoch %d; believed on its signature", errOutsideTenure, v.Service, v.Version, sig.Replica, shard, epoch))
		return nil
	case errors.Is(err, tenure.ErrNone):
		return fmt.Errorf("%w: %s@%d (signed by replica %s): shard %d has no sealed tenure under epoch %d, above every tenure seen", errOutsideTenure, v.Service, v.Version, sig.Replica, shard, epoch)
	default:
		r.metrics.unchecked.Inc()
		r.log.Debug("a view's tenure cannot be read; believed on its signature", "service", v.Service, "version", v.Version, "err", err)
		return nil
	}
}

// refuse counts a refused record and raises its alarm for the peer.
func (r *Relay) refuse(c *conn, err error) {
	kind := AlarmRelayForged
	if errors.Is(err, errOutsideTenure) {
		kind = AlarmViewOutsideTenure
		r.metrics.outside.WithLabelValues(c.peer.ID).Inc()
	} else {
		r.metrics.forged.WithLabelValues(c.peer.ID).Inc()
	}
	now := r.cfg.Now()
	k := kind + "\x00" + c.peer.ID + "\x00" + c.peer.Address
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.refusals[k]
	if a == nil || now.Sub(a.last) > forgedAlarmFor {
		a = &refusal{kind: kind, peer: c.peer.ID, address: c.peer.Address, since: now}
		r.refusals[k] = a
		// Once per alarm: a peer sending thousands must not flood the log
		// (the counter and the alarm's count say how many).
		r.log.Warn("refused a peer's record", "alarm", kind, "peer", c.peer.ID, "address", c.peer.Address, "err", err)
	} else {
		r.log.Debug("refused a peer's record", "alarm", kind, "peer", c.peer.ID, "address", c.peer.Address, "err", err)
	}
	a.last, a.why = now, err.Error()
	a.count++
}

// refusalAlarms returns the open relay_forged and view_outside_tenure
// alarms, dropping those older than forgedAlarmFor. Called with r.mu held.
func (r *Relay) refusalAlarmsLocked(now time.Time) []assembler.Alarm {
	var out []assembler.Alarm
	for k, a := range r.refusals {
		if now.Sub(a.last) > forgedAlarmFor {
			delete(r.refusals, k)
			continue
		}
		var what string
		if a.kind == AlarmRelayForged {
			what = "sent views that are not signed by the region's key over their contents (or deltas that do not produce them); none was applied, and the stream was ended each time"
		} else {
			what = "sent views signed outside their shard's sealed tenures; none was applied"
		}
		out = append(out, assembler.Alarm{Kind: a.kind, Since: a.since, Detail: fmt.Sprintf(
			"replica %s (%s) %s: %d refused, the last %s ago: %s",
			a.peer, a.address, what, a.count, now.Sub(a.last).Truncate(time.Second), a.why)})
	}
	slices.SortFunc(out, func(a, b assembler.Alarm) int {
		if a.Kind != b.Kind {
			if a.Kind < b.Kind {
				return -1
			}
			return 1
		}
		return a.Since.Compare(b.Since)
	})
	return out
}

// noteTenureEpoch raises the highest epoch a sealed tenure was seen
// under.
func (r *Relay) noteTenureEpoch(epoch uint64) {
	for {
		cur := r.maxTenureEpoch.Load()
		if epoch <= cur || r.maxTenureEpoch.CompareAndSwap(cur, epoch) {
			return
		}
	}
}
