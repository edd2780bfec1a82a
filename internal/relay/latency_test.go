package relay_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
)

// BenchmarkRelayLatency measures the relay over loopback: from Publish on
// replica A's hub to a subscriber of replica B's hub receiving the frame,
// through A's real endpoint and B's Relay worker, at 1,000 updates a
// second spread over 100 services (views of ~1 KiB, each with its delta).
// It reports the p50, p99 and max; b.N is the number of updates:
//
//	go test ./internal/relay/ -run '^$' -bench RelayLatency -benchtime 10000x
func BenchmarkRelayLatency(b *testing.B) {
	const services, rate = 100, 1000
	a := apptest.New(b, apptest.Options{Replica: "a"})
	eps := endpoints(6) // ~1 KiB
	names := make([]string, services)
	for i := range names {
		names[i] = fmt.Sprintf("svc-%03d", i)
	}
	version := uint64(0)
	frameAt := func(kind stream.Kind, service string, from, v uint64) *stream.Frame {
		return signedFrame(kind, service, from, v, eps, "")
	}
	last := map[string]uint64{}
	for _, n := range names {
		version++
		a.Hub.Publish([]stream.Update{{View: frameAt(stream.KindView, n, 0, version)}})
		last[n] = version
	}
	ps := &peers{}
	ps.set(relay.Peer{ID: "a", Address: a.URL})
	hub := stream.NewHub(stream.Config{QueueLen: 1 << 16})
	r, err := relay.New(relay.Config{Hub: hub, Signer: signer(), Peers: ps.get})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	defer r.Stop()
	wait.For(b, 10*time.Second, "the snapshot relayed", func() bool { return hub.Views() == services })
	sub, err := hub.Follow(names, version)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()

	sent := make([]time.Time, b.N)
	got := make([]time.Duration, b.N)
	base := version
	var mu sync.Mutex
	received := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for received < b.N {
			select {
			case f := <-sub.C():
				now := time.Now()
				if f.Kind != stream.KindDelta || f.Version <= base {
					continue
				}
				i := int(f.Version - base - 1)
				mu.Lock()
				got[i] = now.Sub(sent[i])
				received++
				mu.Unlock()
			case <-sub.Resync():
				b.Error("the subscriber overflowed: latency samples lost")
				return
			case <-time.After(10 * time.Second):
				b.Errorf("no frame for 10 s after %d of %d", received, b.N)
				return
			}
		}
	}()
	b.ResetTimer()
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for i := range b.N {
		<-tick.C
		n := names[i%services]
		version++
		u := stream.Update{View: frameAt(stream.KindView, n, 0, version), Delta: frameAt(stream.KindDelta, n, last[n], version)}
		last[n] = version
		mu.Lock()
		sent[i] = time.Now()
		mu.Unlock()
		a.Hub.Publish([]stream.Update{u})
	}
	<-done
	b.StopTimer()
	if received < b.N {
		return
	}
	slices.Sort(got)
	q := func(p float64) time.Duration { return got[min(len(got)-1, int(p*float64(len(got))))] }
	b.ReportMetric(float64(q(0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(q(0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(got[len(got)-1].Microseconds()), "max-µs")
	b.Logf("%d updates at %d/s over loopback: p50 %s, p99 %s, max %s", b.N, rate, q(0.50), q(0.99), got[len(got)-1])
}
