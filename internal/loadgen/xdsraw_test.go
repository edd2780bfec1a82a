package loadgen

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestXDSRawMessages: the hand decoder reads what protobuf-go's
// Unmarshal reads of a DiscoveryResponse and a DeltaDiscoveryResponse
// (with fields it skips), and protobuf-go's Unmarshal reads the hand
// encoder's ACKs as the DiscoveryRequest and DeltaDiscoveryRequest the
// --decode proto path sends.
func TestXDSRawMessages(t *testing.T) {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: "web", Endpoints: []*endpoint.LocalityLbEndpoints{{
		LbEndpoints: []*endpoint.LbEndpoint{testLbEndpoint("10.0.0.1", 8080, core.HealthStatus_HEALTHY)},
	}}}
	a, err := anypb.New(cla)
	if err != nil {
		t.Fatal(err)
	}
	empty := &anypb.Any{TypeUrl: resource.EndpointType}

	sotw := &discovery.DiscoveryResponse{
		VersionInfo: "v7", Resources: []*anypb.Any{a, empty, a}, Canary: true, TypeUrl: resource.EndpointType, Nonce: "n-42",
		ControlPlane: &core.ControlPlane{Identifier: "muster"},
	}
	b, err := proto.Marshal(sotw)
	if err != nil {
		t.Fatal(err)
	}
	var r lgResponse
	if err := decodeResponse(b, &r); err != nil {
		t.Fatal(err)
	}
	if string(r.version) != sotw.VersionInfo || string(r.typeURL) != sotw.TypeUrl || string(r.nonce) != sotw.Nonce || len(r.resources) != 3 {
		t.Fatalf("decoded version %q type %q nonce %q, %d resources; want %q %q %q, 3", r.version, r.typeURL, r.nonce, len(r.resources), sotw.VersionInfo, sotw.TypeUrl, sotw.Nonce)
	}
	for i, res := range sotw.Resources {
		if !bytes.Equal(r.resources[i], res.GetValue()) {
			t.Errorf("resource %d: the value differs from Unmarshal's", i)
		}
	}
	got := &discovery.DiscoveryRequest{}
	if err := proto.Unmarshal(appendACK(nil, r.typeURL, "web", r.version, r.nonce), got); err != nil {
		t.Fatal(err)
	}
	want := &discovery.DiscoveryRequest{TypeUrl: sotw.TypeUrl, ResourceNames: []string{"web"}, VersionInfo: sotw.VersionInfo, ResponseNonce: sotw.Nonce}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("ACK (-want +got):\n%s", diff)
	}
	// A first response's empty version and nonce are left out, the
	// resource name (repeated) kept even when empty.
	got.Reset()
	if err := proto.Unmarshal(appendACK(nil, nil, "", nil, nil), got); err != nil || len(got.ResourceNames) != 1 {
		t.Errorf("empty ACK: %v, %v", got, err)
	}

	delta := &discovery.DeltaDiscoveryResponse{
		SystemVersionInfo: "s1", TypeUrl: resource.EndpointType, Nonce: "d-9", RemovedResources: []string{"old", "older"},
		Resources: []*discovery.Resource{
			{Name: "web", Version: "3", Resource: a, Aliases: []string{"w"}},
			{Name: "gone", Version: "4"},
		},
		ControlPlane: &core.ControlPlane{Identifier: "muster"},
	}
	if b, err = proto.Marshal(delta); err != nil {
		t.Fatal(err)
	}
	if err := decodeDeltaResponse(b, &r); err != nil {
		t.Fatal(err)
	}
	if string(r.typeURL) != delta.TypeUrl || string(r.nonce) != delta.Nonce || len(r.resources) != 2 || len(r.removed) != 2 ||
		string(r.removed[0]) != "old" || string(r.removed[1]) != "older" {
		t.Fatalf("decoded type %q nonce %q, %d resources, removed %q", r.typeURL, r.nonce, len(r.resources), r.removed)
	}
	for i, res := range delta.Resources {
		if !bytes.Equal(r.resources[i], res.GetResource().GetValue()) || string(r.names[i]) != res.Name || string(r.versions[i]) != res.Version {
			t.Errorf("resource %d: %q %q differ from Unmarshal's", i, r.names[i], r.versions[i])
		}
	}
	gotDelta := &discovery.DeltaDiscoveryRequest{}
	if err := proto.Unmarshal(appendDeltaACK(nil, r.typeURL, r.nonce), gotDelta); err != nil {
		t.Fatal(err)
	}
	wantDelta := &discovery.DeltaDiscoveryRequest{TypeUrl: delta.TypeUrl, ResponseNonce: delta.Nonce}
	if diff := cmp.Diff(wantDelta, gotDelta, protocmp.Transform()); diff != "" {
		t.Errorf("delta ACK (-want +got):\n%s", diff)
	}

	if err := decodeResponse(b[:len(b)-2], &r); err == nil {
		t.Error("a truncated response decoded without an error")
	}
}

