package xds_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds"
	"github.com/musterhq/muster/resolver"
)

// xdsTypes are the four types muster serves, in the order a client asks
// for them.
var xdsTypes = []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}

// replicaView is one view as its owner published it: every replica's hub
// gets its own frame of these bytes, as the relay decodes one per peer.
type replicaView struct {
	service string
	version uint64
	json    []byte
}

func (v replicaView) update() stream.Update {
	return stream.Update{View: &stream.Frame{Kind: stream.KindView, Service: v.service, Version: v.version, JSON: v.json}}
}

// makeView encodes a view of service at version with n endpoints (from
// the first'th) across two zones, each of weight w, and az1's eligible
// count reported as eligible (a field the assignment does not carry).
func makeView(t *testing.T, service string, version uint64, first, n int, w float64, eligible int) replicaView {
	t.Helper()
	var eps []resolver.Endpoint
	for i := first; i < first+n; i++ {
		eps = append(eps, resolver.Endpoint{
			InstanceID: fmt.Sprintf("00000000-0000-4000-8000-%012d", i),
			Address:    fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), Port: 8080,
			Zone: []string{"az1", "az2"}[i%2], State: "eligible", Weight: w, Health: resolver.HealthKnown,
		})
	}
	v := resolver.View{
		Service: service, Version: version, Endpoints: eps,
		Zones: map[string]resolver.Zone{
			"az1": {Guard: resolver.GuardOK, Eligible: eligible, Total: n},
			"az2": {Guard: resolver.GuardOK, Eligible: n / 2, Total: n},
		},
		GeneratedAt: time.Date(2026, 1, 1, 0, 0, 0, int(version), time.UTC),
		Checksum:    resolver.Checksum(eps),
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return replicaView{service, version, b}
}

// holds waits until s's xDS server holds every view its hub does.
func holds(t *testing.T, s *apptest.Stack) {
	t.Helper()
	wait.For(t, 30*time.Second, "the xDS server holding its hub's views", func() bool {
		for _, name := range s.Hub.Services() {
			f, _ := s.Hub.View(name)
			if v, ok := s.XDS.Version(name); !ok || v < f.Version {
				return false
			}
		}
		return true
	})
}

// heldResource is what a client holds of one resource: the version the
// server named it by (delta) and its bytes.
type heldResource struct {
	Version string
	Bytes   []byte
}

// deltaState asks a delta stream for the named resources of every type,
// with the versions the client already holds (nil: none), and returns
// the first response of each type by type URL. LDS, RDS and CDS are
// asked first, EDS last.
func deltaState(d *deltaStream, asked []string, initial map[string]map[string]string) map[string]map[string]heldResource {
	d.t.Helper()
	for _, ty := range xdsTypes {
		d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: ty, ResourceNamesSubscribe: asked, InitialResourceVersions: initial[ty]})
	}
	out := map[string]map[string]heldResource{}
	for range xdsTypes {
		r := d.recv()
		if out[r.GetTypeUrl()] != nil {
			d.t.Fatalf("two first responses for %s: the second %s", typeShort(r.GetTypeUrl()), names(r))
		}
		got := map[string]heldResource{}
		for _, res := range r.GetResources() {
			got[res.GetName()] = heldResource{res.GetVersion(), res.GetResource().GetValue()}
		}
		out[r.GetTypeUrl()] = got
	}
	return out
}

// versionsOf is what a delta client sends as initial_resource_versions
// when it reconnects holding state.
func versionsOf(state map[string]map[string]heldResource) map[string]map[string]string {
	out := map[string]map[string]string{}
	for ty, rs := range state {
		out[ty] = map[string]string{}
		for name, r := range rs {
			out[ty][name] = r.Version
		}
	}
	return out
}

type sotwStream struct {
	t *testing.T
	s grpc.BidiStreamingClient[discovery.DiscoveryRequest, discovery.DiscoveryResponse]
}

func openSotW(t *testing.T, c discovery.AggregatedDiscoveryServiceClient) *sotwStream {
	t.Helper()
	s, err := c.StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return &sotwStream{t: t, s: s}
}

// send sends req (io.EOF: the server ended the stream; the next receive
// says why).
func (w *sotwStream) send(req *discovery.DiscoveryRequest) {
	w.t.Helper()
	if err := w.s.Send(req); err != nil && !errors.Is(err, io.EOF) {
		w.t.Fatal(err)
	}
}

// recv returns the next response (10 s at most), ACKing it with the
// names asked.
func (w *sotwStream) recv(asked []string) *discovery.DiscoveryResponse {
	w.t.Helper()
	type res struct {
		r   *discovery.DiscoveryResponse
		err error
	}
	ch := make(chan res, 1)
	go func() { r, err := w.s.Recv(); ch <- res{r, err} }()
	select {
	case x := <-ch:
		if x.err != nil {
			w.t.Fatalf("state-of-the-world stream: %v", x.err)
		}
		w.send(&discovery.DiscoveryRequest{TypeUrl: x.r.GetTypeUrl(), ResourceNames: asked,
			VersionInfo: x.r.GetVersionInfo(), ResponseNonce: x.r.GetNonce()})
		return x.r
	case <-time.After(10 * time.Second):
		w.t.Fatal("no state-of-the-world response within 10 s")
	}
	return nil
}

