package xds_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds"
	"github.com/musterhq/muster/internal/xds/xdstest"
	"github.com/musterhq/muster/resolver"
)

// peerGrants are the peer regions' grants as a federation follower last
// read them: region -> service -> callers.
type peerGrants struct {
	mu     sync.Mutex
	grants map[string]map[string][]string
}

func (g *peerGrants) set(region, service string, callers ...string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.grants[region] == nil {
		g.grants[region] = map[string][]string{}
	}
	g.grants[region][service] = callers
}

// mayResolve is app's Config.MayResolveRemote over these grants.
func (g *peerGrants) mayResolve(p identity.Principal, region, service string) bool {
	return registry.MayResolveGranted(p, service, func(caller string) bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return slices.Contains(g.grants[region][service], caller)
	}) == nil
}

// regionStack is a stack (region a) whose xDS server falls back to the
// peer regions given, authorised by grants.
func regionStack(t *testing.T, grants *peerGrants, regions ...string) *apptest.Stack {
	t.Helper()
	return apptest.New(t, apptest.Options{XDS: true, XDSConfig: func(c *xds.Config) {
		c.Rescan, c.Region, c.Regions, c.MayResolveRemote = 20*time.Millisecond, "a", regions, grants.mayResolve
	}})
}

// backendAt is an endpoint of b in zone, in region ("" local), in state.
func backendAt(b *xdstest.Backend, n int, zone, region, state string) resolver.Endpoint {
	w := 1.0
	if state != "eligible" {
		w = 0
	}
	return resolver.Endpoint{InstanceID: fmt.Sprintf("00000000-0000-4000-8000-%012d", n), Address: "127.0.0.1", Port: b.Addr.Port,
		Zone: zone, State: state, Weight: w, Health: resolver.HealthKnown, Region: region}
}

// seriesFrame encodes a view of service (in region, "" local) at
// version, as its owner or the federation follower hands it to the hub.
func seriesFrame(t *testing.T, service, region string, version uint64, eps ...resolver.Endpoint) *stream.Frame {
	t.Helper()
	name := service
	if region != "" {
		name = stream.RemoteSeries(service, region)
	}
	zones := map[string]resolver.Zone{}
	for _, e := range eps {
		zones[e.Zone] = resolver.Zone{Guard: resolver.GuardOK}
	}
	v := resolver.View{Service: name, Version: version, Endpoints: eps, Zones: zones, Region: region,
		GeneratedAt: time.Date(2026, 1, 1, 0, 0, 0, int(version), time.UTC), Checksum: resolver.Checksum(eps)}
	if region != "" {
		v.AgeSeconds = 1
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return &stream.Frame{Kind: stream.KindView, Service: name, Version: version, JSON: b, PublishedAt: time.Now()}
}

// publishLocal publishes a local view and waits until xDS holds it.
func publishLocal(t *testing.T, s *apptest.Stack, f *stream.Frame) {
	t.Helper()
	s.Hub.Publish([]stream.Update{{View: f}})
	heldSeries(t, s, f.Service, f.Version)
}

// publishRemote hands the hub a peer region's view and waits until xDS
// holds it.
func publishRemote(t *testing.T, s *apptest.Stack, f *stream.Frame) {
	t.Helper()
	s.Hub.PublishRemote([]*stream.Frame{f})
	heldSeries(t, s, f.Service, f.Version)
}

func heldSeries(t *testing.T, s *apptest.Stack, series string, version uint64) {
	t.Helper()
	wait.For(t, 10*time.Second, fmt.Sprintf("the xDS server holding %s v%d", series, version), func() bool {
		v, ok := s.XDS.SeriesVersion(series)
		return ok && v >= version
	})
}

// TestGRPCClientFailsOverToAPeerRegion (issue 29's Done-when): a grpc-go
// client dialling xds:///billing through grpc-go's xDS resolver and
// priority balancer reaches only the local backend L while it is in the
// local view; when L is withdrawn it reaches only b's backend R (billing@b
// is priority 1 of the assignment, and the client fails over by itself);
// when L returns, it reaches only L again; and when L's process dies with
// no view published, the client moves to R on its own.
func TestGRPCClientFailsOverToAPeerRegion(t *testing.T) {
	t.Parallel()
	grants := &peerGrants{grants: map[string]map[string][]string{}}
	s := regionStack(t, grants, "b")
	l, r := xdstest.StartBackend(t, "L"), xdstest.StartBackend(t, "R")
	// Local billing: L; b's: R. The client is a billing workload (its
	// own service, resolvable here and, by b's rule, in b);
	// TestRemotePrioritiesFollowPeerGrants covers grants.
	publishLocal(t, s, seriesFrame(t, "billing", "", 100, backendAt(l, 1, "az1", "", "eligible")))
	publishRemote(t, s, seriesFrame(t, "billing", "b", 5000, backendAt(r, 2, "bz1", "b", "eligible")))
	grants.set("b", "billing", "billing")
	conn := xdstest.Dial(t, s.XDSAddr, s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "billing"}), "billing")
	got := only(t, conn, 30*time.Second, 50, "L")
	t.Logf("local capacity: %v", got)

	start := time.Now()
	publishLocal(t, s, seriesFrame(t, "billing", "", 101, backendAt(l, 1, "az1", "", "ineligible")))
	only(t, conn, 10*time.Second, 50, "R")
	t.Logf("L withdrawn: every call reaches b's R %s after the view was published", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	publishLocal(t, s, seriesFrame(t, "billing", "", 102, backendAt(l, 1, "az1", "", "eligible")))
	only(t, conn, 10*time.Second, 50, "L")
	t.Logf("L back: every call reaches L again %s after the view was published", time.Since(start).Round(time.Millisecond))

	// L's process dies before muster knows (no view changes): b's R is
	// priority 1 of what the client holds, and grpc-go's priority
	// balancer moves to it by itself, muster out of the request path.
	start = time.Now()
	l.Stop()
	only(t, conn, 10*time.Second, 50, "R")
	t.Logf("L gone unannounced: every call reaches b's R %s later, no view published", time.Since(start).Round(time.Millisecond))
}

