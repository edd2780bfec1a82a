package zonehistory

import (
	"testing"
	"time"
)

// TestHistoryKeepsADayPerZone: samples accumulate per zone, Since cuts
// at its time, samples older than Keep are dropped, and a zone that
// stopped appearing is forgotten once its samples age out.
func TestHistoryKeepsADayPerZone(t *testing.T) {
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	counts := map[string]Counts{"az1": {Eligible: 3, Total: 4, Unknown: 1}, "az2": {Eligible: 2, Total: 2}}
	h, err := New(Config{Read: func() map[string]Counts { return counts }, Every: time.Minute, Keep: 10 * time.Minute, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := h.SampleNow(t.Context()); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Minute)
	}
	delete(counts, "az2")
	for range 8 {
		if err := h.SampleNow(t.Context()); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Minute)
	}
	all := h.Since(t.Context(), time.Time{})
	if len(all) != 2 || all[0].Zone != "az1" || all[1].Zone != "az2" {
		t.Fatalf("zones %+v", all)
	}
	if n := len(all[0].Samples); n != 11 { // 13 taken, 10 min kept
		t.Fatalf("az1 holds %d samples, want 11 (the last 10 minutes)", n)
	}
	if n := len(all[1].Samples); n != 3 {
		t.Fatalf("az2 holds %d samples, want the 3 within 10 minutes", n)
	}
	if f := all[0].Samples[0].Fraction(); f != 0.75 {
		t.Fatalf("fraction %v", f)
	}
	recent := h.Since(t.Context(), now.Add(-3*time.Minute))
	if len(recent) != 1 || len(recent[0].Samples) != 3 {
		t.Fatalf("the last 3 minutes: %+v", recent)
	}
	for range 5 {
		if err := h.SampleNow(t.Context()); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Minute)
	}
	if got := h.Since(t.Context(), time.Time{}); len(got) != 1 {
		t.Fatalf("az2 was not forgotten once its samples aged out: %+v", got)
	}
}