// sotwResponse is one state-of-the-world response: its version_info and
// each resource's bytes by name.
type sotwResponse struct {
	VersionInfo string
	Resources   map[string][]byte
}

func decodeSotW(t *testing.T, r *discovery.DiscoveryResponse) sotwResponse {
	t.Helper()
	out := sotwResponse{VersionInfo: r.GetVersionInfo(), Resources: map[string][]byte{}}
	for _, a := range r.GetResources() {
		m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out.Resources[cachev3.GetResourceName(m)] = a.GetValue()
	}
	return out
}

// sotwState asks a state-of-the-world stream for the named resources of
// every type, saying it holds versions (by type URL; nil: nothing), and
// returns the first response of each type.
func sotwState(w *sotwStream, asked []string, versions map[string]string) map[string]sotwResponse {
	w.t.Helper()
	for _, ty := range xdsTypes {
		w.send(&discovery.DiscoveryRequest{TypeUrl: ty, ResourceNames: asked, VersionInfo: versions[ty]})
	}
	out := map[string]sotwResponse{}
	for range xdsTypes {
		r := w.recv(asked)
		if _, dup := out[r.GetTypeUrl()]; dup {
			w.t.Fatalf("two first responses for %s", typeShort(r.GetTypeUrl()))
		}
		out[r.GetTypeUrl()] = decodeSotW(w.t, r)
	}
	return out
}

