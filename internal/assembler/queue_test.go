package assembler_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
)

// Withdrawals are published within the withdrawal window while additions
// are queued and the region is shedding; the addition window grows under
// saturation, one shed episode is counted, and it shrinks back.
func TestWithdrawalsHoldWhileShedding(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{AdditionWindow: time.Second, MaxAdditionWindow: 8 * time.Second, ChangeBudgetPerSecond: 100})
	vs := &versions{}
	bulk := zoned(0, elig, 400, "a")
	web := zoned(1000, elig, 10, "a")
	a.Update(svc("bulk", 0.5, bulk), t0)
	a.Update(svc("web", 0.5, web), t0)
	settle(t, a, t0, vs)
	if st := a.Stats(); st.ShedEpisodes != 0 || st.Shedding {
		t.Fatalf("the initial population shed: %+v", st)
	}

	start := t0.Add(time.Hour)
	const tick = 10 * time.Millisecond
	var (
		maxWin                       time.Duration
		withdrawnAt, addedAt         time.Time
		withdrawalSeen, additionSeen time.Time
		newWeb                       = inst(1100, "a", elig)
	)
	for k := 0; k <= 4000; k++ { // 40 s in 10 ms steps
		now := start.Add(time.Duration(k) * tick)
		if k%10 == 0 && k < 1000 { // 10 s of 50 changes per 100 ms: 500/s
			round := k / 10
			for i := range 50 {
				j := (round*50 + i) % len(bulk)
				bulk[j].Weight = 1.5 - bulk[j].Weight // 1 <-> 0.5: additions
			}
			a.Update(svc("bulk", 0.5, bulk), now)
		}
		switch k {
		case 400: // 4 s in: a new web instance (an addition)
			addedAt = now
			a.Update(svc("web", 0.5, append(slices.Clone(web), newWeb)), now)
		case 503: // 5.03 s in: web instance 1000 fails
			withdrawnAt = now
			a.Update(svc("web", 0.5, append(set(web, inelg, 1000), newWeb)), now)
			if st := a.Stats(); !st.Shedding || st.QueuedAdditions == 0 {
				t.Fatalf("want shedding with additions queued when the withdrawal arrives, got %+v", st)
			}
		}
		for _, p := range drainAt(t, a, now, vs) {
			if p.View.Service != "web" {
				continue
			}
			d := p.Delta
			if d.Withdrawal {
				withdrawalSeen = now
				if len(d.Removals) != 1 || d.Removals[0] != id(1000) || len(d.Upserts) != 0 {
					t.Errorf("withdrawal delta carries %v removals and %d upserts, want only instance 1000 removed", d.Removals, len(d.Upserts))
				}
			} else if len(d.Upserts) == 1 && d.Upserts[0].InstanceID == newWeb.ID {
				additionSeen = now
			}
		}
		maxWin = max(maxWin, a.Stats().AdditionWindow)
	}
	if withdrawalSeen.IsZero() || withdrawalSeen.Sub(withdrawnAt) > 50*time.Millisecond {
		t.Errorf("withdrawal queued at +%v published at +%v, want within 50ms", withdrawnAt.Sub(start), withdrawalSeen.Sub(start))
	}
	if lag := additionSeen.Sub(addedAt); lag <= time.Second {
		t.Errorf("addition published %v after it was queued, want it shed past the 1s base window", lag)
	}
	st := a.Stats()
	if maxWin != 8*time.Second || st.ShedEpisodes != 1 {
		t.Errorf("max addition window %v, episodes %d; want 8s and 1", maxWin, st.ShedEpisodes)
	}
	if st.Shedding || a.Shedding() || st.AdditionWindow != time.Second {
		t.Errorf("after the load fell: %+v, want back at the 1s base, not shedding", st)
	}
	if st.QueuedAdditions != 0 || st.QueuedWithdrawals != 0 || !a.NextDue().IsZero() {
		t.Errorf("queues not drained: %+v, next due %v", st, a.NextDue())
	}
}

