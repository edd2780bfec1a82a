package assembler_test

import (
	"testing"
	"time"

	"github.com/musterhq/muster/internal/assembler"
)

// A zone drained by a shift travels on the withdrawal queue (at once, the
// queue being idle), even while additions are held back by shedding;
// traffic returning rides the addition window. Endpoints and the guard
// never change.
func TestTrafficWeightWindows(t *testing.T) {
	t.Parallel()
	a := assembler.New(assembler.Options{})
	vs := &versions{}
	in := svc("web", 0.5, zoned(0, elig, 2, "a", "b"))
	a.Update(in, t0)
	settle(t, a, t0, vs)
	before := mustView(t, a, "web")
	now := t0.Add(time.Hour)

	in.Traffic = func(z string) float64 {
		if z == "a" {
			return 0
		}
		return 1
	}
	a.Update(in, now)
	if due := a.NextDue(); !due.Equal(now) {
		t.Fatalf("a drain is due at %v, want at once (the withdrawal queue's leading edge)", due.Sub(now))
	}
	pubs := drainAt(t, a, now, vs)
	if len(pubs) != 1 || pubs[0].Delta == nil || !pubs[0].Delta.Withdrawal {
		t.Fatalf("want one withdrawal delta, got %+v", pubs)
	}
	d := pubs[0].Delta
	if len(d.Upserts) != 0 || len(d.Removals) != 0 || d.Zones["a"].TrafficWeight != 0 || len(d.Zones) != 1 {
		t.Fatalf("drain delta %+v", d)
	}
	v := mustView(t, a, "web")
	if v.Checksum != before.Checksum || v.Zones["a"].Guard != assembler.GuardOK || v.Zones["b"].TrafficWeight != 1 {
		t.Fatalf("drained view changed endpoints or guard: %+v", v.Zones)
	}

	// Returning traffic is an addition: it waits for the addition window.
	now = now.Add(time.Minute)
	in.Traffic = func(z string) float64 {
		if z == "a" {
			return 0.25
		}
		return 1
	}
	a.Update(in, now)
	if pubs := drainAt(t, a, now.Add(assembler.DefaultWithdrawalWindow), vs); len(pubs) != 0 {
		t.Fatalf("a step back went out on the withdrawal window: %+v", pubs)
	}
	pubs = drainAt(t, a, now.Add(assembler.DefaultAdditionWindow), vs)
	if len(pubs) != 1 || pubs[0].Delta.Withdrawal || pubs[0].Delta.Zones["a"].TrafficWeight != 0.25 {
		t.Fatalf("step back %+v", pubs)
	}

	// Out-of-range weights are clamped; NaN reads as 1.
	for _, tc := range []struct{ in, want float64 }{{-3, 0}, {7, 1}, {nan(), 1}} {
		in.Traffic = func(string) float64 { return tc.in }
		a.Update(in, now)
		settle(t, a, now, vs)
		if got := mustView(t, a, "web").Zones["b"].TrafficWeight; got != tc.want {
			t.Errorf("traffic %g published as %g, want %g", tc.in, got, tc.want)
		}
		now = now.Add(2 * time.Hour)
	}
}

func nan() float64 { z := 0.0; return z / z }