// TestReplicasServeTheSameVersions (issue 27): two replicas whose hubs
// hold the same views (one published them, the other had them relayed,
// in another order across services, skipping intermediate versions of
// one, and with thousands of other services built in between on one and
// before on the other) give an xDS client the same state-of-the-world
// version_info for LDS, RDS, CDS and EDS, the same delta version for
// every resource, and the same bytes. A delta client moving from one to
// the other with initial_resource_versions is sent nothing it holds: the
// first response it gets there is the next change's, alone.
//
// A state-of-the-world client moving over is sent every type again, with
// the version_info it already holds and the same bytes: go-control-plane
// (v0.14, cache/v3 simple.go CreateWatch) answers a request whose
// version_info equals the snapshot's at once when the stream has not yet
// returned a requested resource (Subscription.ReturnedResources, empty on
// a new stream); the test pins that, and that nothing more follows until
// the next change. docs/replicas.md, "xDS across replicas".
func TestReplicasServeTheSameVersions(t *testing.T) {
	t.Parallel()
	opts := func(replica string) apptest.Options {
		return apptest.Options{Replica: replica, XDS: true, XDSConfig: func(c *xds.Config) { c.Rescan = 20 * time.Millisecond }}
	}
	a, b := apptest.New(t, opts("r1")), apptest.New(t, opts("r2"))

	// The owner's publications, by version. Each service's last view
	// but one has the bytes of an earlier one's assignment (only a zone
	// count differs): the assignment hashes the same, the view version
	// does not.
	services := []string{"api", "pay", "search", "web"}
	var owner []replicaView
	version := uint64(1000)
	next := func() uint64 { version += 7; return version }
	for step := range 4 {
		for i, svc := range services {
			n, w := 2+i+step%2, 1.0-0.25*float64(step%2)
			owner = append(owner, makeView(t, svc, next(), 10*i, n, w, step))
		}
	}
	// quiet publishes once, early; the fillers are the rest of a large
	// estate: more assignments than the server remembers the hashes of
	// (4,096).
	quiet := makeView(t, "quiet", next(), 900, 3, 1, 1)
	var fillers []replicaView
	for i := range 4200 {
		fillers = append(fillers, makeView(t, fmt.Sprintf("filler-%04d", i), next(), 1000+i, 1, 1, 1))
	}
	updates := func(vs []replicaView) []stream.Update {
		out := make([]stream.Update, 0, len(vs))
		for _, v := range vs {
			out = append(out, v.update())
		}
		return out
	}

	// Replica 1 owns: quiet first, then its services one publication at
	// a time in version order, then the rest of the estate.
	a.Hub.Publish(updates([]replicaView{quiet}))
	holds(t, a)
	for _, v := range owner {
		a.Hub.Publish(updates([]replicaView{v}))
	}
	a.Hub.Publish(updates(fillers))
	holds(t, a)

	// Replica 2 has them relayed: the rest of the estate first, then the
	// services in reverse order, one service at a time, api's last view
	// only (its relay resynced), and quiet last.
	if n := b.Hub.Relay(updates(fillers)); n != len(fillers) {
		t.Fatalf("relayed %d fillers, want %d", n, len(fillers))
	}
	holds(t, b)
	for _, svc := range slices.Backward(services) {
		var vs []replicaView
		for _, v := range owner {
			if v.service == svc {
				vs = append(vs, v)
			}
		}
		if svc == "api" {
			vs = vs[len(vs)-1:]
		}
		for _, v := range vs {
			b.Hub.Relay(updates([]replicaView{v}))
		}
	}
	b.Hub.Relay(updates([]replicaView{quiet}))
	holds(t, b)
	if !slices.Equal(a.Hub.Services(), b.Hub.Services()) {
		t.Fatal("the hubs hold different services")
	}

	asked := append(slices.Clone(services), "quiet")
	ca := rawConn(t, a.XDSAddr, a.Token(t, apptest.Admin))
	cb := rawConn(t, b.XDSAddr, b.Token(t, apptest.Admin))

	// Delta: the same version and bytes for every resource.
	da := deltaState(openDelta(t, ca), asked, nil)
	db := deltaState(openDelta(t, cb), asked, nil)
	if diff := cmp.Diff(da, db); diff != "" {
		t.Fatalf("delta resources differ between the replicas (-r1 +r2):\n%s", diff)
	}
	for _, svc := range asked {
		f, _ := a.Hub.View(svc)
		if got, want := da[resource.EndpointType][svc].Version, fmt.Sprint(f.Version); got != want {
			t.Errorf("%s's assignment has delta version %q, want its view version %s", svc, got, want)
		}
		for _, ty := range xdsTypes {
			if _, ok := da[ty][svc]; !ok {
				t.Errorf("no %s of %s", typeShort(ty), svc)
			}
		}
	}

	// State of the world: the same version_info and bytes for every type.
	sa := sotwState(openSotW(t, ca), asked, nil)
	sb := sotwState(openSotW(t, cb), asked, nil)
	if diff := cmp.Diff(sa, sb); diff != "" {
		t.Fatalf("state-of-the-world responses differ between the replicas (-r1 +r2):\n%s", diff)
	}
	for _, ty := range xdsTypes {
		if len(sa[ty].Resources) != len(asked) {
			t.Fatalf("%s response holds %d resources, want %d", typeShort(ty), len(sa[ty].Resources), len(asked))
		}
		for name, raw := range sa[ty].Resources {
			if !slices.Equal(raw, da[ty][name].Bytes) {
				t.Errorf("%s/%s: state-of-the-world and delta bytes differ", typeShort(ty), name)
			}
		}
	}
	t.Logf("version_info: %v", func() []string {
		var out []string
		for _, ty := range xdsTypes {
			out = append(out, typeShort(ty)+"="+sa[ty].VersionInfo)
		}
		return out
	}())

	// A delta client moves from replica 1 to replica 2 with what it
	// holds; web changes next (on both). The first response it gets on
	// replica 2 is that change alone.
	moved := openDelta(t, cb)
	for _, ty := range xdsTypes {
		moved.send(&discovery.DeltaDiscoveryRequest{TypeUrl: ty, ResourceNamesSubscribe: asked, InitialResourceVersions: versionsOf(da)[ty]})
	}
	// A state-of-the-world client moves too, with the version_info it
	// holds of each type.
	held := map[string]string{}
	for ty, r := range sa {
		held[ty] = r.VersionInfo
	}
	movedSotW := openSotW(t, cb)
	resent := sotwState(movedSotW, asked, held)
	if diff := cmp.Diff(sa, resent); diff != "" {
		t.Fatalf("a state-of-the-world client moving over was resent something other than what it holds (-held +resent):\n%s", diff)
	}

	change := makeView(t, "web", next(), 500, 4, 1, 9)
	a.Hub.Publish(updates([]replicaView{change}))
	b.Hub.Relay(updates([]replicaView{change}))
	if got, want := names(moved.recv()), fmt.Sprintf("ClusterLoadAssignment/web@%d", change.version); got != want {
		t.Fatalf("a delta client moving over with what it holds: first response %q, want the change alone, %q", got, want)
	}
	r := movedSotW.recv(asked)
	if r.GetTypeUrl() != resource.EndpointType || !strings.HasPrefix(r.GetVersionInfo(), fmt.Sprintf("%d.", change.version)) {
		t.Fatalf("a state-of-the-world client moving over: after the resend, %s %q, want the change's assignments", typeShort(r.GetTypeUrl()), r.GetVersionInfo())
	}
	holds(t, a)
	holds(t, b)
	// The change's versions are equal on both replicas too.
	ea := deltaState(openDelta(t, ca), asked, nil)
	eb := deltaState(openDelta(t, cb), asked, nil)
	if diff := cmp.Diff(ea, eb); diff != "" {
		t.Fatalf("after the change, delta resources differ between the replicas (-r1 +r2):\n%s", diff)
	}
}
