package resolver_test

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/resolver"
)

// churning returns a cache holding a 1,000-endpoint "api" and a
// goroutine applying a one-endpoint delta to it every millisecond, and
// the function that stops that goroutine.
func churning(b *testing.B) (*resolver.Cache, func()) {
	c := newCache(b)
	v := view("api", 1, 1000)
	if err := c.ApplyView(v); err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			eps := slices.Clone(v.Endpoints)
			k := i % len(eps)
			eps[k].Weight = float64(i%3 + 1)
			d := resolver.Delta{
				Service: "api", FromVersion: v.Version, Version: v.Version + 1,
				Upserts: eps[k : k+1], Checksum: resolver.Checksum(eps),
			}
			if err := c.ApplyDelta(d); err != nil {
				b.Error(err)
				return
			}
			v.Version, v.Endpoints = d.Version, eps
		}
	})
	return c, func() { close(stop); wg.Wait() }
}

func benchUnderChurn(b *testing.B, op func(*resolver.Cache) error) {
	c, stop := churning(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(c); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	stop()
}

func BenchmarkResolve(b *testing.B) {
	benchUnderChurn(b, func(c *resolver.Cache) error {
		_, err := c.Resolve("api")
		return err
	})
}

func BenchmarkPick(b *testing.B) {
	benchUnderChurn(b, func(c *resolver.Cache) error {
		_, err := c.Pick("api")
		return err
	})
}

func BenchmarkApplyFullView60k(b *testing.B) {
	c := newCache(b)
	v := view("api", 0, 60_000)
	b.ReportAllocs()
	for b.Loop() {
		v.Version++
		if err := c.ApplyView(v); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkApplyDelta10(b *testing.B) {
	for _, n := range []int{1000, 60_000} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			c := newCache(b)
			va := view("api", 1, n)
			if err := c.ApplyView(va); err != nil {
				b.Fatal(err)
			}
			epsB := slices.Clone(va.Endpoints)
			var ups [2][]resolver.Endpoint
			for i := range 10 {
				k := i * (n / 10)
				epsB[k].Weight = 2
				ups[0] = append(ups[0], epsB[k])
				ups[1] = append(ups[1], va.Endpoints[k])
			}
			sums := [2]string{resolver.Checksum(epsB), va.Checksum}
			version := va.Version
			b.ReportAllocs()
			for b.Loop() {
				i := version % 2 // odd versions go to B, even back to A
				d := resolver.Delta{Service: "api", FromVersion: version, Version: version + 1, Upserts: ups[1-i], Checksum: sums[1-i]}
				if err := c.ApplyDelta(d); err != nil {
					b.Fatal(err)
				}
				version++
			}
		})
	}
}

// latencies is a histogram of nanoseconds: one bucket per ns up to 100 µs.
type latencies struct {
	counts [100_000]uint32
	over   uint64
	n      uint64
}

func (h *latencies) add(d time.Duration) {
	h.n++
	if d < 0 || d >= time.Duration(len(h.counts)) {
		h.over++
		return
	}
	h.counts[d]++
}

func (h *latencies) quantile(q float64) float64 {
	want := uint64(q * float64(h.n))
	var seen uint64
	for ns, c := range h.counts {
		seen += uint64(c)
		if seen > want {
			return float64(ns)
		}
	}
	return float64(len(h.counts))
}

// benchLatency times every call of op on its own while a background
// goroutine applies a one-endpoint delta to the 1,000-endpoint service
// every millisecond, and reports p50, p99 and p99.9 in ns. Each figure
// includes one clock read (time.Now, about 20-40 ns here), so it is an
// upper bound on the call itself.
func benchLatency(b *testing.B, op func(*resolver.Cache) error) {
	c, stop := churning(b)
	h := new(latencies)
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		err := op(c)
		h.add(time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
	}
	stop()
	b.ReportMetric(h.quantile(0.50), "p50-ns")
	b.ReportMetric(h.quantile(0.99), "p99-ns")
	b.ReportMetric(h.quantile(0.999), "p99.9-ns")
	if r, _ := c.Resolve("api"); r.Version() < 2 {
		b.Fatal("no delta was applied during the run")
	}
}

func BenchmarkResolveLatency(b *testing.B) {
	benchLatency(b, func(c *resolver.Cache) error {
		_, err := c.Resolve("api")
		return err
	})
}

func BenchmarkPickLatency(b *testing.B) {
	benchLatency(b, func(c *resolver.Cache) error {
		_, err := c.Pick("api")
		return err
	})
}

// BenchmarkRecord records outcomes from parallel callers while deltas
// churn: one call in four per endpoint fails, so the ejection state
// (consecutive failures, most recent outcome) keeps changing without
// ejecting anything.
func BenchmarkRecord(b *testing.B) {
	c, stop := churning(b)
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = id(i)
	}
	var start atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := start.Add(7919)
		for pb.Next() {
			i++
			c.Record("api", ids[i%1000], (i/1000)%4 != 0)
		}
	})
	b.StopTimer()
	stop()
}
