package assembler_test

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"
	"pgregory.net/rapid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/eligibility"
)

// client is a subscriber's copy of one service's view, built only from
// published views and deltas.
type client struct {
	version uint64
	eps     map[uuid.UUID]assembler.Endpoint
	zones   map[string]assembler.ZoneStatus
}

func (c *client) apply(rt *rapid.T, d *assembler.Delta) {
	if d.FromVersion != c.version {
		rt.Fatalf("%s: delta from %d, client at %d", d.Service, d.FromVersion, c.version)
	}
	for _, id := range d.Removals {
		if _, ok := c.eps[id]; !ok {
			rt.Fatalf("%s: removal of %v the client does not hold", d.Service, id)
		}
		delete(c.eps, id)
	}
	for _, e := range d.Upserts {
		c.eps[e.InstanceID] = e
	}
	for z, st := range d.Zones {
		c.zones[z] = st
	}
	for _, z := range d.RemovedZones {
		delete(c.zones, z)
	}
	c.version = d.Version
}

func (c *client) endpoints() []assembler.Endpoint {
	out := slices.Collect(maps.Values(c.eps))
	slices.SortFunc(out, func(a, b assembler.Endpoint) int { return bytes.Compare(a.InstanceID[:], b.InstanceID[:]) })
	return out
}

var zoneNames = []string{"a", "b", "c"}

// drawInput draws an input of service name over pool. admitted holds the
// ids of name drawn not awaiting before: never awaiting again, as the
// evaluation core never takes an admitted instance back to awaiting its
// first success (that would be lost state, which the assembler answers by
// counting what it publishes: TestServedInstancesAreCapacityWhateverTheInputSays).
func drawInput(rt *rapid.T, name string, pool []uuid.UUID, admitted map[uuid.UUID]bool) assembler.ServiceInput {
	in := assembler.ServiceInput{
		Name:               name,
		MinHealthyFraction: rapid.SampledFrom([]float64{0, 0.3, 0.5, 1}).Draw(rt, "frac"),
		Capabilities:       rapid.SampledFrom([][]string{nil, {"probe"}, {"self", "probe"}}).Draw(rt, "caps"),
	}
	// Shift-backs set a traffic weight per zone; it must show in the zone
	// status and change nothing else (the guard is about health).
	traffic := map[string]float64{}
	for _, z := range zoneNames {
		if w := rapid.SampledFrom([]float64{-1, 0, 0.1, 0.5, 1}).Draw(rt, "traffic"); w >= 0 {
			traffic[z] = w
		}
	}
	in.Traffic = func(z string) float64 {
		if w, ok := traffic[z]; ok {
			return w
		}
		return 1
	}
	for i, id := range pool {
		if !rapid.Bool().Draw(rt, "present") {
			continue
		}
		st := eligibility.State(rapid.IntRange(0, 3).Draw(rt, "state"))
		w := rapid.SampledFrom([]float64{0, 0.25, 0.5, 1}).Draw(rt, "weight")
		if st == eligibility.Ineligible {
			w = 0
		}
		x := assembler.InstanceInput{
			ID: id, Address: "10.1.0.1", Port: 9000 + i, Zone: zoneNames[i%3], State: st, Weight: w,
			HealthKnown: rapid.Bool().Draw(rt, "known"), Quarantined: rapid.IntRange(0, 5).Draw(rt, "q") == 0,
			// A new instance awaiting its first success is ineligible
			// (the evaluation core never has one in rotation).
			Awaiting: st == eligibility.Ineligible && !admitted[id] && rapid.IntRange(0, 2).Draw(rt, "awaiting") == 0,
		}
		if !x.Awaiting {
			admitted[id] = true
		}
		in.Instances = append(in.Instances, x)
	}
	return in
}

// model is the guard written out independently: what the view of in must
// be once everything queued is published.
func model(in assembler.ServiceInput) ([]assembler.Endpoint, map[string]assembler.ZoneStatus) {
	frac := in.MinHealthyFraction
	if frac <= 0 {
		frac = 0.5
	}
	caps := slices.Compact(slices.Sorted(slices.Values(append([]string{}, in.Capabilities...))))
	routable := func(x assembler.InstanceInput) bool { return !x.Quarantined && x.State != eligibility.Ineligible }
	zones := map[string]assembler.ZoneStatus{}
	for _, x := range in.Instances {
		st := zones[x.Zone]
		st.Registered++
		if !x.Awaiting {
			st.Total++
		}
		if routable(x) {
			st.Eligible++
		}
		st.MinHealthyFraction = frac
		st.TrafficWeight = 1
		if in.Traffic != nil {
			st.TrafficWeight = in.Traffic(x.Zone)
		}
		zones[x.Zone] = st
	}
	for z, st := range zones {
		st.Guard = "ok"
		if float64(st.Eligible) < frac*float64(st.Total)-1e-9 {
			st.Guard = "tripped"
		}
		zones[z] = st
	}
	var eps []assembler.Endpoint
	for _, x := range in.Instances {
		e := assembler.Endpoint{
			InstanceID: x.ID, Address: x.Address, Port: x.Port, Zone: x.Zone, State: x.State.String(),
			Weight: x.Weight, Health: "unknown", Capabilities: caps, Quarantined: x.Quarantined,
		}
		if x.HealthKnown {
			e.Health = "known"
		}
		if !routable(x) {
			if zones[x.Zone].Guard != "tripped" || x.Awaiting {
				continue
			}
			e.State, e.Weight = "ineligible", 1
		}
		eps = append(eps, e)
	}
	slices.SortFunc(eps, func(a, b assembler.Endpoint) int { return bytes.Compare(a.InstanceID[:], b.InstanceID[:]) })
	return eps, zones
}

