// Package lagstats keeps, per service, how long muster's own steps took
// for each change it propagated, as histograms held in memory for the
// admin UI: a failed sample to the published withdrawal
// (publisher), and the published view to each subscriber it was written
// to, by path: a watch stream (Delivered) or an xDS stream
// (DeliveredXDS). Prometheus has the same figures
// (muster_withdrawal_lag_seconds, muster_xds_push_latency_seconds); this
// is what one service's page can draw without a query language. Nothing
// here is an input to a verdict. Observing costs a map read and two
// atomic adds.
package lagstats

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Stage is a step whose time is kept.
type Stage int

const (
	// Published: the first failed sample to the published withdrawal.
	Published Stage = iota
	// Delivered: the published view to a watch stream, per stream (its
	// frame written).
	Delivered
	// DeliveredXDS: the published view to an xDS stream, per stream (a
	// response carrying its assignment sent).
	DeliveredXDS
	stages
)

func (s Stage) String() string {
	switch s {
	case Published:
		return "published"
	case Delivered:
		return "delivered"
	case DeliveredXDS:
		return "delivered_xds"
	}
	return "unknown"
}

// Bounds are the histograms' bucket upper bounds (the last bucket is
// everything above the last bound).
var Bounds = []time.Duration{
	time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second,
}

// MaxServices caps the services kept; observations of further services
// are dropped (a registry of more services than this shows the first
// ones).
const MaxServices = 10000

type histogram struct {
	counts [12]atomic.Uint64 // len(Bounds)+1
	sum    atomic.Int64      // nanoseconds
}

type entry struct {
	h [stages]histogram
}

// Recorder keeps every service's histograms. The zero value is not
// usable; use New. Safe for concurrent use.
type Recorder struct {
	mu       sync.RWMutex
	services map[string]*entry
}

// New returns an empty Recorder.
func New() *Recorder { return &Recorder{services: map[string]*entry{}} }

// Observe records one duration of stage for service. A nil Recorder
// records nothing.
func (r *Recorder) Observe(service string, stage Stage, d time.Duration) {
	if r == nil || stage < 0 || stage >= stages {
		return
	}
	r.mu.RLock()
	e := r.services[service]
	r.mu.RUnlock()
	if e == nil {
		r.mu.Lock()
		if e = r.services[service]; e == nil {
			if len(r.services) >= MaxServices {
				r.mu.Unlock()
				return
			}
			e = &entry{}
			r.services[service] = e
		}
		r.mu.Unlock()
	}
	d = max(d, 0)
	i, _ := slices.BinarySearch(Bounds, d)
	h := &e.h[stage]
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

// Histogram is one stage's counts for a service: Counts[i] is how many
// took at most Bounds[i] (and more than Bounds[i-1]); the last, more
// than the last bound.
type Histogram struct {
	Stage  Stage
	Counts []uint64
	Total  uint64
	Mean   time.Duration
}

// Of returns service's histograms, one per stage (all zero for a
// service not seen).
func (r *Recorder) Of(service string) []Histogram {
	r.mu.RLock()
	e := r.services[service]
	r.mu.RUnlock()
	out := make([]Histogram, stages)
	for s := range stages {
		h := Histogram{Stage: s, Counts: make([]uint64, len(Bounds)+1)}
		if e != nil {
			for i := range h.Counts {
				h.Counts[i] = e.h[s].counts[i].Load()
				h.Total += h.Counts[i]
			}
			if h.Total > 0 {
				h.Mean = time.Duration(e.h[s].sum.Load() / int64(h.Total))
			}
		}
		out[s] = h
	}
	return out
}
