package loadgen

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
)

// lgTestADS serves two assignments of service "web" on each stream, the
// second without one endpoint, and passes on the requests it receives.
type lgTestADS struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	assignment [2]*anypb.Any
	sotw       chan *discovery.DiscoveryRequest
	delta      chan *discovery.DeltaDiscoveryRequest
}

func (a *lgTestADS) StreamAggregatedResources(st discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for k := 0; ; k++ {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		a.sotw <- req
		if k < 2 {
			v := string(rune('1' + k))
			if err := st.Send(&discovery.DiscoveryResponse{VersionInfo: "v" + v, Resources: []*anypb.Any{a.assignment[k]}, TypeUrl: resource.EndpointType, Nonce: "n" + v}); err != nil {
				return err
			}
		}
	}
}

func (a *lgTestADS) DeltaAggregatedResources(st discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	for k := 0; ; k++ {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		a.delta <- req
		if k < 2 {
			v := string(rune('1' + k))
			if err := st.Send(&discovery.DeltaDiscoveryResponse{Resources: []*discovery.Resource{{Name: "web", Version: "v" + v, Resource: a.assignment[k]}},
				TypeUrl: resource.EndpointType, Nonce: "d" + v}); err != nil {
				return err
			}
		}
	}
}

// TestXDSStream runs the load generator's streams (SotW and delta, wire
// and proto decoding) against an ADS server of the test's: each stream
// takes both assignments (the withdrawal seen, the watch told) and ACKs
// each response with its version and nonce, as protobuf-go reads them.
func TestXDSStream(t *testing.T) {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: "web", Endpoints: []*endpoint.LocalityLbEndpoints{{LbEndpoints: []*endpoint.LbEndpoint{
		musterLbEndpoint("10.0.0.1", 8080, core.HealthStatus_HEALTHY), musterLbEndpoint("10.0.0.2", 8080, core.HealthStatus_HEALTHY),
	}}}}
	ads := &lgTestADS{sotw: make(chan *discovery.DiscoveryRequest, 100), delta: make(chan *discovery.DeltaDiscoveryRequest, 100)}
	var err error
	if ads.assignment[0], err = anypb.New(cla); err != nil {
		t.Fatal(err)
	}
	cla.Endpoints[0].LbEndpoints = cla.Endpoints[0].LbEndpoints[1:]
	if ads.assignment[1], err = anypb.New(cla); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(srv, ads)
	go srv.Serve(lis)
	defer srv.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), lgXDSDialOptions("token")...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	gone := lgEndpoint{"10.0.0.1", 8080}
	watch := &lgWithdrawalWatch{}
	done := watch.expect(gone, 4)
	var streams []*lgXDSStream
	for _, delta := range []bool{false, true} {
		for _, full := range []bool{false, true} {
			s, _, err := openXDSStreams(ctx, &wg, []*grpc.ClientConn{cc}, 1, delta, "web", 10*time.Second, func(s *lgXDSStream) {
				s.watch, s.fullDecode = watch, full
			})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, s...)
		}
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("not every stream saw the withdrawal")
	}
	for i, s := range streams {
		if s.withdrawn(gone).IsZero() || !s.healthy(lgEndpoint{"10.0.0.2", 8080}) || len(s.current()) != 1 {
			t.Errorf("stream %d: withdrawn %v, current %v", i, s.withdrawn(gone), s.current())
		}
	}
	// Each stream's requests: its subscription and two ACKs.
	timeout := time.After(10 * time.Second)
	for range 6 {
		var r *discovery.DiscoveryRequest
		select {
		case r = <-ads.sotw:
		case <-timeout:
			t.Fatal("the SotW streams sent fewer than 6 requests")
		}
		want := &discovery.DiscoveryRequest{ResourceNames: []string{"web"}, TypeUrl: resource.EndpointType}
		if r.ResponseNonce != "" {
			want.ResponseNonce, want.VersionInfo = r.ResponseNonce, "v"+r.ResponseNonce[1:]
		}
		if diff := cmp.Diff(want, r, protocmp.Transform()); diff != "" {
			t.Errorf("SotW request (-want +got):\n%s", diff)
		}
	}
	for range 6 {
		var r *discovery.DeltaDiscoveryRequest
		select {
		case r = <-ads.delta:
		case <-timeout:
			t.Fatal("the delta streams sent fewer than 6 requests")
		}
		want := &discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResponseNonce: r.ResponseNonce}
		if r.ResponseNonce == "" {
			want.ResourceNamesSubscribe = []string{"web"}
		}
		if diff := cmp.Diff(want, r, protocmp.Transform()); diff != "" {
			t.Errorf("delta request (-want +got):\n%s", diff)
		}
	}
}