// Random updates, removals, clock steps and drains through a flaky version
// source: every published delta applied to a client copy yields exactly
// the published view and its checksum; versions strictly increase across
// everything published; Drain publishes exactly when NextDue says; once
// settled, each view is the guard's verdict on the last input.
func TestPropDeltasReconstructViews(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		a := assembler.New(assembler.Options{
			AdditionWindow:        time.Duration(rapid.IntRange(1, 3).Draw(rt, "addwin")) * 200 * time.Millisecond,
			MaxAdditionWindow:     4 * time.Second,
			ChangeBudgetPerSecond: rapid.IntRange(1, 20).Draw(rt, "budget"),
		})
		vs := &versions{}
		pool := make([]uuid.UUID, 9)
		for i := range pool {
			pool[i] = id(i)
		}
		services := []string{"s1", "s2"}
		last := map[string]*assembler.ServiceInput{}
		admitted := map[string]map[uuid.UUID]bool{}
		clients := map[string]*client{}
		var lastVersion uint64
		now := t0

		drain := func(now time.Time, fail bool) {
			due, win := a.NextDue(), a.Stats().AdditionWindow
			if fail {
				vs.failNext = 1
			}
			pubs, err := a.Drain(now, vs)
			if fail {
				if err == nil && len(pubs) > 0 {
					rt.Fatalf("published through a failing source")
				}
				vs.failNext = 0
				return
			}
			if err != nil {
				rt.Fatalf("Drain: %v", err)
			}
			// NextDue reads the window as it stands; Drain may grow it
			// first, delaying what was due.
			sameWin := a.Stats().AdditionWindow == win
			if dueNow := !due.IsZero() && !now.Before(due); sameWin && dueNow != (len(pubs) > 0) {
				rt.Fatalf("NextDue %v, now %v, published %d", due, now, len(pubs))
			}
			seen := map[string]bool{}
			for _, p := range pubs {
				v := p.View
				if v.Version <= lastVersion {
					rt.Fatalf("version %d after %d", v.Version, lastVersion)
				}
				lastVersion = v.Version
				if seen[v.Service] {
					rt.Fatalf("%s published twice in one Drain", v.Service)
				}
				seen[v.Service] = true
				if p.Delta == nil {
					clients[v.Service] = &client{version: v.Version, eps: map[uuid.UUID]assembler.Endpoint{}, zones: maps.Clone(v.Zones)}
					for _, e := range v.Endpoints {
						clients[v.Service].eps[e.InstanceID] = e
					}
				} else {
					c := clients[v.Service]
					if c == nil {
						rt.Fatalf("%s: delta before any view", v.Service)
					}
					c.apply(rt, p.Delta)
					if got := assembler.Checksum(c.endpoints()); got != p.Delta.Checksum {
						rt.Fatalf("%s: client checksum %s, delta says %s", v.Service, got, p.Delta.Checksum)
					}
				}
				c := clients[v.Service]
				if diff := cmp.Diff(v.Endpoints, c.endpoints(), cmpopts.EquateEmpty()); diff != "" {
					rt.Fatalf("%s v%d: client endpoints differ (-view +client):\n%s", v.Service, v.Version, diff)
				}
				if diff := cmp.Diff(v.Zones, c.zones, cmpopts.EquateEmpty()); diff != "" {
					rt.Fatalf("%s v%d: client zones differ (-view +client):\n%s", v.Service, v.Version, diff)
				}
				if v.Checksum != assembler.Checksum(v.Endpoints) {
					rt.Fatalf("%s: view checksum does not match its endpoints", v.Service)
				}
				var back assembler.View
				if err := json.Unmarshal(p.ViewJSON, &back); err != nil || back.Checksum != v.Checksum || back.Version != v.Version {
					rt.Fatalf("%s: ViewJSON does not decode to the view: %v", v.Service, err)
				}
				if cur, ok := a.View(v.Service); ok && cur != v {
					rt.Fatalf("%s: View() is not the view just published", v.Service)
				}
			}
		}

		for range rapid.IntRange(1, 80).Draw(rt, "steps") {
			switch rapid.IntRange(0, 9).Draw(rt, "op") {
			case 0, 1, 2, 3:
				name := rapid.SampledFrom(services).Draw(rt, "service")
				if admitted[name] == nil {
					admitted[name] = map[uuid.UUID]bool{}
				}
				in := drawInput(rt, name, pool, admitted[name])
				a.Update(in, now)
				last[name] = &in
			case 4:
				name := rapid.SampledFrom(services).Draw(rt, "service")
				a.RemoveService(name, now)
				delete(last, name)
			case 5, 6:
				now = now.Add(time.Duration(rapid.IntRange(0, 3000).Draw(rt, "ms")) * time.Millisecond)
			default:
				drain(now, rapid.IntRange(0, 4).Draw(rt, "fail") == 0)
			}
		}
		// Settle: drain until nothing is queued.
		for range 20 {
			due := a.NextDue()
			if due.IsZero() {
				break
			}
			if due.After(now) {
				now = due
			}
			drain(now, false)
		}
		if st := a.Stats(); st.QueuedAdditions+st.QueuedWithdrawals != 0 || !a.NextDue().IsZero() {
			rt.Fatalf("not settled: %+v", st)
		}
		for _, name := range services {
			in, live := last[name]
			v, ok := a.View(name)
			if !live {
				if ok {
					rt.Fatalf("%s removed but still has a view", name)
				}
				continue
			}
			wantEps, wantZones := model(*in)
			if !ok {
				if len(wantEps) != 0 || len(wantZones) != 0 {
					rt.Fatalf("%s: no view, want %d endpoints", name, len(wantEps))
				}
				continue
			}
			if diff := cmp.Diff(wantEps, v.Endpoints, cmpopts.EquateEmpty()); diff != "" {
				rt.Fatalf("%s settled endpoints (-model +view):\n%s", name, diff)
			}
			if diff := cmp.Diff(wantZones, v.Zones, cmpopts.EquateEmpty()); diff != "" {
				rt.Fatalf("%s settled zones (-model +view):\n%s", name, diff)
			}
		}
	})
}

