package xds

import (
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/musterhq/muster/internal/identity"
)

// BenchmarkOtherNodeUpdate is the feeder's update of a service two nodes
// see, as the other node's stream receives it: node a's snapshot set,
// then node b's, then b's response built. Node a's two streams
// subscribe to one name each (web), or to 1,000,000 names each (delta
// and state of the world); with flood, a goroutine also sends another of a's streams
// requests of a million names back to back, each holding that stream's
// lock while it is taken, as a client flooding the replica would (the
// limits refuse such requests; here they are raised). It prints the
// latencies (per update).
//
//	go test -run '^$' -bench BenchmarkOtherNodeUpdate ./internal/xds/
func BenchmarkOtherNodeUpdate(b *testing.B) {
	var got [3]time.Duration
	for k, c := range []struct {
		beside int
		flood  bool
	}{{1, false}, {1_000_000, false}, {1_000_000, true}} {
		beside := c.beside
		b.Run(fmt.Sprintf("beside=%d/flood=%t", beside, c.flood), func(b *testing.B) {
			s := &Server{log: slog.New(slog.DiscardHandler), services: map[string]*serviceResources{}, nodes: map[string]*node{}}
			s.cfg.Limits = Limits{NamesPerStream: 4*beside + 10, StreamsPerPrincipal: 4, StreamsPerConnection: 4, NameBytesPerPrincipal: 1 << 40}
			s.acct = newAccounts(s.cfg.Limits)
			var err error
			if s.m, err = newMetrics(nil, s); err != nil {
				b.Fatal(err)
			}
			s.cache = newWatchCache(s.log)
			open := func(key string, delta bool) *adsStream {
				a := &adsStream{s: s, r: &rpc{key: key, principal: identity.Principal{Subject: key}, denied: map[string]bool{}, end: func(error) {}},
					delta: delta, wake: make(chan struct{}, 1)}
				s.acct.open(key, key)
				s.cache.add(key, a)
				return a
			}
			snaps := [2]*nodeSnapshot{testSnapshot(b, map[string]string{"web": "1", "api": "1"}), testSnapshot(b, map[string]string{"web": "2", "api": "1"})}
			s.cache.SetSnapshot("a", snaps[1])
			s.cache.SetSnapshot("b", snaps[1])
			other := open("b", true)
			if err := other.deltaRequest(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}}); err != nil {
				b.Fatal(err)
			}
			var stop chan struct{}
			var flooding sync.WaitGroup
			many := func(prefix string) []string {
				out := make([]string, beside)
				for i := range out {
					out[i] = prefix + strconv.Itoa(i)
				}
				out[0] = "web"
				return out
			}
			{
				if err := open("a", true).deltaRequest(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: many("d")}); err != nil {
					b.Fatal(err)
				}
				sotw := open("a", false)
				reqs := [2]*discovery.DiscoveryRequest{
					{TypeUrl: resource.EndpointType, ResourceNames: many("s")},
					{TypeUrl: resource.EndpointType, ResourceNames: many("t")},
				}
				if err := sotw.sotwRequest(reqs[0]); err != nil {
					b.Fatal(err)
				}
			}
			if c.flood {
				sotw := open("a", false)
				reqs := [2]*discovery.DiscoveryRequest{
					{TypeUrl: resource.EndpointType, ResourceNames: many("s")},
					{TypeUrl: resource.EndpointType, ResourceNames: many("t")},
				}
				stop = make(chan struct{})
				flooding.Go(func() {
					for i := 1; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if err := sotw.sotwRequest(reqs[i%2]); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			ep, _ := typeIndex(resource.EndpointType)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				snap := snaps[i%2]
				s.cache.SetSnapshot("a", snap)
				s.cache.SetSnapshot("b", snap)
				if m, _, _ := other.next(ep); m == nil {
					b.Fatalf("update %d: the other node's stream has nothing to send", i)
				}
			}
			got[k] = time.Since(start) / time.Duration(b.N)
			b.StopTimer()
			if stop != nil {
				close(stop)
				flooding.Wait()
			}
		})
	}
	b.Logf("the other node's update: %s beside a node holding 2 names; %s beside one holding 2,000,000; %s while that one also sends requests of 1,000,000 names back to back",
		got[0], got[1], got[2])
}
