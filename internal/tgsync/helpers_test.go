package tgsync

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/resolver"
)

// cacheSource is a Source over a real resolver.Cache (its client guards
// and all), fed views by the test instead of a watch stream.
type cacheSource struct {
	*resolver.Cache
	mu sync.Mutex
	ch chan struct{}
}

func newCacheSource(t *testing.T, clock func() time.Time, confirm time.Duration, services ...string) *cacheSource {
	t.Helper()
	c, err := resolver.NewCache(services, resolver.WithClock(clock), resolver.WithConfirmAfter(confirm))
	if err != nil {
		t.Fatal(err)
	}
	return &cacheSource{Cache: c, ch: make(chan struct{})}
}

func (s *cacheSource) Updated() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ch
}

// apply applies a view (a guard's refusal is not a test failure: it is
// the point of some tests) and wakes the Updated waiters.
func (s *cacheSource) apply(v resolver.View) error {
	err := s.ApplyView(v)
	s.mu.Lock()
	close(s.ch)
	s.ch = make(chan struct{})
	s.mu.Unlock()
	return err
}

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// ep is endpoint i of a view.
type ep struct {
	addr   string
	port   int
	zone   string
	state  string
	weight float64
}

func instanceID(i int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", i) }

// viewOf builds a checked view of eps: zones with their guard and counts
// (registered = instances listed in the zone unless reg overrides it).
func viewOf(service string, version uint64, eps []ep, zones map[string]resolver.Zone) resolver.View {
	out := make([]resolver.Endpoint, len(eps))
	counts := map[string]int{}
	eligible := map[string]int{}
	for i, e := range eps {
		st := e.state
		if st == "" {
			st = "eligible"
		}
		w := e.weight
		if w == 0 && st != "ineligible" {
			w = 1
		}
		out[i] = resolver.Endpoint{InstanceID: instanceID(i), Address: e.addr, Port: e.port, Zone: e.zone,
			State: st, Weight: w, Health: resolver.HealthKnown, Capabilities: []string{}}
		counts[e.zone]++
		if st != "ineligible" {
			eligible[e.zone]++
		}
	}
	zs := map[string]resolver.Zone{}
	for z, n := range counts {
		reg := n
		zs[z] = resolver.Zone{Guard: resolver.GuardOK, Eligible: eligible[z], Total: n, MinHealthyFraction: 0.5, Registered: &reg}
	}
	for z, o := range zones {
		zs[z] = o
	}
	return resolver.View{Service: service, Version: version, Endpoints: out, Zones: zs, GeneratedAt: t0, Checksum: resolver.Checksum(out)}
}

func ptr[T any](v T) *T { return &v }

// mustSync runs one cycle and fails on any binding's error.
func mustSync(t *testing.T, s *Syncer) []Report {
	t.Helper()
	reps := s.RunOnce(context.Background())
	for _, r := range reps {
		if r.Err != nil {
			t.Fatalf("binding %s: %v", r.Binding, r.Err)
		}
	}
	return reps
}