// The checksum does not depend on the order of the endpoints.
func TestPropChecksumOrderIndependent(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(0, 30).Draw(rt, "n")
		eps := make([]assembler.Endpoint, n)
		for i := range eps {
			eps[i] = assembler.Endpoint{
				InstanceID: id(rapid.IntRange(0, 1000).Draw(rt, "id")*64 + i), Address: rapid.String().Draw(rt, "addr"),
				Port: rapid.IntRange(0, 65535).Draw(rt, "port"), Zone: rapid.SampledFrom(zoneNames).Draw(rt, "zone"),
				State: "eligible", Weight: rapid.Float64Range(0, 1).Draw(rt, "w"), Health: "known",
			}
		}
		want := assembler.Checksum(eps)
		perm := rapid.Permutation(eps).Draw(rt, "perm")
		if got := assembler.Checksum(perm); got != want {
			rt.Fatalf("permuted checksum %s, want %s", got, want)
		}
	})
}

// Random updates and drains with restarts in between: each restart seeds a
// new assembler with a view per service as the publisher persisted it (the
// last one published, or an older one when the newest write was lost) and
// hands it every service's current input, as the evaluator's rebuild does.
// Every client keeps applying deltas across restarts (a client whose
// version is not the delta's FromVersion takes the full view, which must
// be above what it holds); versions strictly increase; last_instance is
// open after a restart exactly when the view restored had an endpoint in
// rotation, or the service had one since, and the input has none.
func TestPropRestoreAcrossRestarts(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		opts := assembler.Options{AdditionWindow: 200 * time.Millisecond, MaxAdditionWindow: time.Second}
		a := assembler.New(opts)
		vs := &versions{}
		pool := make([]uuid.UUID, 7)
		for i := range pool {
			pool[i] = id(i)
		}
		services := []string{"s1", "s2"}
		last := map[string]*assembler.ServiceInput{}
		admitted := map[string]map[uuid.UUID]bool{}
		clients := map[string]*client{}
		history := map[string][]*assembler.View{} // published views, oldest first
		restarts := 0
		var lastVersion uint64
		now := t0

		drain := func(now time.Time) {
			pubs, err := a.Drain(now, vs)
			if err != nil {
				rt.Fatalf("Drain: %v", err)
			}
			for _, p := range pubs {
				v := p.View
				if v.Version <= lastVersion {
					rt.Fatalf("version %d after %d", v.Version, lastVersion)
				}
				lastVersion = v.Version
				history[v.Service] = append(history[v.Service], v)
				c := clients[v.Service]
				if p.Delta != nil && c != nil && c.version == p.Delta.FromVersion {
					c.apply(rt, p.Delta)
					if got := assembler.Checksum(c.endpoints()); got != p.Delta.Checksum {
						rt.Fatalf("%s: client checksum %s, delta says %s", v.Service, got, p.Delta.Checksum)
					}
				} else {
					if p.Delta != nil && c != nil && (restarts == 0 || v.Version <= c.version) {
						rt.Fatalf("%s: delta from %d, client at %d, restarts %d", v.Service, p.Delta.FromVersion, c.version, restarts)
					}
					c = &client{version: v.Version, eps: map[uuid.UUID]assembler.Endpoint{}, zones: maps.Clone(v.Zones)}
					for _, e := range v.Endpoints {
						c.eps[e.InstanceID] = e
					}
					clients[v.Service] = c
				}
				if diff := cmp.Diff(v.Endpoints, c.endpoints(), cmpopts.EquateEmpty()); diff != "" {
					rt.Fatalf("%s v%d: client endpoints differ (-view +client):\n%s", v.Service, v.Version, diff)
				}
				if diff := cmp.Diff(v.Zones, c.zones, cmpopts.EquateEmpty()); diff != "" {
					rt.Fatalf("%s v%d: client zones differ (-view +client):\n%s", v.Service, v.Version, diff)
				}
			}
		}

		restart := func() {
			restarts++
			b := assembler.New(opts)
			restored := map[string]bool{}
			for _, name := range services {
				if _, held := a.View(name); !held || len(history[name]) == 0 {
					continue
				}
				h := history[name]
				// The newest persisted write may have been lost.
				v := h[len(h)-1]
				if len(h) > 1 && rapid.IntRange(0, 3).Draw(rt, "lost") == 0 {
					v = h[len(h)-2]
				}
				var back assembler.View
				if err := json.Unmarshal(v.Encoded(), &back); err != nil {
					rt.Fatal(err)
				}
				if err := b.Restore(&back); err != nil {
					rt.Fatalf("Restore %s v%d: %v", name, v.Version, err)
				}
				for _, e := range v.Endpoints {
					if e.State != "ineligible" {
						restored[name] = true
					}
				}
			}
			a = b
			for _, name := range services {
				in, live := last[name]
				if !live {
					a.RemoveService(name, now)
					continue
				}
				a.Update(*in, now)
				routable := false
				for _, x := range in.Instances {
					if !x.Quarantined && x.State != eligibility.Ineligible {
						routable = true
					}
				}
				open := false
				for _, al := range a.Alarms() {
					open = open || (al.Kind == assembler.AlarmLastInstance && al.Service == name)
				}
				if want := restored[name] && !routable; open != want {
					rt.Fatalf("%s after a restart: last_instance open %v, want %v (restored in rotation %v)", name, open, want, restored[name])
				}
			}
		}

		for range rapid.IntRange(1, 60).Draw(rt, "steps") {
			switch rapid.IntRange(0, 9).Draw(rt, "op") {
			case 0, 1, 2, 3:
				name := rapid.SampledFrom(services).Draw(rt, "service")
				if admitted[name] == nil {
					admitted[name] = map[uuid.UUID]bool{}
				}
				in := drawInput(rt, name, pool, admitted[name])
				a.Update(in, now)
				last[name] = &in
			case 4:
				name := rapid.SampledFrom(services).Draw(rt, "service")
				a.RemoveService(name, now)
				delete(last, name)
			case 5:
				restart()
			case 6, 7:
				now = now.Add(time.Duration(rapid.IntRange(0, 1500).Draw(rt, "ms")) * time.Millisecond)
			default:
				drain(now)
			}
		}
		drain(now.Add(time.Hour))
		for _, name := range services {
			in, live := last[name]
			v, ok := a.View(name)
			switch {
			case !live && ok:
				rt.Fatalf("%s removed but still has a view", name)
			case !live:
				continue
			case !ok:
				rt.Fatalf("%s: no view after settling", name)
			}
			wantEps, wantZones := model(*in)
			if diff := cmp.Diff(wantEps, v.Endpoints, cmpopts.EquateEmpty()); diff != "" {
				rt.Fatalf("%s settled endpoints (-model +view):\n%s", name, diff)
			}
			if diff := cmp.Diff(wantZones, v.Zones, cmpopts.EquateEmpty()); diff != "" {
				rt.Fatalf("%s settled zones (-model +view):\n%s", name, diff)
			}
			if c := clients[name]; c == nil || c.version != v.Version {
				rt.Fatalf("%s: client not at the settled view", name)
			}
		}
	})
}
