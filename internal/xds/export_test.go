package xds

import (
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// Encodes is how many resources this process has encoded for xDS
// (each once per version, whichever streams and principals it reaches).
func Encodes() int64 { return encodes.Load() }

// Held is what one principal holds on a replica (Limits).
type Held struct {
	Streams   int
	NameBytes int64
}

// Accounts is what each principal with a stream open holds, by principal.
func (s *Server) Accounts() map[string]Held {
	s.acct.mu.Lock()
	defer s.acct.mu.Unlock()
	out := map[string]Held{}
	for p, u := range s.acct.principals {
		out[p] = Held{Streams: u.streams, NameBytes: u.bytes}
	}
	return out
}

// Scanned is how many resources and streams the cache's snapshot updates
// have looked at so far.
func (s *Server) Scanned() int64 { return s.cache.scanned.Load() }

// HoldStreams takes the lock of every stream principal has open, as a
// stream taking a request of a million names would, until release.
func (s *Server) HoldStreams(principal string) (release func()) {
	s.cache.mu.Lock()
	nw := s.cache.nodes[principal]
	s.cache.mu.Unlock()
	if nw == nil {
		return func() {}
	}
	nw.mu.Lock()
	var held []*adsStream
	for a := range nw.streams {
		held = append(held, a)
	}
	nw.mu.Unlock()
	for _, a := range held {
		a.mu.Lock()
	}
	return func() {
		for _, a := range held {
			a.mu.Unlock()
		}
	}
}

// NameCost is what the limits count a subscribed name as holding.
func NameCost(name string) int64 { return nameCost(name) }

// AckedAssignments is the assignment version each state-of-the-world
// stream's client last ACKed ("" before its first ACK).
func (s *Server) AckedAssignments() []string {
	i := slices.Index(pushOrder[:], resource.EndpointType)
	s.cache.mu.Lock()
	nodes := make([]*nodeWatches, 0, len(s.cache.nodes))
	for _, nw := range s.cache.nodes {
		nodes = append(nodes, nw)
	}
	s.cache.mu.Unlock()
	var streams []*adsStream
	for _, nw := range nodes {
		nw.mu.Lock()
		for a := range nw.streams {
			streams = append(streams, a)
		}
		nw.mu.Unlock()
	}
	var out []string
	for _, a := range streams {
		a.mu.Lock()
		if !a.delta {
			out = append(out, a.types[i].acked)
		}
		a.mu.Unlock()
	}
	return out
}

// ChancesByPort is each endpoint's chance of a call at priority 0, by
// port, under Envoy's weights or gRPC's round robin (weights_test.go).
func ChancesByPort(cla *endpoint.ClusterLoadAssignment, envoy bool) map[uint32]float64 {
	return chancesBy(cla, envoy, (*core.SocketAddress).GetPortValue)
}