// The addition window against the change rate.
func TestAdditionWindowAdapts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		perSecond   int // changes per second for 20 s, budget 100/s
		wantMax     time.Duration
		wantEpisode uint64
	}{
		{"quiet", 10, time.Second, 0},
		{"between half and full budget holds", 80, time.Second, 0},
		{"exactly the budget holds", 100, time.Second, 0},
		{"over budget grows to the cap", 150, 16 * time.Second, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := assembler.New(assembler.Options{MaxAdditionWindow: 16 * time.Second, ChangeBudgetPerSecond: 100})
			vs := &versions{}
			ins := zoned(0, elig, 200, "a")
			a.Update(svc("s", 0.5, ins), t0)
			settle(t, a, t0, vs)
			start := t0.Add(time.Hour)
			maxWin, n := time.Duration(0), 0
			for ms := 0; ms < 60_000; ms += 100 {
				now := start.Add(time.Duration(ms) * time.Millisecond)
				if ms < 20_000 {
					for range tc.perSecond / 10 {
						ins[n%len(ins)].Weight = 1.5 - ins[n%len(ins)].Weight
						n++
					}
					a.Update(svc("s", 0.5, ins), now)
				}
				drainAt(t, a, now, vs)
				maxWin = max(maxWin, a.Stats().AdditionWindow)
			}
			st := a.Stats()
			if maxWin != tc.wantMax || st.ShedEpisodes != tc.wantEpisode {
				t.Errorf("max window %v episodes %d, want %v and %d", maxWin, st.ShedEpisodes, tc.wantMax, tc.wantEpisode)
			}
			if st.AdditionWindow != time.Second || st.Shedding {
				t.Errorf("40 s after the load stopped: %+v", st)
			}
		})
	}
}

// Publishing withdrawals alone must not leave a published zone short of
// what the guard keeps; the zone's queued additions go with them.
func TestWithdrawalsCarryAdditionsOfAShortZone(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		old           int   // published instances in zone a
		fresh         int   // new instances queued as additions
		gone          []int // old instances deregistered
		wantCarried   int
		wantZoneCount int // zone a endpoints after the withdrawal version
	}{
		{"replacement of the whole zone", 4, 4, []int{0, 1, 2, 3}, 4, 4},
		{"partial replacement below the fraction", 4, 4, []int{0}, 4, 7},
		{"zone stays above the fraction", 10, 1, []int{0}, 0, 9},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := assembler.New(assembler.Options{AdditionWindow: 10 * time.Second})
			vs := &versions{}
			old := zoned(0, elig, tc.old, "a")
			other := zoned(500, elig, 4, "b")
			a.Update(svc("s", 0.5, append(slices.Clone(old), other...)), t0)
			settle(t, a, t0, vs)
			now := t0.Add(time.Hour)
			all := append(slices.Clone(old), other...)
			all = append(all, zoned(100, elig, tc.fresh, "a")...)
			a.Update(svc("s", 0.5, all), now)
			var left []assembler.InstanceInput
			for _, in := range all {
				if !slices.ContainsFunc(tc.gone, func(n int) bool { return id(n) == in.ID }) {
					left = append(left, in)
				}
			}
			a.Update(svc("s", 0.5, left), now.Add(time.Second))
			pubs := drainAt(t, a, now.Add(time.Second+50*time.Millisecond), vs)
			if len(pubs) != 1 || !pubs[0].Delta.Withdrawal {
				t.Fatalf("want one withdrawal version, got %d", len(pubs))
			}
			d := pubs[0].Delta
			if len(d.Removals) != len(tc.gone) || len(d.Upserts) != tc.wantCarried {
				t.Errorf("delta: %d removals %d upserts, want %d and %d", len(d.Removals), len(d.Upserts), len(tc.gone), tc.wantCarried)
			}
			if got := zoneIDs(pubs[0].View, "a"); got != tc.wantZoneCount {
				t.Errorf("zone a publishes %d endpoints, want %d", got, tc.wantZoneCount)
			}
			if zoneIDs(pubs[0].View, "b") != 4 {
				t.Errorf("zone b changed")
			}
		})
	}
}