// claStream asks a delta stream for the assignments named and returns a
// function reading the next response's, rendered by name.
func claStream(t *testing.T, s *apptest.Stack, token string, asked ...string) func() map[string]string {
	t.Helper()
	d := openDelta(t, rawConn(t, s.XDSAddr, token))
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: asked})
	return func() map[string]string {
		t.Helper()
		r := d.recv()
		out := map[string]string{}
		for _, res := range r.GetResources() {
			var cla endpoint.ClusterLoadAssignment
			if err := res.GetResource().UnmarshalTo(&cla); err != nil {
				t.Fatal(err)
			}
			out[res.GetName()] = renderCLA(&cla) + " @" + res.GetVersion()
		}
		for _, name := range r.GetRemovedResources() {
			out[name] = "removed"
		}
		return out
	}
}

// renderCLA is "p<priority>:<region>/<zone>" per locality.
func renderCLA(cla *endpoint.ClusterLoadAssignment) string {
	var out []string
	for _, loc := range cla.GetEndpoints() {
		out = append(out, fmt.Sprintf("p%d:%s/%s", loc.GetPriority(), loc.GetLocality().GetRegion(), loc.GetLocality().GetZone()))
	}
	return strings.Join(out, " ")
}

// TestRemotePrioritiesFollowPeerGrants: a node sees a peer region's
// priority of a service only while that region's grants let it resolve
// the service; a service held only by peer regions is served with their
// priorities alone (from 0); a service this region holds and the node
// may not resolve here is not served at all, whatever the peers grant.
// Grants given and taken in a peer region reach the node by the rescan.
func TestRemotePrioritiesFollowPeerGrants(t *testing.T) {
	t.Parallel()
	grants := &peerGrants{grants: map[string]map[string][]string{}}
	s := regionStack(t, grants, "b", "c")
	be := xdstest.StartBackend(t, "X")
	publishRemote(t, s, seriesFrame(t, "ledger", "b", 70, backendAt(be, 1, "bz1", "b", "eligible")))
	publishRemote(t, s, seriesFrame(t, "ledger", "c", 80, backendAt(be, 2, "cz1", "c", "eligible")))
	publishLocal(t, s, seriesFrame(t, "billing", "", 100, backendAt(be, 3, "az1", "", "eligible")))
	publishRemote(t, s, seriesFrame(t, "billing", "b", 90, backendAt(be, 4, "bz1", "b", "eligible")))
	grants.set("b", "ledger", "checkout")
	grants.set("b", "billing", "checkout")

	next := claStream(t, s, s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "checkout"}), "ledger", "billing")
	got := next()
	if !strings.HasPrefix(got["ledger"], "p0:b/bz1 @0.") || len(got) != 1 {
		t.Fatalf("checkout, granted ledger by b only, got %v; want ledger with b's priority alone, and no billing (held here, not granted here)", got)
	}
	grants.set("c", "ledger", "checkout")
	if got := next(); !strings.HasPrefix(got["ledger"], "p0:b/bz1 p1:c/cz1 @0.") {
		t.Fatalf("c grants ledger: got %v, want b then c", got)
	}
	grants.set("b", "ledger")
	if got := next(); !strings.HasPrefix(got["ledger"], "p0:c/cz1 @0.") {
		t.Fatalf("b revokes ledger: got %v, want c alone at priority 0", got)
	}
	// c's series changes: the assignment is rebuilt, under a new version.
	publishRemote(t, s, seriesFrame(t, "ledger", "c", 81, backendAt(be, 2, "cz2", "c", "eligible")))
	if got := next(); !strings.HasPrefix(got["ledger"], "p0:c/cz2 @0.") {
		t.Fatalf("c's ledger moves zone: got %v", got)
	}
}

