package tgsync

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/musterhq/muster/resolver"
)

// Key names a target in a group: its address and port.
type Key struct {
	Addr string `json:"addr"`
	Port int    `json:"port"`
}

// String is "addr:port".
func (k Key) String() string { return k.Addr + ":" + strconv.Itoa(k.Port) }

func compareKeys(a, b Key) int {
	return cmp.Or(cmp.Compare(a.Addr, b.Addr), cmp.Compare(a.Port, b.Port))
}

// Want is a target the view routes to.
type Want struct {
	Key
	InstanceID string `json:"instance_id"`
	Zone       string `json:"zone"`
	// Weight is the target's HAProxy weight (1..256): its share of
	// traffic (endpoint weight x zone traffic weight) x 100. ELBv2 has no
	// per-target weight and ignores it.
	Weight int `json:"weight"`
}

// Have is a target the group holds now.
type Have struct {
	Key
	// Weight is the backend's current weight (HAProxy), 0 when the backend
	// has none (ELBv2).
	Weight int `json:"weight,omitempty"`
	// Slot is the backend's own handle of the target (the HAProxy server
	// name), "" for ELBv2.
	Slot string `json:"slot,omitempty"`
	// State is the backend's word for the target (ELBv2 health state,
	// HAProxy "ready"/"drain"), for the plan's table.
	State string `json:"state,omitempty"`
}

// MaxWeight is the largest HAProxy weight.
const MaxWeight = 256

// WeightOf turns a resolver share (endpoint weight x zone traffic weight,
// 1 at full weight) into an HAProxy weight: share x 100, at least 1 (a
// target with a share is routed to) and at most MaxWeight.
func WeightOf(share float64) int {
	w := int(math.Round(share * 100))
	return min(max(w, 1), MaxWeight)
}

// Desired builds the wanted targets from a snapshot's Targets, with the
// binding's port override (0 keeps each endpoint's port). Two endpoints
// that land on the same address and port (possible only with an
// override) are one target, with the larger weight.
func Desired(targets []resolver.Target, port int) []Want {
	out := make([]Want, 0, len(targets))
	idx := make(map[Key]int, len(targets))
	for _, t := range targets {
		k := Key{Addr: t.Address, Port: t.Port}
		if port != 0 {
			k.Port = port
		}
		w := Want{Key: k, InstanceID: t.InstanceID, Zone: t.Zone, Weight: WeightOf(t.Share)}
		if i, ok := idx[k]; ok {
			out[i].Weight = max(out[i].Weight, w.Weight)
			continue
		}
		idx[k] = len(out)
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b Want) int { return compareKeys(a.Key, b.Key) })
	return out
}

// Policy is a binding's safety knobs as the plan uses them.
type Policy struct {
	// MaxDeregisterFraction caps deregistrations per interval at this
	// fraction of the group's current size (at least 1).
	MaxDeregisterFraction float64
	// AddStepFraction caps additions per interval at this fraction of the
	// group's current size (at least 1), when the backend does not ramp
	// new targets itself. An empty group takes every addition at once.
	AddStepFraction float64
	// OwnGroup: every target in the group is muster's to manage; none is
	// reported as unmanaged and left alone.
	OwnGroup bool
}

// Input is everything one reconcile decision depends on.
type Input struct {
	Desired []Want
	Current []Have
	// Known reports whether a target is muster's: an endpoint of the view
	// (in any state) or one tgsync registered. Others are unmanaged.
	Known func(Key) bool
	// InView reports whether a target is an endpoint of the view now (in
	// any state). A known target missing from the view is one the
	// registry no longer lists.
	InView func(Key) bool
	// Registered is how many instances the registry lists for the
	// service (resolver.Snapshot.Registered); RegisteredKnown is false
	// when the view does not say.
	Registered      int
	RegisteredKnown bool
	Policy          Policy
	// DeregisteredRecently and RegisteredRecently are the capped
	// deregistrations and stepped additions already made within the
	// current interval; they count against the caps.
	DeregisteredRecently, RegisteredRecently int
	// BackendRamps: the backend brings new targets up slowly itself
	// (HAProxy weights, an ELBv2 group with slow start), so additions are
	// not stepped.
	BackendRamps bool
}

// Hold reasons of a Plan.
const (
	// HeldEmpty: the view routes to nothing, so the plan deregisters
	// nothing: muster is never the reason a group empties.
	HeldEmpty = "empty"
)

