// Package zonehistory samples each zone's routing state across the
// estate (how many instances are eligible out of the guard's capacity,
// how many are unknown) every interval and keeps the last day in memory,
// for the admin UI's per-zone sparklines; the same record
// keeps each prober's reach (targets reported on, of those assigned). It is a record of
// what muster published, never an input to a verdict; a restarted
// process starts a new record.
package zonehistory

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/musterhq/muster/internal/worker"
)

// Counts is one zone's state at one time, summed over services.
type Counts struct {
	// Eligible and Total are the guard's: instances in rotation out of
	// the zone's capacity.
	Eligible, Total int
	// Unknown counts instances muster has no verdict for yet or hears
	// nothing about (routable, health unknown).
	Unknown int
	// State is a label of the time, if any (a prober's "outage" or
	// "suspect").
	State string
}

// Fraction is Eligible / Total (1 for an empty zone: nothing is missing).
func (c Counts) Fraction() float64 {
	if c.Total == 0 {
		return 1
	}
	return float64(c.Eligible) / float64(c.Total)
}

// Sample is a zone's counts at a time.
type Sample struct {
	At time.Time
	Counts
}

// Series is one zone's samples, oldest first.
type Series struct {
	Zone    string
	Samples []Sample
}

// Config configures a History.
type Config struct {
	// Read returns every zone's counts now (app: summed over the
	// published views).
	Read func() map[string]Counts
	// Every is the sampling interval: 30 s. Keep is how long samples are
	// kept: 24 h.
	Every, Keep time.Duration
	Now         func() time.Time
}

// History keeps each zone's samples. Its methods are safe for concurrent
// use.
type History struct {
	cfg    Config
	runner worker.Runner

	mu    sync.Mutex
	zones map[string][]Sample
}

// New returns a History; nothing is sampled until Start or SampleNow.
func New(cfg Config) (*History, error) {
	if cfg.Read == nil {
		return nil, errors.New("zonehistory: Read is required")
	}
	if cfg.Every <= 0 {
		cfg.Every = 30 * time.Second
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 24 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &History{cfg: cfg, zones: map[string][]Sample{}}, nil
}

// Start samples now and every interval until Stop.
func (h *History) Start(ctx context.Context) error {
	return h.runner.Start(ctx, func(ctx context.Context) {
		h.SampleNow()
		worker.Every(ctx, h.cfg.Every, func(context.Context) { h.SampleNow() })
	})
}

// Stop stops sampling and waits.
func (h *History) Stop() { h.runner.Stop() }

// SampleNow records every zone's counts now and drops samples older than
// Keep. A zone that no longer appears keeps its samples until they age
// out.
func (h *History) SampleNow() {
	now := h.cfg.Now()
	counts := h.cfg.Read()
	h.mu.Lock()
	defer h.mu.Unlock()
	for zone, c := range counts {
		h.zones[zone] = append(h.zones[zone], Sample{At: now, Counts: c})
	}
	cut := now.Add(-h.cfg.Keep)
	for zone, ss := range h.zones {
		i := 0
		for i < len(ss) && ss[i].At.Before(cut) {
			i++
		}
		if i == len(ss) {
			delete(h.zones, zone)
			continue
		}
		if i > 0 {
			h.zones[zone] = slices.Clone(ss[i:])
		}
	}
}

// Since returns each zone's samples at or after since, zones by name.
func (h *History) Since(since time.Time) []Series {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Series, 0, len(h.zones))
	for zone, ss := range h.zones {
		i, _ := slices.BinarySearchFunc(ss, since, func(s Sample, t time.Time) int { return s.At.Compare(t) })
		if i < len(ss) {
			out = append(out, Series{Zone: zone, Samples: slices.Clone(ss[i:])})
		}
	}
	slices.SortFunc(out, func(a, b Series) int {
		switch {
		case a.Zone < b.Zone:
			return -1
		case a.Zone > b.Zone:
			return 1
		}
		return 0
	})
	return out
}
