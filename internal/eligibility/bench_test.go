package eligibility_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/eligibility"
)

const benchInstances = 60000

// benchEngine holds 60,000 instances of one all-class service, each with
// every class and all eight passive reporter slots populated.
func benchEngine(tb testing.TB) (*eligibility.Engine, []eligibility.InstanceID) {
	e := eligibility.NewEngine(eligibility.Options{})
	e.SetService("svc", contract(allCaps))
	ids := make([]eligibility.InstanceID, benchInstances)
	for i := range ids {
		ids[i] = iid(i)
		if err := e.AddInstance(ids[i], "svc", t0); err != nil {
			tb.Fatal(err)
		}
		for cl := range eligibility.Class(3) {
			if err := e.Observe(eligibility.Sample{Instance: ids[i], Class: cl, Outcome: ok, At: t0, Reporter: 1}); err != nil {
				tb.Fatal(err)
			}
		}
		for r := range 8 {
			if err := e.Observe(eligibility.Sample{Instance: ids[i], Class: passive, Successes: 5, At: t0, Reporter: eligibility.ReporterID(100 + r)}); err != nil {
				tb.Fatal(err)
			}
		}
	}
	e.Tick(t0)
	return e, ids
}

func BenchmarkObserve(b *testing.B) {
	e, ids := benchEngine(b)
	const n = 1 << 16
	samples := make([]eligibility.Sample, n)
	for i := range samples {
		s := eligibility.Sample{Instance: ids[(i*7919)%len(ids)], Class: eligibility.Class(i % 3), Outcome: ok, Reporter: eligibility.ReporterID(100 + i%10)}
		switch {
		case s.Class == passive:
			s.Successes, s.Failures = 9, uint32(i%2)
		case i%5 == 0:
			s.Outcome = fail
		}
		samples[i] = s
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := samples[i&(n-1)]
		s.At = t0.Add(time.Duration(i) * 16 * time.Microsecond)
		if err := e.Observe(s); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "samples/s")
}

// BenchmarkTick measures one Tick over 60,000 instances, a second of
// simulated time apart: "idle" when only time-driven checks are due (every
// class silent, so about a fifth of the instances reach their once-per-
// interval check each Tick), "all" when every instance received a sample
// since the last Tick and is evaluated.
func BenchmarkTick(b *testing.B) {
	b.Run("idle", func(b *testing.B) {
		e, _ := benchEngine(b)
		start := t0.Add(time.Minute) // past the silence window: steady state
		e.Tick(start)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			e.Tick(start.Add(time.Duration(i+1) * time.Second))
		}
		b.ReportMetric(float64(benchInstances)*float64(b.N)/b.Elapsed().Seconds(), "instances/s")
	})
	b.Run("all", func(b *testing.B) {
		e, ids := benchEngine(b)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			now := t0.Add(time.Duration(i+1) * time.Second)
			b.StopTimer()
			for k, id := range ids {
				_ = e.Observe(eligibility.Sample{Instance: id, Class: eligibility.Class(k % 3), Outcome: ok, At: now, Reporter: 100})
			}
			b.StartTimer()
			e.Tick(now)
		}
		b.ReportMetric(float64(benchInstances)*float64(b.N)/b.Elapsed().Seconds(), "instances/s")
	})
}

// TestMemoryPerInstanceClass measures the heap an engine holds per
// instance and evidence class, with every class and reporter slot in use.
func TestMemoryPerInstanceClass(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	e, _ := benchEngine(t)
	runtime.GC()
	runtime.ReadMemStats(&after)
	perInstanceClass := float64(after.HeapAlloc-before.HeapAlloc) / benchInstances / 3
	t.Logf("heap per instance-class: %.0f bytes (%d instances, including the id index and slice slack)", perInstanceClass, benchInstances)
	if perInstanceClass >= 1024 {
		t.Errorf("heap per instance-class %.0f bytes, budget 1024", perInstanceClass)
	}
	runtime.KeepAlive(e)
}