// Plan is one reconcile decision: what to change now, and what waits.
type Plan struct {
	Register   []Want `json:"register"`
	Reweight   []Want `json:"reweight"`
	Deregister []Have `json:"deregister"`
	// DeferredDeregister waits for the next interval's budget (the cap);
	// DeferredRegister for the next addition step.
	DeferredDeregister []Have `json:"deferred_deregister"`
	DeferredRegister   []Want `json:"deferred_register"`
	// Explained counts the deregistrations the registry accounts for
	// (not capped).
	Explained int `json:"explained"`
	// Unmanaged are targets in the group that are not muster's, left
	// alone.
	Unmanaged []Have `json:"unmanaged"`
	// Held is HeldEmpty when the plan refused to empty the group.
	Held string `json:"held,omitempty"`
}

// Empty reports whether the plan changes nothing now.
func (p Plan) Empty() bool {
	return len(p.Register) == 0 && len(p.Reweight) == 0 && len(p.Deregister) == 0
}

// Capped is how many targets a fraction of n allows: floor(f x n), at
// least 1.
func Capped(f float64, n int) int {
	return max(1, int(math.Floor(f*float64(n)+1e-9)))
}

// Compute decides what to change. It is a pure function of its input.
func Compute(in Input) Plan {
	var p Plan
	want := make(map[Key]Want, len(in.Desired))
	for _, w := range in.Desired {
		want[w.Key] = w
	}
	have := make(map[Key]Have, len(in.Current))
	for _, h := range in.Current {
		have[h.Key] = h
	}
	ours := func(k Key) bool { return in.Known != nil && in.Known(k) }

	// Additions and weight changes.
	var adds []Want
	for _, w := range in.Desired {
		h, ok := have[w.Key]
		switch {
		case !ok:
			adds = append(adds, w)
		case h.Weight != 0 && h.Weight != w.Weight:
			p.Reweight = append(p.Reweight, w)
		}
	}
	if in.BackendRamps || len(in.Current) == 0 {
		p.Register = adds
	} else {
		left := max(0, Capped(in.Policy.AddStepFraction, len(in.Current))-in.RegisteredRecently)
		k := min(left, len(adds))
		p.Register, p.DeferredRegister = adds[:k], adds[k:]
	}

	// Removals: muster's targets the view does not route to.
	var gone, withdrawn []Have
	managed := 0 // muster's targets in the group
	for _, h := range in.Current {
		_, wanted := want[h.Key]
		if !ours(h.Key) {
			switch {
			case wanted:
			case in.Policy.OwnGroup:
				withdrawn = append(withdrawn, h)
			default:
				p.Unmanaged = append(p.Unmanaged, h)
			}
			continue
		}
		managed++
		if wanted {
			continue
		}
		if in.InView != nil && !in.InView(h.Key) {
			gone = append(gone, h)
		} else {
			withdrawn = append(withdrawn, h)
		}
	}
	if len(in.Desired) == 0 {
		// Never empty a group because of muster.
		p.Held = HeldEmpty
		p.DeferredDeregister = append(gone, withdrawn...)
		p.Register, p.DeferredRegister, p.Reweight = nil, nil, nil
		return p
	}
	// The registry accounts for as many removals as the group holds
	// more of muster's targets than the registry lists instances.
	explained := 0
	if in.RegisteredKnown {
		explained = min(len(gone), max(0, managed-in.Registered))
	}
	p.Deregister = append(p.Deregister, gone[:explained]...)
	p.Explained = explained
	rest := append(gone[explained:len(gone):len(gone)], withdrawn...)
	slices.SortFunc(rest, func(a, b Have) int { return compareKeys(a.Key, b.Key) })
	left := max(0, Capped(in.Policy.MaxDeregisterFraction, len(in.Current))-in.DeregisteredRecently)
	k := min(left, len(rest))
	p.Deregister = append(p.Deregister, rest[:k]...)
	p.DeferredDeregister = rest[k:]
	if len(in.Current)-len(p.Deregister)+len(p.Register) < 1 {
		// The additions wait for their step: removing first would empty
		// the group in between.
		p.DeferredDeregister = append(p.Deregister, p.DeferredDeregister...)
		p.Deregister, p.Explained = nil, 0
	}
	return p
}

// Describe is a one-line summary of the plan, for logs.
func (p Plan) Describe() string {
	s := fmt.Sprintf("register %d, reweight %d, deregister %d (%d the registry explains), deferred: %d deregistrations, %d registrations; %d unmanaged",
		len(p.Register), len(p.Reweight), len(p.Deregister), p.Explained, len(p.DeferredDeregister), len(p.DeferredRegister), len(p.Unmanaged))
	if p.Held != "" {
		s += "; held: " + p.Held
	}
	return s
}
