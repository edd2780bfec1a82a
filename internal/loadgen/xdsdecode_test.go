package loadgen

import (
	"fmt"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func testLbEndpoint(addr string, port uint32, h core.HealthStatus) *endpoint.LbEndpoint {
	return &endpoint.LbEndpoint{
		HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
			Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
				Address: addr, PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
			}}},
			Hostname: "h-" + addr,
		}},
		HealthStatus:        h,
		LoadBalancingWeight: wrapperspb.UInt32(100),
	}
}

// musterLbEndpoint is an endpoint as muster's assignments list it.
func musterLbEndpoint(addr string, port uint32, h core.HealthStatus) *endpoint.LbEndpoint {
	return &endpoint.LbEndpoint{
		HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
			Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
				Protocol: core.SocketAddress_TCP, Address: addr, PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
			}}},
		}},
		HealthStatus:        h,
		LoadBalancingWeight: wrapperspb.UInt32(100),
	}
}

// TestDecodeAssignmentWire: the wire decoder reads the same endpoints,
// ports and health as protobuf-go's Unmarshal, across localities and
// priorities, with fields it skips; and refuses a truncated encoding.
func TestDecodeAssignmentWire(t *testing.T) {
	cla := &endpoint.ClusterLoadAssignment{
		ClusterName: "web",
		Endpoints: []*endpoint.LocalityLbEndpoints{
			{Locality: &core.Locality{Zone: "az1"}, LbEndpoints: []*endpoint.LbEndpoint{
				testLbEndpoint("10.0.0.1", 8080, core.HealthStatus_HEALTHY),
				testLbEndpoint("10.0.0.2", 8081, core.HealthStatus_DEGRADED),
			}, LoadBalancingWeight: wrapperspb.UInt32(7)},
			{Locality: &core.Locality{Zone: "az2", Region: "b"}, Priority: 1, LbEndpoints: []*endpoint.LbEndpoint{
				testLbEndpoint("2001:db8::1", 443, core.HealthStatus_UNKNOWN),
				testLbEndpoint("10.0.0.3", 9, core.HealthStatus_UNHEALTHY),
			}},
			{Locality: &core.Locality{Zone: "az3"}, LbEndpoints: []*endpoint.LbEndpoint{
				musterLbEndpoint("10.0.0.4", 8080, core.HealthStatus_HEALTHY),
				musterLbEndpoint("10.0.0.5", 8080, core.HealthStatus_DRAINING),
				musterLbEndpoint("2001:db8::2", 65535, core.HealthStatus_UNKNOWN),
			}},
		},
	}
	a, err := anypb.New(cla)
	if err != nil {
		t.Fatal(err)
	}
	full := &lgXDSStream{fullDecode: true}
	wire := &lgXDSStream{}
	at := time.Unix(1, 0)
	full.note(a.GetValue(), at)
	wire.note(a.GetValue(), at)
	if len(full.current()) != 7 {
		t.Fatalf("protobuf-go decoded %d endpoints, want 7", len(full.current()))
	}
	if diff := cmp.Diff(full.current(), wire.current(), cmp.AllowUnexported(lgEndpoint{})); diff != "" {
		t.Fatalf("the wire decoder differs from Unmarshal (-proto +wire):\n%s", diff)
	}

	// One endpoint withdrawn: both see it leave.
	cla.Endpoints[0].LbEndpoints = cla.Endpoints[0].LbEndpoints[1:]
	b, err := anypb.New(cla)
	if err != nil {
		t.Fatal(err)
	}
	full.note(b.GetValue(), at.Add(time.Second))
	wire.note(b.GetValue(), at.Add(time.Second))
	gone := lgEndpoint{"10.0.0.1", 8080}
	if full.withdrawn(gone).IsZero() || !wire.withdrawn(gone).Equal(full.withdrawn(gone)) {
		t.Fatalf("withdrawn: proto %v, wire %v", full.withdrawn(gone), wire.withdrawn(gone))
	}

	raw, _ := proto.Marshal(cla)
	if err := decodeAssignmentWire(raw[:len(raw)-3], &lgListing{}); err == nil {
		t.Fatal("a truncated assignment decoded without an error")
	}
}

// BenchmarkDecodeAssignment compares the two decoders on a 60-endpoint
// assignment like muster's.
func BenchmarkDecodeAssignment(b *testing.B) {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: "web"}
	for z := range 3 {
		loc := &endpoint.LocalityLbEndpoints{Locality: &core.Locality{Zone: "az" + string(rune('1'+z))}}
		for i := range 20 {
			loc.LbEndpoints = append(loc.LbEndpoints, musterLbEndpoint(fmt.Sprintf("10.251.0.%d", z*20+i+1), 8080, core.HealthStatus_HEALTHY))
		}
		cla.Endpoints = append(cla.Endpoints, loc)
	}
	a, err := anypb.New(cla)
	if err != nil {
		b.Fatal(err)
	}
	// Many streams, each note on another's state (as 10,000 streams
	// taking one withdrawal each): what a stream keeps is not in cache.
	b.Run("wire-10000-streams", func(b *testing.B) {
		streams := make([]*lgXDSStream, 10000)
		for i := range streams {
			streams[i] = &lgXDSStream{}
			streams[i].note(a.GetValue(), time.Time{})
		}
		i := 0
		for b.Loop() {
			streams[i%len(streams)].note(a.GetValue(), time.Time{})
			i++
		}
	})
	for _, full := range []bool{false, true} {
		name := map[bool]string{false: "wire", true: "proto"}[full]
		b.Run(name, func(b *testing.B) {
			s := &lgXDSStream{fullDecode: full}
			for b.Loop() {
				s.note(a.GetValue(), time.Time{})
			}
		})
	}
}
