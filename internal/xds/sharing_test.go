package xds_test

import (
	"strings"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/xds"
	"github.com/musterhq/muster/internal/xds/xdstest"
)

// TestAChangeIsEncodedOnceAndReachesOnlyItsStreams (issue 31): streams
// of two principals asking for web's assignment, and one asking for api's
// only, state of the world. A change to web is encoded once (one
// resource, its new assignment), whichever principals' streams it
// reaches, and reaches the three streams that ask for web with the same
// bytes; a change to api reaches api's stream alone: the next response
// the web streams get is web's next change.
func TestAChangeIsEncodedOnceAndReachesOnlyItsStreams(t *testing.T) {
	s := apptest.New(t, apptest.Options{XDS: true})
	be := xdstest.StartBackend(t, "X")
	publishLocal(t, s, seriesFrame(t, "web", "", 10, backendAt(be, 1, "az1", "", "eligible"), backendAt(be, 2, "az2", "", "eligible")))
	publishLocal(t, s, seriesFrame(t, "api", "", 11, backendAt(be, 3, "az1", "", "eligible")))

	alice := rawConn(t, s.XDSAddr, s.Token(t, apptest.Admin))
	bob := rawConn(t, s.XDSAddr, s.Token(t, devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "bob", Role: identity.RoleAdmin}))
	web, api := []string{"web"}, []string{"api"}
	open := func(c discovery.AggregatedDiscoveryServiceClient, asked []string) *sotwStream {
		w := openSotW(t, c)
		w.send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: asked})
		if r := w.recv(asked); len(r.GetResources()) != 1 {
			t.Fatalf("first response to %v: %d resources", asked, len(r.GetResources()))
		}
		return w
	}
	webStreams := []*sotwStream{open(alice, web), open(alice, web), open(bob, web)}
	apiStream := open(alice, api)

	before := xds.Encodes()
	publishLocal(t, s, seriesFrame(t, "web", "", 12, backendAt(be, 1, "az1", "", "eligible")))
	var first []byte
	for i, w := range webStreams {
		r := w.recv(web)
		if !strings.HasPrefix(r.GetVersionInfo(), "12.") || len(r.GetResources()) != 1 {
			t.Fatalf("web stream %d after web's change: version %q, %d resources; want web's v12", i, r.GetVersionInfo(), len(r.GetResources()))
		}
		if b := r.GetResources()[0].GetValue(); first == nil {
			first = b
		} else if string(b) != string(first) {
			t.Fatalf("web stream %d got other bytes for the same assignment", i)
		}
	}
	if n := xds.Encodes() - before; n != 1 {
		t.Fatalf("web's change reaching 3 streams of 2 principals encoded %d resources, want 1 (its assignment, once)", n)
	}

	publishLocal(t, s, seriesFrame(t, "api", "", 13, backendAt(be, 3, "az1", "", "eligible"), backendAt(be, 4, "az2", "", "eligible")))
	if r := apiStream.recv(api); !strings.HasPrefix(r.GetVersionInfo(), "13.") {
		t.Fatalf("api's stream after api's change: %q", r.GetVersionInfo())
	}
	publishLocal(t, s, seriesFrame(t, "web", "", 14, backendAt(be, 1, "az1", "", "eligible"), backendAt(be, 2, "az2", "", "eligible")))
	for i, w := range webStreams {
		if r := w.recv(web); !strings.HasPrefix(r.GetVersionInfo(), "14.") {
			t.Fatalf("web stream %d: the response after api's change is %q, want web's v14: nothing for api's change", i, r.GetVersionInfo())
		}
	}
}
