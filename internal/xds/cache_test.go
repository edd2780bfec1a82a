package xds

import (
	"log/slog"
	"testing"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/musterhq/muster/internal/identity"
)

// testSnapshot is a node snapshot holding an assignment per service
// name, at the given versions.
func testSnapshot(t testing.TB, versions map[string]string) *nodeSnapshot {
	t.Helper()
	s := &nodeSnapshot{resources: map[string]map[string]*shared{}}
	for _, ty := range typeURLs {
		s.resources[ty] = map[string]*shared{}
	}
	for name, v := range versions {
		sh, err := newShared(name, v, &endpoint.ClusterLoadAssignment{ClusterName: name + "@" + v}, 0)
		if err != nil {
			t.Fatal(err)
		}
		s.resources[resource.EndpointType][name] = sh
	}
	return s
}

// testStreams is a server's stream state without gRPC: streams of node
// "n" whose requests are taken and whose responses are read as the
// sender would send them (decoded from the bytes it would send).
type testStreams struct {
	t *testing.T
	s *Server
}

func newTestStreams(t *testing.T) *testStreams {
	s := &Server{log: slog.New(slog.DiscardHandler), services: map[string]*serviceResources{}, nodes: map[string]*node{}}
	s.cfg.Limits = DefaultLimits()
	s.acct = newAccounts(s.cfg.Limits)
	var err error
	if s.m, err = newMetrics(nil, s); err != nil {
		t.Fatal(err)
	}
	s.cache = newWatchCache(s.log)
	return &testStreams{t: t, s: s}
}

func (ts *testStreams) open(delta bool) *adsStream {
	a := &adsStream{s: ts.s, r: &rpc{principal: identity.Principal{}, key: "n", denied: map[string]bool{}}, delta: delta, wake: make(chan struct{}, 1)}
	ts.s.acct.open("n", "c")
	ts.s.cache.add("n", a)
	return a
}

// signalled reports (and clears) whether a's sender was woken.
func signalled(a *adsStream) bool {
	select {
	case <-a.wake:
		return true
	default:
		return false
	}
}

// sotw is the state-of-the-world response a's sender would send for
// type URL t now (false: none).
func (ts *testStreams) sotw(a *adsStream, t string) (*discovery.DiscoveryResponse, bool) {
	ts.t.Helper()
	i, _ := typeIndex(t)
	m, _, _ := a.next(i)
	if m == nil {
		return nil, false
	}
	var out discovery.DiscoveryResponse
	if err := proto.Unmarshal(m.data.Materialize(), &out); err != nil {
		ts.t.Fatalf("the response does not decode: %v", err)
	}
	return &out, true
}

func (ts *testStreams) delta(a *adsStream, t string) (*discovery.DeltaDiscoveryResponse, bool) {
	ts.t.Helper()
	i, _ := typeIndex(t)
	m, _, _ := a.next(i)
	if m == nil {
		return nil, false
	}
	var out discovery.DeltaDiscoveryResponse
	if err := proto.Unmarshal(m.data.Materialize(), &out); err != nil {
		ts.t.Fatalf("the delta response does not decode: %v", err)
	}
	return &out, true
}