// A withdrawal that finds its service's withdrawal queue idle is published
// at once (the leading edge); withdrawals within the window after that
// version are batched into one version at the window's end; once the
// window has passed the queue is idle again. Weight to 0 is a withdrawal;
// lag is reported. (Before issue 14 the lone withdrawal waited the window.)
func TestWithdrawalLeadingEdgeBatchingAndLag(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	ins := zoned(0, elig, 10, "a")
	a.Update(svc("s", 0.5, ins), t0)
	settle(t, a, t0, vs)

	now := t0.Add(time.Hour)
	ins[0].State, ins[0].Weight, ins[0].FirstFailureAt = inelg, 0, now.Add(-3*time.Second)
	a.Update(svc("s", 0.5, ins), now)
	if due := a.NextDue(); !due.Equal(now) {
		t.Fatalf("a lone withdrawal is due at %v, want at once", due.Sub(now))
	}
	pubs := drainAt(t, a, now, vs)
	if len(pubs) != 1 || !pubs[0].Delta.Withdrawal || !slices.Equal(pubs[0].Delta.Removals, []uuid.UUID{id(0)}) {
		t.Fatalf("want instance 0 withdrawn at its arrival, got %d versions", len(pubs))
	}
	if !pubs[0].Delta.GeneratedAt.Equal(now) {
		t.Fatalf("published at %v, want its arrival", pubs[0].Delta.GeneratedAt.Sub(now))
	}
	if diff := cmp.Diff([]time.Duration{3 * time.Second}, pubs[0].WithdrawalLags); diff != "" {
		t.Errorf("lags (-want +got):\n%s", diff)
	}

	// 10 ms later, within the window the first version opened: it waits for
	// the window's end, and a third withdrawal at +30 ms joins it.
	ins[1].Weight = 0 // still eligible, weight to 0
	a.Update(svc("s", 0.5, ins), now.Add(10*time.Millisecond))
	if due := a.NextDue(); !due.Equal(now.Add(50 * time.Millisecond)) {
		t.Fatalf("second withdrawal due at %v, want +50ms (the window after the first version)", due.Sub(now))
	}
	ins[2].State, ins[2].Weight, ins[2].FirstFailureAt = inelg, 0, now.Add(20*time.Millisecond)
	a.Update(svc("s", 0.5, ins), now.Add(30*time.Millisecond))
	if due := a.NextDue(); !due.Equal(now.Add(50 * time.Millisecond)) {
		t.Fatalf("third withdrawal due at %v, want +50ms", due.Sub(now))
	}
	if got := drainAt(t, a, now.Add(49*time.Millisecond), vs); len(got) != 0 {
		t.Fatalf("published before the window: %d", len(got))
	}
	pubs = drainAt(t, a, now.Add(50*time.Millisecond), vs)
	if len(pubs) != 1 {
		t.Fatalf("want one batched version, got %d", len(pubs))
	}
	d := pubs[0].Delta
	want := &assembler.Delta{
		Service: "s", FromVersion: 2, Version: 3, Removals: []uuid.UUID{id(2)},
		Upserts: []assembler.Endpoint{{
			InstanceID: id(1), Address: ins[1].Address, Port: ins[1].Port, Zone: "a", State: "eligible",
			Weight: 0, Health: "known", Capabilities: []string{"probe", "readiness"},
		}},
		Zones:    map[string]assembler.ZoneStatus{"a": {Guard: "ok", Eligible: 8, Total: 10, Registered: 10, MinHealthyFraction: 0.5, TrafficWeight: 1}},
		Checksum: pubs[0].View.Checksum, Withdrawal: true, GeneratedAt: now.Add(50 * time.Millisecond),
	}
	if diff := cmp.Diff(want, d, cmpopts.IgnoreUnexported(assembler.Delta{})); diff != "" {
		t.Errorf("delta (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]time.Duration{30 * time.Millisecond}, pubs[0].WithdrawalLags); diff != "" {
		t.Errorf("lags (-want +got):\n%s", diff)
	}

	// +120 ms: more than a window after the last withdrawal version, the
	// queue is idle again.
	ins[3].State, ins[3].Weight = inelg, 0
	a.Update(svc("s", 0.5, ins), now.Add(120*time.Millisecond))
	if due := a.NextDue(); !due.Equal(now.Add(120 * time.Millisecond)) {
		t.Fatalf("withdrawal after an idle window due at %v, want at once (+120ms)", due.Sub(now))
	}
	if pubs := drainAt(t, a, now.Add(120*time.Millisecond), vs); len(pubs) != 1 || !pubs[0].Delta.Withdrawal {
		t.Fatalf("want the withdrawal published at its arrival, got %d versions", len(pubs))
	}
}

// A burst of 1,000 withdrawals over 1 s, one a millisecond, in each of
// two services, drained whenever something is due: each service gets
// about one version per withdrawal window (the leading edge, then one per
// window), never one per withdrawal, and none waits longer than the
// window.
func TestWithdrawalBurstBatches(t *testing.T) {
	t.Parallel()
	const (
		perService = 1000
		instances  = 1200 // failing 1,000 leaves 1/6, above the 0.1 fraction: nothing trips
	)
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	names := []string{"a", "b"}
	ins := map[string][]assembler.InstanceInput{}
	for i, n := range names {
		ins[n] = zoned(i*10_000, elig, instances, "z1")
		a.Update(svc(n, 0.1, ins[n]), t0)
	}
	settle(t, a, t0, vs)

	start := t0.Add(time.Hour)
	versionsOf := map[string]int{}
	withdrawn := map[string]int{}
	queuedAt := map[uuid.UUID]time.Time{}
	var worst time.Duration
	drain := func(now time.Time) {
		for _, p := range drainAt(t, a, now, vs) {
			versionsOf[p.View.Service]++
			for _, r := range p.Delta.Removals {
				withdrawn[p.View.Service]++
				worst = max(worst, now.Sub(queuedAt[r]))
			}
		}
	}
	for ms := range perService {
		now := start.Add(time.Duration(ms) * time.Millisecond)
		// Whatever fell due between two arrivals is published on time.
		for due := a.NextDue(); !due.IsZero() && due.Before(now); due = a.NextDue() {
			drain(due)
		}
		for _, n := range names {
			ins[n][ms].State, ins[n][ms].Weight = inelg, 0
			queuedAt[ins[n][ms].ID] = now
			a.Update(svc(n, 0.1, ins[n]), now)
		}
		drain(now)
	}
	for due := a.NextDue(); !due.IsZero(); due = a.NextDue() {
		drain(due)
	}
	for _, n := range names {
		if withdrawn[n] != perService {
			t.Errorf("%s: %d withdrawals published, want %d", n, withdrawn[n], perService)
		}
		// 1 s / 50 ms = 20 windows, plus the leading edge.
		t.Logf("%s: %d withdrawals in %d versions", n, withdrawn[n], versionsOf[n])
		if v := versionsOf[n]; v > 21 || v < 2 {
			t.Errorf("%s: %d versions for %d withdrawals, want at most 21 (one per window)", n, v, perService)
		}
	}
	if worst > assembler.DefaultWithdrawalWindow {
		t.Errorf("a withdrawal waited %v, want at most the window", worst)
	}
}

// Versions are strictly increasing per service and across services, and a
// failing or stale source publishes nothing and loses nothing.
func TestVersions(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	names := []string{"a", "b", "c"}
	ins := map[string][]assembler.InstanceInput{}
	for i, n := range names {
		ins[n] = zoned(i*100, elig, 6, "z1", "z2")
		a.Update(svc(n, 0.5, ins[n]), t0)
	}
	var last uint64
	lastOf := map[string]uint64{}
	check := func(pubs []assembler.Published) {
		t.Helper()
		for _, p := range pubs {
			if p.View.Version <= last {
				t.Fatalf("version %d after %d", p.View.Version, last)
			}
			last = p.View.Version
			if p.Delta != nil && (p.Delta.FromVersion != lastOf[p.View.Service] || p.Delta.Version != p.View.Version) {
				t.Fatalf("%s: delta %d->%d, previous %d", p.View.Service, p.Delta.FromVersion, p.Delta.Version, lastOf[p.View.Service])
			}
			lastOf[p.View.Service] = p.View.Version
		}
	}
	now := t0
	for step := range 60 {
		now = now.Add(200 * time.Millisecond)
		n := names[step%3]
		j := step % len(ins[n])
		if ins[n][j].State == elig {
			ins[n] = set(ins[n], inelg, step%3*100+j)
		} else {
			ins[n] = set(ins[n], elig, step%3*100+j)
		}
		a.Update(svc(n, 0.5, ins[n]), now)
		if step%4 == 1 {
			vs.failNext = 1
			before, due := a.Stats(), a.NextDue()
			pubs, err := a.Drain(now.Add(2*time.Second), vs)
			if !errors.Is(err, errSource) || pubs != nil {
				t.Fatalf("Drain with a failing source = %v, %v", len(pubs), err)
			}
			if after := a.Stats(); after != before || !a.NextDue().Equal(due) {
				t.Fatalf("a failed Drain changed the queues: %+v -> %+v", before, after)
			}
		}
		pubs := drainAt(t, a, now.Add(2*time.Second), vs)
		check(pubs)
	}
	// A source handing out a version already used is refused.
	a.Update(svc("a", 0.5, zoned(0, elig, 5, "z1")), now.Add(time.Hour))
	stale := &versions{next: last - 1}
	if _, err := a.Drain(now.Add(2*time.Hour), stale); !errors.Is(err, assembler.ErrVersionNotFresh) {
		t.Fatalf("stale source: %v", err)
	}
	check(settle(t, a, now.Add(2*time.Hour), vs))
}

func TestRemoveService(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	a.Update(svc("s", 0.5, zoned(0, inelg, 2, "a", "b")), t0)
	a.Update(svc("s", 0.5, zoned(0, elig, 2, "a", "b")), t0)
	settle(t, a, t0, vs)
	now := t0.Add(2 * time.Hour)
	a.Update(svc("s", 0.5, set(zoned(0, elig, 2, "a", "b"), inelg, 0, 1)), now) // zone a trips
	if len(a.Alarms()) != 1 {
		t.Fatalf("alarms %+v", a.Alarms())
	}
	a.RemoveService("s", now)
	if len(a.Alarms()) != 0 {
		t.Fatalf("alarms after removal %+v", a.Alarms())
	}
	pubs := drainAt(t, a, now.Add(50*time.Millisecond), vs)
	if len(pubs) != 1 {
		t.Fatalf("want the emptied view, got %d versions", len(pubs))
	}
	d := pubs[0].Delta
	if len(d.Removals) != 4 || len(d.Upserts) != 0 || !slices.Equal(d.RemovedZones, []string{"a", "b"}) || len(pubs[0].View.Endpoints) != 0 {
		t.Fatalf("final delta %+v", d)
	}
	if _, ok := a.View("s"); ok {
		t.Fatal("removed service still has a view")
	}
	if st := a.Stats(); st.Services != 0 || !a.NextDue().IsZero() {
		t.Fatalf("stats %+v", st)
	}
	// Never published: forgotten at once.
	a.Update(svc("t", 0.5, zoned(0, elig, 2, "a")), now)
	a.RemoveService("t", now)
	if got := settle(t, a, now, vs); len(got) != 0 {
		t.Fatalf("published %d versions of a service removed before its first", len(got))
	}
}

// Views and deltas carry their encoding, computed once, in snake_case.
func TestEncodedOnce(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	in := inst(1, "a", unk)
	in.HealthKnown = false
	a.Update(svc("s", 0.5, []assembler.InstanceInput{in, inst(2, "a", elig)}), t0)
	p := settle(t, a, t0, vs)[0]
	v := mustView(t, a, "s")
	if &p.ViewJSON[0] != &v.Encoded()[0] || p.View != v {
		t.Fatal("ViewJSON is not the view's own encoding")
	}
	fresh, _ := json.Marshal(v)
	if string(fresh) != string(p.ViewJSON) {
		t.Fatalf("encoding differs from the view:\n%s\n%s", fresh, p.ViewJSON)
	}
	var wire struct {
		Service   string                    `json:"service"`
		Endpoints []map[string]any          `json:"endpoints"`
		Zones     map[string]map[string]any `json:"zones"`
		Checksum  string                    `json:"checksum"`
	}
	if err := json.Unmarshal(p.ViewJSON, &wire); err != nil {
		t.Fatal(err)
	}
	e := wire.Endpoints[0]
	for _, k := range []string{"instance_id", "address", "port", "zone", "state", "weight", "health", "capabilities"} {
		if _, ok := e[k]; !ok {
			t.Errorf("endpoint JSON lacks %q: %v", k, e)
		}
	}
	if e["health"] != "unknown" || e["state"] != "unknown" {
		t.Errorf("health unknown not stated: %v", e)
	}
	if _, ok := wire.Zones["a"]["min_healthy_fraction"]; !ok {
		t.Errorf("zone JSON: %v", wire.Zones)
	}
	a.Update(svc("s", 0.5, []assembler.InstanceInput{inst(2, "a", elig)}), t0.Add(2*time.Hour))
	p = settle(t, a, t0.Add(2*time.Hour), vs)[0]
	var dw map[string]any
	if err := json.Unmarshal(p.DeltaJSON, &dw); err != nil || dw["from_version"] == nil || dw["removals"] == nil || dw["withdrawal"] != true {
		t.Fatalf("delta JSON %s: %v", p.DeltaJSON, err)
	}
	if &p.DeltaJSON[0] != &p.Delta.Encoded()[0] {
		t.Fatal("DeltaJSON is not the delta's own encoding")
	}
}

func TestChecksumOrderIndependent(t *testing.T) {
	t.Parallel()
	eps := []assembler.Endpoint{
		{InstanceID: id(3), Address: "10.0.0.3", Port: 80, Zone: "a", State: "eligible", Weight: 1, Health: "known", Capabilities: []string{"probe"}},
		{InstanceID: id(1), Address: "10.0.0.1", Port: 80, Zone: "b", State: "unknown", Weight: 0.5, Health: "unknown", Capabilities: []string{}},
		{InstanceID: id(2), Address: "10.0.0.2", Port: 81, Zone: "a", State: "ineligible", Weight: 1, Health: "known", Quarantined: true},
	}
	base := assembler.Checksum(eps)
	for _, perm := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 0, 2}, {1, 2, 0}} {
		var p []assembler.Endpoint
		for _, i := range perm {
			p = append(p, eps[i])
		}
		if got := assembler.Checksum(p); got != base {
			t.Errorf("order %v: %s, want %s", perm, got, base)
		}
	}
	if eps[0].InstanceID != id(3) {
		t.Fatal("Checksum reordered its argument")
	}
	tweaks := map[string]func(e *assembler.Endpoint){
		"weight":      func(e *assembler.Endpoint) { e.Weight = 0.9 },
		"state":       func(e *assembler.Endpoint) { e.State = "degraded" },
		"health":      func(e *assembler.Endpoint) { e.Health = "unknown" },
		"port":        func(e *assembler.Endpoint) { e.Port = 8080 },
		"quarantined": func(e *assembler.Endpoint) { e.Quarantined = true },
		"capability":  func(e *assembler.Endpoint) { e.Capabilities = []string{"probe", "self"} },
		"address":     func(e *assembler.Endpoint) { e.Address = "10.0.0.30" },
		"zone":        func(e *assembler.Endpoint) { e.Zone = "c" },
	}
	for name, tweak := range tweaks {
		c := slices.Clone(eps)
		tweak(&c[0])
		if assembler.Checksum(c) == base {
			t.Errorf("changing %s left the checksum unchanged", name)
		}
	}
	if assembler.Checksum(eps[:2]) == base || assembler.Checksum(nil) == base {
		t.Error("a smaller set has the same checksum")
	}
}

// TestEmptyServiceIsPublished: a service with no instances still gets a
// first view, on the addition window, so watchers can tell "no instances"
// from "not published yet".
func TestEmptyServiceIsPublished(t *testing.T) {
	a := assembler.New(assembler.Options{})
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	a.Update(assembler.ServiceInput{Name: "empty", MinHealthyFraction: 0.5}, now)
	vs := &versions{}
	if ps, err := a.Drain(now.Add(500*time.Millisecond), vs); err != nil || len(ps) != 0 {
		t.Fatalf("published before the addition window: %v %v", ps, err)
	}
	ps, err := a.Drain(now.Add(time.Second), vs)
	if err != nil || len(ps) != 1 {
		t.Fatalf("drain: %d published, %v", len(ps), err)
	}
	if v := ps[0].View; v.Service != "empty" || len(v.Endpoints) != 0 || v.Version == 0 || ps[0].Delta != nil {
		t.Fatalf("view %+v", v)
	}
	// Nothing more to do until something changes.
	a.Update(assembler.ServiceInput{Name: "empty", MinHealthyFraction: 0.5}, now.Add(2*time.Second))
	if !a.NextDue().IsZero() {
		t.Fatalf("an unchanged empty service is due again at %s", a.NextDue())
	}
}