// TestReplicasNameRegionalAssignmentsAlike (issue 27 with issue 29): two
// replicas whose hubs got the same local view and peer regions' series in
// different orders (and one of them an older view of b's first) serve a
// node the same assignment under the same delta version; a new view of
// one peer's series changes it on both, alike.
func TestReplicasNameRegionalAssignmentsAlike(t *testing.T) {
	t.Parallel()
	grants := &peerGrants{grants: map[string]map[string][]string{}}
	grants.set("b", "billing", "checkout")
	grants.set("c", "billing", "checkout")
	r1, r2 := regionStack(t, grants, "b", "c"), regionStack(t, grants, "b", "c")
	be := xdstest.StartBackend(t, "X")
	local := func(v uint64) *stream.Frame {
		return seriesFrame(t, "billing", "", v, backendAt(be, 1, "az1", "", "eligible"))
	}
	fromB := func(v uint64, zone string) *stream.Frame {
		return seriesFrame(t, "billing", "b", v, backendAt(be, 2, zone, "b", "eligible"))
	}
	fromC := func(v uint64) *stream.Frame {
		return seriesFrame(t, "billing", "c", v, backendAt(be, 3, "cz1", "c", "eligible"))
	}

	publishLocal(t, r1, local(100))
	publishRemote(t, r1, fromB(40, "bz1"))
	publishRemote(t, r1, fromC(70))

	publishRemote(t, r2, fromC(70))
	publishRemote(t, r2, fromB(39, "bz9"))
	publishRemote(t, r2, fromB(40, "bz1"))
	publishLocal(t, r2, local(100))

	// billing's own workloads resolve it everywhere; a checkout workload
	// would not see local billing (not granted here).
	tok := devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "billing"}
	n1 := claStream(t, r1, r1.Token(t, tok), "billing")
	n2 := claStream(t, r2, r2.Token(t, tok), "billing")
	a1, a2 := n1()["billing"], n2()["billing"]
	if !strings.HasPrefix(a1, "p0:a/az1 p1:b/bz1 p2:c/cz1 @100.") || a1 != a2 {
		t.Fatalf("replica 1 serves %q, replica 2 %q: want the same, a then b then c, version 100.<hash>", a1, a2)
	}
	publishRemote(t, r1, fromB(41, "bz2"))
	publishRemote(t, r2, fromB(41, "bz2"))
	b1, b2 := n1()["billing"], n2()["billing"]
	if !strings.HasPrefix(b1, "p0:a/az1 p1:b/bz2 p2:c/cz1 @100.") || b1 != b2 || b1 == a1 {
		t.Fatalf("after b's next view: replica 1 serves %q, replica 2 %q (before: %q): want the same, new", b1, b2, a1)
	}
	t.Logf("before %s, after %s", a1, b1)
}
