package xds_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds"
	"github.com/musterhq/muster/internal/xds/xdstest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var admin = identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}

// estate is a stack serving xDS with web's instances on real gRPC
// backends, per zone, admitted by a prober's first success.
type estate struct {
	*apptest.Stack
	t        *testing.T
	backends map[string]*xdstest.Backend // by id
	ids      map[string]string           // backend id -> instance id
	prober   string
}

func newEstate(t *testing.T, opts apptest.Options, zones map[string][]string) *estate {
	t.Helper()
	opts.XDS = true
	e := &estate{Stack: apptest.New(t, opts), t: t, backends: map[string]*xdstest.Backend{}, ids: map[string]string{}}
	e.Seed(t)
	ctx := context.Background()
	for zone, names := range zones {
		for _, id := range names {
			b := xdstest.StartBackend(t, id)
			in, err := e.Registry.Register(ctx, admin, netip.Addr{}, "web", registry.Registration{Address: "127.0.0.1", Port: b.Addr.Port, Zone: zone})
			if err != nil {
				t.Fatal(err)
			}
			e.backends[id], e.ids[id] = b, in.ID.String()
		}
	}
	if _, err := e.Registry.PutProberAssignments(ctx, admin, "prober-1", registry.ProberAssignments{Services: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	e.prober = e.Token(t, devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-1"})
	if err := e.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	var all []string
	for id := range e.ids {
		all = append(all, id)
	}
	e.report("success", all...)
	e.publish()
	return e
}

// report sends one probe outcome for each named backend.
func (e *estate) report(outcome string, backends ...string) {
	e.t.Helper()
	var items []string
	for _, b := range backends {
		items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":%q}`, e.ids[b], outcome))
	}
	if r := e.JSON(e.t, "POST", "/v1/reports", e.prober, `{"reports":[`+strings.Join(items, ",")+`]}`); r.Status != http.StatusOK || strings.Contains(string(r.Body), `"code"`) {
		e.t.Fatalf("reports: %d %s", r.Status, r.Body)
	}
}

// publish evaluates and publishes everything queued (additions wait for
// their 1 s window, on the stack's clock), and waits until the xDS server
// holds every view the hub does.
func (e *estate) publish() {
	e.t.Helper()
	e.Evaluator.EvaluateNow()
	e.Publisher.RunOnce()
	e.Clock.Advance(1100 * time.Millisecond)
	e.Publisher.RunOnce()
	e.synced()
}

// synced waits until the xDS server holds every view the hub does.
func (e *estate) synced() {
	e.t.Helper()
	wait.For(e.t, 10*time.Second, "the xDS server holding the hub's views", func() bool {
		for _, name := range e.Hub.Services() {
			f, _ := e.Hub.View(name)
			if v, ok := e.XDS.Version(name); !ok || v < f.Version {
				return false
			}
		}
		return true
	})
}

// grant lets api resolve web.
func (e *estate) grant() {
	e.t.Helper()
	if _, err := e.Registry.PutGrants(context.Background(), admin, "web", []string{"api"}); err != nil {
		e.t.Fatal(err)
	}
}

// only polls (within) until n calls in a row reach exactly the backends
// in want, and returns the tally of those n calls.
func only(t *testing.T, conn *grpc.ClientConn, within time.Duration, n int, want ...string) map[string]int {
	t.Helper()
	var got map[string]int
	wait.For(t, within, fmt.Sprintf("calls reaching exactly %v", want), func() bool {
		got = xdstest.Tally(t.Context(), conn, n)
		keys := make([]string, 0, len(got))
		for k := range got {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		w := slices.Sorted(slices.Values(want))
		return slices.Equal(keys, w)
	})
	return got
}

func metric(t *testing.T, s *apptest.Stack, re string) {
	t.Helper()
	if !regexp.MustCompile(`(?m)` + re).Match(s.Scrape(t)) {
		t.Fatalf("metrics lack %s:\n%s", re, grep(s.Scrape(t), "muster_xds_"))
	}
}

func grep(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestGRPCClientRoutesOnlyToRoutableBackends: a grpc-go client dialling
// xds:///web through grpc-go's xDS resolver and balancers, as a workload
// web granted, reaches every eligible backend and no other; a hard failure
// takes its backend out of its rotation within 2 s of the report; the
// backends of a service with no readiness signal (health unknown) are
// reached too.
func TestGRPCClientRoutesOnlyToRoutableBackends(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string][]string{"az1": {"a1", "a2", "a3"}, "az2": {"b1", "b2", "b3"}})
	// a3 fails hard before the client starts: ineligible, never reached
	// (az1 keeps 2 of 3, above its minimum healthy fraction).
	e.report("hard_failure", "a3")
	e.publish()
	e.grant()
	conn := xdstest.Dial(t, e.XDSAddr, e.Token(t, apptest.API), "web")
	got := only(t, conn, 30*time.Second, 300, "a1", "a2", "b1", "b2", "b3")
	t.Logf("before the failure: %v", got)

	start := time.Now()
	e.report("hard_failure", "b1")
	e.Evaluator.EvaluateNow()
	e.Publisher.RunOnce() // withdrawals go at once
	only(t, conn, 2*time.Second, 100, "a1", "a2", "b2", "b3")
	t.Logf("b1 out of rotation %s after its hard failure was reported", time.Since(start).Round(time.Millisecond))

	// api has no readiness signal: its instance is eligible with health
	// unknown (UNKNOWN in xDS), and routable.
	u := xdstest.StartBackend(t, "u1")
	if _, err := e.Registry.Register(t.Context(), admin, netip.Addr{}, "api", registry.Registration{Address: "127.0.0.1", Port: u.Addr.Port, Zone: "az1"}); err != nil {
		t.Fatal(err)
	}
	if err := e.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.publish()
	only(t, xdstest.Dial(t, e.XDSAddr, e.Token(t, apptest.API), "api"), 30*time.Second, 20, "u1")
	metric(t, e.Stack, `^muster_xds_streams\{protocol="sotw"\} 2$`)
	metric(t, e.Stack, `^muster_xds_push_latency_seconds_count [1-9]`)
}

// TestGRPCClientFollowsAZoneShift: draining a zone moves every call out
// of it; each step back moves traffic by the zone weights (az2's share is
// its endpoints' weight × its traffic weight over the total, as muster's
// resolver computes it).
func TestGRPCClientFollowsAZoneShift(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string][]string{"az1": {"a1", "a2"}, "az2": {"b1", "b2"}})
	conn := xdstest.Dial(t, e.XDSAddr, e.Token(t, apptest.Web), "web")
	only(t, conn, 30*time.Second, 200, "a1", "a2", "b1", "b2")

	tok := e.Token(t, apptest.Admin)
	r := e.JSON(t, "POST", "/v1/shifts", tok, `{"scope":"zone","target":"az2","reason":"az2 packet loss","manual":true}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("drain az2: %d %s", r.Status, r.Body)
	}
	id := apptest.Decode[struct{ ID string }](t, r).ID
	e.publish()
	only(t, conn, 5*time.Second, 200, "a1", "a2")

	share := func(want float64) {
		t.Helper()
		// Until the client has the new weights the share is the old
		// one; poll until it is within bounds (binomial, 1000 calls: the
		// bounds are 5 standard deviations wide).
		n := 1000.0
		var frac float64
		wait.For(t, 10*time.Second, fmt.Sprintf("az2 taking %.3f of the calls", want), func() bool {
			got := xdstest.Tally(t.Context(), conn, int(n))
			frac = float64(got["b1"]+got["b2"]) / n
			lo, hi := want-5*math.Sqrt(want*(1-want)/n), want+5*math.Sqrt(want*(1-want)/n)
			return frac >= lo && frac <= hi && got["a1"]+got["a2"]+got["b1"]+got["b2"] == int(n)
		})
		t.Logf("az2 share %.3f (want %.3f)", frac, want)
	}
	for _, w := range []float64{0.1, 0.25} {
		e.Clock.Advance(2*time.Minute + time.Second) // the dwell
		if r := e.JSON(t, "POST", "/v1/shifts/"+id+"/step", tok, ``); r.Status != http.StatusOK {
			t.Fatalf("step to %g: %d %s", w, r.Status, r.Body)
		}
		e.publish()
		share(2 * w / (2 + 2*w))
	}
}

// rawConn dials the xDS server for raw ADS streams.
func rawConn(t *testing.T, addr, token string) discovery.AggregatedDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(xdstest.Bearer(token)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return discovery.NewAggregatedDiscoveryServiceClient(conn)
}

type deltaStream struct {
	t *testing.T
	s grpc.BidiStreamingClient[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]
}

func openDelta(t *testing.T, c discovery.AggregatedDiscoveryServiceClient) *deltaStream {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	s, err := c.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &deltaStream{t: t, s: s}
}

// send sends req. io.EOF means the server has already ended the stream
// (a refusal at its start): its status is what the next receive returns.
func (d *deltaStream) send(req *discovery.DeltaDiscoveryRequest) {
	d.t.Helper()
	if err := d.s.Send(req); err != nil && !errors.Is(err, io.EOF) {
		d.t.Fatal(err)
	}
}

// recv returns the next response (10 s at most), ACKing it.
func (d *deltaStream) recv() *discovery.DeltaDiscoveryResponse {
	d.t.Helper()
	type res struct {
		r   *discovery.DeltaDiscoveryResponse
		err error
	}
	ch := make(chan res, 1)
	go func() { r, err := d.s.Recv(); ch <- res{r, err} }()
	select {
	case x := <-ch:
		if x.err != nil {
			d.t.Fatalf("delta stream: %v", x.err)
		}
		d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: x.r.GetTypeUrl(), ResponseNonce: x.r.GetNonce()})
		return x.r
	case <-time.After(10 * time.Second):
		d.t.Fatal("no delta response within 10 s")
	}
	return nil
}

// end waits (within) for the stream to end and returns its error.
func (d *deltaStream) end(within time.Duration) error {
	d.t.Helper()
	ch := make(chan error, 1)
	go func() {
		for {
			if _, err := d.s.Recv(); err != nil {
				ch <- err
				return
			}
		}
	}()
	select {
	case err := <-ch:
		return err
	case <-time.After(within):
		d.t.Fatalf("the stream did not end within %s", within)
	}
	return nil
}

func names(r *discovery.DeltaDiscoveryResponse) string {
	var out []string
	for _, res := range r.GetResources() {
		out = append(out, typeShort(r.GetTypeUrl())+"/"+res.GetName()+"@"+res.GetVersion())
	}
	for _, n := range r.GetRemovedResources() {
		out = append(out, typeShort(r.GetTypeUrl())+"/-"+n)
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func typeShort(u string) string { return u[strings.LastIndex(u, ".")+1:] }

func viewVersion(t *testing.T, s *apptest.Stack, service string) uint64 {
	t.Helper()
	f, ok := s.Hub.View(service)
	if !ok {
		t.Fatalf("no view of %s", service)
	}
	return f.Version
}

// TestDeltaSendsOnlyTheChangedService: on a raw DeltaAggregatedResources
// stream (go-control-plane's generated stubs) subscribed to all four types
// of web and api, the first responses carry both services, the
// assignments versioned by their views; a change to web then sends web's
// assignment alone (nothing of api, no listener, route or cluster), which
// the next response, a change to api, shows.
func TestDeltaSendsOnlyTheChangedService(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string][]string{"az1": {"a1", "a2", "a3"}})
	u := xdstest.StartBackend(t, "u1")
	if _, err := e.Registry.Register(t.Context(), admin, netip.Addr{}, "api", registry.Registration{Address: "127.0.0.1", Port: u.Addr.Port, Zone: "az1"}); err != nil {
		t.Fatal(err)
	}
	if err := e.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.publish()
	d := openDelta(t, rawConn(t, e.XDSAddr, e.Token(t, apptest.Admin)))
	both := []string{"web", "api"}
	types := []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}
	for _, ty := range types {
		d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: ty, ResourceNamesSubscribe: both})
	}
	first := map[string]string{}
	for range types {
		r := d.recv()
		first[typeShort(r.GetTypeUrl())] = names(r)
	}
	webV, apiV := viewVersion(t, e.Stack, "web"), viewVersion(t, e.Stack, "api")
	if want := fmt.Sprintf("ClusterLoadAssignment/api@%d ClusterLoadAssignment/web@%d", apiV, webV); first["ClusterLoadAssignment"] != want {
		t.Fatalf("first assignments %q, want %q", first["ClusterLoadAssignment"], want)
	}
	for _, ty := range []string{"Listener", "RouteConfiguration", "Cluster"} {
		if !strings.Contains(first[ty], ty+"/api@") || !strings.Contains(first[ty], ty+"/web@") {
			t.Fatalf("first %s response %q lacks web or api", ty, first[ty])
		}
	}

	e.report("hard_failure", "a1")
	e.Evaluator.EvaluateNow()
	e.Publisher.RunOnce()
	r := d.recv()
	webV2 := viewVersion(t, e.Stack, "web")
	if got, want := names(r), fmt.Sprintf("ClusterLoadAssignment/web@%d", webV2); got != want || webV2 <= webV {
		t.Fatalf("after a change to web: %q, want %q (web was v%d)", got, want, webV)
	}
	var cla endpoint.ClusterLoadAssignment
	if err := r.GetResources()[0].GetResource().UnmarshalTo(&cla); err != nil {
		t.Fatal(err)
	}
	if n := len(cla.GetEndpoints()[0].GetLbEndpoints()); n != 2 {
		t.Fatalf("web's assignment has %d endpoints after a1 failed, want 2: %v", n, &cla)
	}
	// The next response is api's change: nothing else was sent between.
	if _, err := e.Registry.Register(t.Context(), admin, netip.Addr{}, "api", registry.Registration{Address: "127.0.0.2", Port: u.Addr.Port, Zone: "az1"}); err != nil {
		t.Fatal(err)
	}
	if err := e.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.publish()
	if got, want := names(d.recv()), fmt.Sprintf("ClusterLoadAssignment/api@%d", viewVersion(t, e.Stack, "api")); got != want {
		t.Fatalf("after a change to api: %q, want %q", got, want)
	}
	metric(t, e.Stack, `^muster_xds_pushes_total\{protocol="delta",type="endpoint"\} 3$`)
}

// TestUngrantedAndTokenlessSeeNothing: a stream without a token is refused
// UNAUTHENTICATED; a workload web never granted asks for web and api and
// receives api's resources only (its own service), web's being absent as
// a service that does not exist would be; both attempts are counted.
func TestUngrantedAndTokenlessSeeNothing(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string][]string{"az1": {"a1"}})
	u := xdstest.StartBackend(t, "u1")
	if _, err := e.Registry.Register(t.Context(), admin, netip.Addr{}, "api", registry.Registration{Address: "127.0.0.1", Port: u.Addr.Port, Zone: "az1"}); err != nil {
		t.Fatal(err)
	}
	if err := e.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.publish()

	anon := openDelta(t, rawConn(t, e.XDSAddr, ""))
	// The refusal may end the stream before the request is sent.
	_ = anon.s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}})
	if err := anon.end(10 * time.Second); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("token-less stream: %v, want Unauthenticated", err)
	}

	d := openDelta(t, rawConn(t, e.XDSAddr, e.Token(t, apptest.API)))
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web", "api"}})
	if got, want := names(d.recv()), fmt.Sprintf("ClusterLoadAssignment/api@%d", viewVersion(t, e.Stack, "api")); got != want {
		t.Fatalf("ungranted: %q, want %q", got, want)
	}
	// A wildcard listener subscription lists only what it may see.
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ListenerType, ResourceNamesSubscribe: []string{"*"}})
	if got := names(d.recv()); !strings.HasPrefix(got, "Listener/api@") || strings.Contains(got, "web") {
		t.Fatalf("ungranted wildcard listeners: %q", got)
	}
	// web changes: api's stream hears nothing of it. Once granted, web
	// appears (within the rescan).
	e.report("hard_failure", "a1")
	e.Evaluator.EvaluateNow()
	e.Publisher.RunOnce()
	e.grant()
	if got := names(d.recv()); !strings.Contains(got, "web@") {
		t.Fatalf("after the grant: %q, want web", got)
	}
	metric(t, e.Stack, `^muster_xds_denied_total\{reason="unauthenticated"\} 1$`)
	metric(t, e.Stack, `^muster_xds_denied_total\{reason="not_granted"\} 1$`)
}

// TestNACKIsNotRetried: a state-of-the-world client that rejects an
// assignment is not sent it again: the next response it gets is the next
// change's; the NACK is counted.
func TestNACKIsNotRetried(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string][]string{"az1": {"a1", "a2", "a3"}})
	c := rawConn(t, e.XDSAddr, e.Token(t, apptest.Web))
	s, err := c.StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	recv := func() *discovery.DiscoveryResponse {
		t.Helper()
		ch := make(chan *discovery.DiscoveryResponse, 1)
		go func() {
			r, err := s.Recv()
			if err != nil {
				t.Error(err)
			}
			ch <- r
		}()
		select {
		case r := <-ch:
			if r == nil {
				t.FailNow()
			}
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no response within 10 s")
		}
		return nil
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"web"}, Node: nil}); err != nil {
		t.Fatal(err)
	}
	first := recv()
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"web"}, ResponseNonce: first.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "test rejects it"}}); err != nil {
		t.Fatal(err)
	}
	e.report("hard_failure", "a1")
	e.Evaluator.EvaluateNow()
	e.Publisher.RunOnce()
	next := recv()
	v := viewVersion(t, e.Stack, "web")
	if !strings.HasPrefix(next.GetVersionInfo(), fmt.Sprint(v)+".") || next.GetVersionInfo() == first.GetVersionInfo() {
		t.Fatalf("after the NACK the next response is %q, want the change's (web v%d; the rejected one was %q)", next.GetVersionInfo(), v, first.GetVersionInfo())
	}
	metric(t, e.Stack, `^muster_xds_nacks_total\{type="endpoint"\} 1$`)
}

// TestAdmissionRefusesWithARetryDelay: past the admission budget a new
// stream is refused RESOURCE_EXHAUSTED with a RetryInfo delay; the first
// stream keeps its resources; a drain ends it UNAVAILABLE.
func TestAdmissionRefusesWithARetryDelay(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{Admission: stream.AdmissionConfig{Floor: 1, Window: time.Hour}}, map[string][]string{"az1": {"a1"}})
	c := rawConn(t, e.XDSAddr, e.Token(t, apptest.Web))
	d := openDelta(t, c)
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}})
	d.recv()
	refused := openDelta(t, c)
	refused.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}})
	st := status.Convert(refused.end(10 * time.Second))
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("second stream: %v, want ResourceExhausted", st.Err())
	}
	var retry *errdetails.RetryInfo
	for _, det := range st.Details() {
		if r, ok := det.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	if retry == nil || retry.GetRetryDelay().AsDuration() < time.Second {
		t.Fatalf("refusal carries no retry delay: %v", st.Details())
	}
	metric(t, e.Stack, `^muster_xds_admission_refused_total 1$`)

	go e.XDS.Drain(context.Background())
	if err := d.end(10 * time.Second); status.Code(err) != codes.Unavailable {
		t.Fatalf("drained stream: %v, want Unavailable", err)
	}
}

// TestStreamEndsWhenItsTokenExpires: a stream follows its authority: it
// ends UNAUTHENTICATED when the token it was opened with expires.
func TestStreamEndsWhenItsTokenExpires(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string][]string{"az1": {"a1"}})
	tok, err := e.Issuer.Mint(devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", TTL: 3 * time.Second}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	d := openDelta(t, rawConn(t, e.XDSAddr, tok))
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}})
	d.recv()
	start := time.Now()
	err = d.end(15 * time.Second)
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("at expiry: %v, want Unauthenticated (expired)", err)
	}
	t.Logf("ended %s after its first response", time.Since(start).Round(10*time.Millisecond))
}

// TestNoAnswerBeforeReady: until muster can answer for what exists
// (Config.Ready: after a restart, the evaluator rebuilt and views out,
// the authorisation copy loaded) a stream is held without an answer, not
// told that nothing exists; once ready it gets its resources.
func TestNoAnswerBeforeReady(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	e := newEstate(t, apptest.Options{XDSConfig: func(c *xds.Config) {
		c.Ready = ready.Load
		c.Rescan = 50 * time.Millisecond
	}}, map[string][]string{"az1": {"a1"}})
	d := openDelta(t, rawConn(t, e.XDSAddr, e.Token(t, apptest.Web)))
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}})
	wait.For(t, 10*time.Second, "the stream open", func() bool { return e.XDS.Streams() == 1 })
	got := make(chan *discovery.DeltaDiscoveryResponse, 1)
	go func() {
		r, err := d.s.Recv()
		if err == nil {
			got <- r
		}
		close(got)
	}()
	select {
	case r := <-got:
		t.Fatalf("answered before ready: %v", names(r))
	default:
	}
	if e.XDS.Answering() {
		t.Fatal("answering before Ready")
	}
	ready.Store(true)
	select {
	case r := <-got:
		if want := fmt.Sprintf("ClusterLoadAssignment/web@%d", viewVersion(t, e.Stack, "web")); names(r) != want {
			t.Fatalf("once ready: %q, want %q", names(r), want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10 s of ready")
	}
}

// TestAStaleServiceEndsAndRefusesItsStreams: when the relay judges a
// service stale here (this replica cannot follow its owner while another
// replica can), the streams of nodes that see it end UNAVAILABLE, so the
// proxies keep what they hold and reconnect elsewhere; a new stream is
// refused the same way while it stays stale, and answered once current.
func TestAStaleServiceEndsAndRefusesItsStreams(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string][]string{"az1": {"a1"}})
	c := rawConn(t, e.XDSAddr, e.Token(t, apptest.Web))
	d := openDelta(t, c)
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}})
	d.recv()

	e.Hub.SetStale([]string{"web"})
	e.XDS.DrainServices([]string{"web"})
	if err := d.end(10 * time.Second); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "cannot follow the owner") {
		t.Fatalf("a stream of a node that sees a stale service: %v, want Unavailable (cannot follow the owner)", err)
	}
	refused := openDelta(t, c)
	refused.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}})
	if err := refused.end(10 * time.Second); status.Code(err) != codes.Unavailable {
		t.Fatalf("a new stream while web is stale: %v, want Unavailable", err)
	}
	metric(t, e.Stack, `^muster_xds_not_current_total 2$`)

	e.Hub.SetStale(nil)
	again := openDelta(t, c)
	again.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}})
	if r := again.recv(); len(r.GetResources()) == 0 {
		t.Fatalf("once current: %v", r)
	}
}