// FuzzXDSResponse: the hand decoders never panic, and whatever
// protobuf-go's Unmarshal accepts they read alike.
func FuzzXDSResponse(f *testing.F) {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: "web", Endpoints: []*endpoint.LocalityLbEndpoints{{
		LbEndpoints: []*endpoint.LbEndpoint{testLbEndpoint("10.0.0.1", 8080, core.HealthStatus_HEALTHY), testLbEndpoint("::1", 1, core.HealthStatus_DRAINING)},
	}}}
	a, err := anypb.New(cla)
	if err != nil {
		f.Fatal(err)
	}
	for _, m := range []proto.Message{
		&discovery.DiscoveryResponse{VersionInfo: "1", Resources: []*anypb.Any{a}, TypeUrl: resource.EndpointType, Nonce: "n"},
		&discovery.DeltaDiscoveryResponse{Resources: []*discovery.Resource{{Name: "web", Resource: a}}, TypeUrl: resource.EndpointType, Nonce: "n", RemovedResources: []string{"x"}},
		cla,
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r lgResponse
		if decodeResponse(b, &r) == nil {
			var want discovery.DiscoveryResponse
			if proto.Unmarshal(b, &want) == nil {
				if string(r.version) != want.VersionInfo || string(r.typeURL) != want.TypeUrl || string(r.nonce) != want.Nonce || len(r.resources) != len(want.Resources) {
					t.Fatalf("read %q %q %q %d resources, Unmarshal %v", r.version, r.typeURL, r.nonce, len(r.resources), &want)
				}
			}
		}
		if decodeDeltaResponse(b, &r) == nil {
			var want discovery.DeltaDiscoveryResponse
			if proto.Unmarshal(b, &want) == nil {
				if string(r.typeURL) != want.TypeUrl || string(r.nonce) != want.Nonce || len(r.resources) != len(want.Resources) || len(r.removed) != len(want.RemovedResources) {
					t.Fatalf("read %q %q %d resources, Unmarshal %v", r.typeURL, r.nonce, len(r.resources), &want)
				}
			}
		}
		// The bytes as an assignment, twice (the second against the
		// first's listing).
		s := &lgXDSStream{}
		s.note(b, time.Time{})
		s.note(b, time.Time{})
		_ = s.current()
	})
}

// BenchmarkXDSResponse is a stream's work per response apart from gRPC's:
// raw (as the streams do: the response walked, the assignment decoded
// from its encoding, the ACK written by hand) against protobuf-go's
// Unmarshal of the response and Marshal of the ACK (what gRPC's proto
// codec did before), both decoding the assignment from its encoding.
func BenchmarkXDSResponse(b *testing.B) {
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
	msg, err := proto.Marshal(&discovery.DiscoveryResponse{VersionInfo: "v12345", Resources: []*anypb.Any{a}, TypeUrl: resource.EndpointType, Nonce: "1234"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("raw", func(b *testing.B) {
		s := &lgXDSStream{service: "web"}
		for b.Loop() {
			if err := decodeResponse(msg, &s.resp); err != nil {
				b.Fatal(err)
			}
			for _, res := range s.resp.resources {
				s.note(res, time.Time{})
			}
			s.out.b = s.ack(&s.resp)
		}
	})
	b.Run("proto", func(b *testing.B) {
		s := &lgXDSStream{service: "web"}
		for b.Loop() {
			var r discovery.DiscoveryResponse
			if err := proto.Unmarshal(msg, &r); err != nil {
				b.Fatal(err)
			}
			for _, res := range r.GetResources() {
				s.note(res.GetValue(), time.Time{})
			}
			if _, err := proto.Marshal(&discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResourceNames: []string{s.service}, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
