package xds

import (
	"log/slog"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
)

// testSnapshot is a node snapshot holding an assignment per service
// name, at the given versions.
func testSnapshot(t *testing.T, versions map[string]string) *nodeSnapshot {
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

func sotwReq(names ...string) *cachev3.Request {
	return &cachev3.Request{Node: &core.Node{Id: "n"}, TypeUrl: resource.EndpointType, ResourceNames: names}
}

func pending[T any](ch chan T) (T, bool) {
	select {
	case r := <-ch:
		return r, true
	default:
		var zero T
		return zero, false
	}
}

// TestWatchCacheAnswersOnlyWhatConcernsAWatch: watches held before the
// node's first snapshot are all answered by it, one asking for a name
// the node does not hold with an empty response (and a delta wildcard
// with an empty first response); afterwards a change answers only the
// watches that follow a changed name, and a watch at the current version
// is held.
func TestWatchCacheAnswersOnlyWhatConcernsAWatch(t *testing.T) {
	c := newWatchCache(slog.New(slog.DiscardHandler))
	web, missing := make(chan cachev3.Response, 1), make(chan cachev3.Response, 1)
	sub := stream.NewSotwSubscription([]string{"web"}, false)
	if _, err := c.CreateWatch(sotwReq("web"), &sub, web); err != nil {
		t.Fatal(err)
	}
	subMissing := stream.NewSotwSubscription([]string{"gone"}, false)
	if _, err := c.CreateWatch(sotwReq("gone"), &subMissing, missing); err != nil {
		t.Fatal(err)
	}
	wild := make(chan cachev3.DeltaResponse, 1)
	dsub := stream.NewDeltaSubscription(nil, nil, nil, true)
	if _, err := c.CreateDeltaWatch(&cachev3.DeltaRequest{Node: &core.Node{Id: "n"}, TypeUrl: resource.ClusterType}, &dsub, wild); err != nil {
		t.Fatal(err)
	}
	if _, ok := pending(web); ok {
		t.Fatal("answered before the node has a snapshot (muster not ready)")
	}

	c.SetSnapshot("n", testSnapshot(t, map[string]string{"web": "1", "api": "1"}))
	r, ok := pending(web)
	if !ok {
		t.Fatal("the first snapshot did not answer the web watch")
	}
	out, _ := r.GetDiscoveryResponse()
	if len(out.GetResources()) != 1 {
		t.Fatalf("web watch: %d resources", len(out.GetResources()))
	}
	if r, ok := pending(missing); !ok {
		t.Fatal("a watch for a name the node does not hold was left waiting at the first snapshot")
	} else if out, _ := r.GetDiscoveryResponse(); len(out.GetResources()) != 0 {
		t.Fatalf("watch for gone: %d resources, want none", len(out.GetResources()))
	}
	if _, ok := pending(wild); !ok {
		t.Fatal("a delta wildcard subscription's first request got no (empty) response")
	}

	// The client ACKs: its next watch is at the version it holds.
	sub.SetReturnedResources(r.GetReturnedResources())
	ack := sotwReq("web")
	ack.VersionInfo = out.GetVersionInfo()
	if _, err := c.CreateWatch(ack, &sub, web); err != nil {
		t.Fatal(err)
	}
	if _, ok := pending(web); ok {
		t.Fatal("a watch at the current version was answered")
	}
	c.SetSnapshot("n", testSnapshot(t, map[string]string{"web": "1", "api": "2"}))
	if _, ok := pending(web); ok {
		t.Fatal("a change to api answered a watch that asks for web only")
	}
	c.SetSnapshot("n", testSnapshot(t, map[string]string{"web": "2", "api": "2"}))
	if r, ok := pending(web); !ok {
		t.Fatal("a change to web did not answer its watch")
	} else if out2, _ := r.GetDiscoveryResponse(); out2.GetVersionInfo() == out.GetVersionInfo() {
		t.Fatalf("web's change was sent under the old version %q", out.GetVersionInfo())
	}
}
