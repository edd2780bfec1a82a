package lagstats

import (
	"testing"
	"time"
)

// TestRecorderBuckets: an observation lands in the first bucket whose
// bound is at least it (a bound is inclusive), above the last bound in
// the overflow bucket; totals and means follow; services are apart.
func TestRecorderBuckets(t *testing.T) {
	r := New()
	for _, d := range []time.Duration{0, time.Millisecond, 2 * time.Millisecond, 300 * time.Millisecond, time.Minute} {
		r.Observe("web", Delivered, d)
	}
	r.Observe("web", Published, 40*time.Millisecond)
	r.Observe("api", Published, time.Second)
	h := r.Of("web")
	d := h[Delivered]
	want := map[int]uint64{0: 2, 1: 1, 7: 1, len(Bounds): 1}
	for i, c := range d.Counts {
		if c != want[i] {
			t.Errorf("bucket %d holds %d, want %d (%v)", i, c, want[i], d.Counts)
		}
	}
	if d.Total != 5 || d.Mean != (time.Millisecond+2*time.Millisecond+300*time.Millisecond+time.Minute)/5 {
		t.Errorf("total %d mean %s", d.Total, d.Mean)
	}
	if p := h[Published]; p.Total != 1 || p.Counts[4] != 1 {
		t.Errorf("web published %+v", p)
	}
	if p := r.Of("api")[Published]; p.Total != 1 || p.Counts[8] != 1 {
		t.Errorf("api published %+v", p)
	}
	if n := r.Of("none")[Delivered].Total; n != 0 {
		t.Errorf("a service never seen has %d", n)
	}
	var nilRec *Recorder
	nilRec.Observe("web", Delivered, time.Second) // no panic
}