// TestStreamsAnswerOnlyWhatConcernsThem: requests held before the
// node's first snapshot are all answered by it, one asking for a name
// the node does not hold with an empty response (and a delta wildcard
// with an empty first response); afterwards a change reaches only the
// streams that follow a changed name, an ACK changes nothing, a stale
// nonce is ignored, and a NACKed version is not resent.
func TestStreamsAnswerOnlyWhatConcernsThem(t *testing.T) {
	ts := newTestStreams(t)
	web, missing, wild := ts.open(false), ts.open(false), ts.open(true)
	web.sotwRequest(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"web"}})
	missing.sotwRequest(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"gone"}})
	wild.deltaRequest(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType})
	if _, ok := ts.sotw(web, resource.EndpointType); ok {
		t.Fatal("answered before the node has a snapshot (muster not ready)")
	}
	if _, ok := ts.delta(wild, resource.ClusterType); ok {
		t.Fatal("delta answered before the node has a snapshot (muster not ready)")
	}

	ts.s.cache.SetSnapshot("n", testSnapshot(t, map[string]string{"web": "1", "api": "1"}))
	if !signalled(web) || !signalled(missing) || !signalled(wild) {
		t.Fatal("the first snapshot did not wake every stream")
	}
	out, ok := ts.sotw(web, resource.EndpointType)
	if !ok || len(out.GetResources()) != 1 || out.GetNonce() == "" || out.GetTypeUrl() != resource.EndpointType {
		t.Fatalf("web stream's first response: %v %v", ok, out)
	}
	if out, ok := ts.sotw(missing, resource.EndpointType); !ok {
		t.Fatal("a request for a name the node does not hold was left waiting at the first snapshot")
	} else if len(out.GetResources()) != 0 {
		t.Fatalf("response for gone: %d resources, want none", len(out.GetResources()))
	}
	if d, ok := ts.delta(wild, resource.ClusterType); !ok || len(d.GetResources()) != 0 || d.GetNonce() == "" {
		t.Fatalf("a delta wildcard subscription's first request got no (empty) response: %v", d)
	}

	// The client ACKs: nothing to send.
	web.sotwRequest(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"web"}, VersionInfo: out.GetVersionInfo(), ResponseNonce: out.GetNonce()})
	if signalled(web) {
		t.Fatal("an ACK of what the stream holds woke its sender")
	}
	ts.s.cache.SetSnapshot("n", testSnapshot(t, map[string]string{"web": "1", "api": "2"}))
	if signalled(web) {
		t.Fatal("a change to api woke a stream that asks for web only")
	}
	ts.s.cache.SetSnapshot("n", testSnapshot(t, map[string]string{"web": "2", "api": "2"}))
	if !signalled(web) {
		t.Fatal("a change to web did not wake its stream")
	}
	out2, ok := ts.sotw(web, resource.EndpointType)
	if !ok || out2.GetVersionInfo() == out.GetVersionInfo() || out2.GetNonce() == out.GetNonce() {
		t.Fatalf("web's change: %v, after %v", out2, out)
	}
	if got := string(out2.GetResources()[0].GetValue()); got == string(out.GetResources()[0].GetValue()) {
		t.Fatal("web's change was sent with the old assignment")
	}

	// A request answering the first response (a stale nonce) is ignored.
	web.sotwRequest(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"web", "api"}, VersionInfo: out.GetVersionInfo(), ResponseNonce: out.GetNonce()})
	if signalled(web) {
		t.Fatal("a request with a stale nonce was taken")
	}
	// A NACK of the second is not answered with it again.
	web.sotwRequest(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"web"}, VersionInfo: out.GetVersionInfo(),
		ResponseNonce: out2.GetNonce(), ErrorDetail: &status.Status{Message: "rejected"}})
	if _, ok := ts.sotw(web, resource.EndpointType); ok {
		t.Fatal("a NACKed version was resent")
	}
	// Asking for another name too is answered at once, under the
	// nonce of the last response.
	web.sotwRequest(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"web", "api"}, VersionInfo: out.GetVersionInfo(), ResponseNonce: out2.GetNonce()})
	if out3, ok := ts.sotw(web, resource.EndpointType); !ok || len(out3.GetResources()) != 2 {
		t.Fatalf("subscribing to api too: %v %v", ok, out3)
	}
}

// TestDeltaSendsOnlyWhatChanged: a delta stream gets the resources whose
// version changed and the names removed, never what it said it holds,
// and a name it unsubscribed from and subscribes to again is sent again.
func TestDeltaSendsOnlyWhatChanged(t *testing.T) {
	ts := newTestStreams(t)
	ts.s.cache.SetSnapshot("n", testSnapshot(t, map[string]string{"web": "1", "api": "1", "db": "1"}))
	a := ts.open(true)
	a.deltaRequest(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web", "api", "db"},
		InitialResourceVersions: map[string]string{"db": "1"}})
	d, ok := ts.delta(a, resource.EndpointType)
	if !ok || len(d.GetResources()) != 2 || d.GetResources()[0].GetName() != "api" || d.GetResources()[1].GetName() != "web" {
		t.Fatalf("first response: %v (db is held at its version: not sent)", d)
	}
	a.deltaRequest(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResponseNonce: d.GetNonce()})
	if _, ok := ts.delta(a, resource.EndpointType); ok {
		t.Fatal("an ACK was answered")
	}
	ts.s.cache.SetSnapshot("n", testSnapshot(t, map[string]string{"web": "2", "api": "1"}))
	d, ok = ts.delta(a, resource.EndpointType)
	if !ok || len(d.GetResources()) != 1 || d.GetResources()[0].GetName() != "web" || d.GetResources()[0].GetVersion() != "2" ||
		len(d.GetRemovedResources()) != 1 || d.GetRemovedResources()[0] != "db" {
		t.Fatalf("after web changed and db went: %v", d)
	}
	a.deltaRequest(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesUnsubscribe: []string{"api"}})
	if d, ok := ts.delta(a, resource.EndpointType); ok {
		t.Fatalf("unsubscribing was answered: %v", d)
	}
	a.deltaRequest(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"api"}})
	if d, ok := ts.delta(a, resource.EndpointType); !ok || len(d.GetResources()) != 1 || d.GetResources()[0].GetName() != "api" {
		t.Fatalf("subscribing again to api: %v", d)
	}
}
