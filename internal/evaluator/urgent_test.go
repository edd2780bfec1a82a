package evaluator

import (
	"testing"
	"time"
)

// The first early evaluation runs at once; one asked for within the
// interval after it waits for the interval's end; after that the pacer is
// idle again.
func TestUrgentPacer(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	u := urgentPacer{interval: 20 * time.Millisecond}
	if w := u.wait(t0); w != 0 {
		t.Fatalf("first urgent evaluation waits %v, want at once", w)
	}
	u.ran(t0.Add(time.Millisecond)) // the evaluation took 1 ms
	tests := []struct {
		at   time.Duration
		want time.Duration
	}{
		{1 * time.Millisecond, 20 * time.Millisecond},
		{6 * time.Millisecond, 15 * time.Millisecond},
		{21 * time.Millisecond, 0},
		{500 * time.Millisecond, 0},
	}
	for _, tc := range tests {
		if got := u.wait(t0.Add(tc.at)); got != tc.want {
			t.Errorf("asked at +%v: wait %v, want %v", tc.at, got, tc.want)
		}
	}
}
