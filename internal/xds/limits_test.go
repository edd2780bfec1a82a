package xds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds"
)

// manyNames is n resource names: prefix and a number from first.
func manyNames(prefix string, first, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(1_000_000+first+i)
	}
	return out
}

// flood sends a stream the requests made by next (nil: no more) until
// the stream ends, and returns how it ended (10 s at most once the
// requests are sent). A request is made only while the stream is open:
// a refused client's later requests cost nothing to make.
func flood(t *testing.T, recv func() error, send func(i int) bool) error {
	t.Helper()
	ended := make(chan error, 1)
	go func() {
		for {
			if err := recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	for i := 0; ; i++ {
		select {
		case err := <-ended:
			return err
		default:
		}
		if !send(i) {
			break
		}
	}
	select {
	case err := <-ended:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end within 10 s")
	}
	return nil
}

// refusedFor fails unless err is RESOURCE_EXHAUSTED naming the limit's
// setting and its figure.
func refusedFor(t *testing.T, what string, err error, limit string) {
	t.Helper()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), limit) {
		t.Fatalf("%s: %v, want RESOURCE_EXHAUSTED naming %q", what, err, limit)
	}
	t.Logf("%s: %s", what, status.Convert(err).Message())
}

// heldBy is what the principal whose key starts with prefix holds.
func heldBy(s *apptest.Stack, prefix string) (string, xds.Held) {
	for k, h := range s.XDS.Accounts() {
		if strings.HasPrefix(k, prefix) {
			return k, h
		}
	}
	return "", xds.Held{}
}

// heapInUse is the live heap after two collections (the second empties
// what buffer pools kept through the first).
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestXDSBoundedPerPrincipal: streams subscribing to 1,000,000 names
// (state of the world and delta) and many streams under one principal,
// over real gRPC: each is refused at its limit with RESOURCE_EXHAUSTED
// naming the limit's setting, counted by reason and summarised in the
// audit log by principal; what a principal holds never passes its
// limit, and a refusal leaves nothing held.
func TestXDSBoundedPerPrincipal(t *testing.T) {
	t.Parallel()
	const (
		perPrincipal = 6
		perConn      = 4
		nameBytes    = 1 << 20
	)
	s := apptest.New(t, apptest.Options{XDS: true, XDSConfig: func(c *xds.Config) {
		// Names per stream at its default, 10,000.
		c.Limits = xds.Limits{StreamsPerPrincipal: perPrincipal, StreamsPerConnection: perConn, NameBytesPerPrincipal: nameBytes}
	}})
	version := uint64(100)
	publish := func(svc string) uint64 {
		version++
		s.Hub.Publish([]stream.Update{makeView(t, svc, version, 0, 2, 1, 1).update()})
		holds(t, s)
		return version
	}
	publish("web")
	web := s.Token(t, apptest.Web)

	// State of the world: 1,000,000 names, 250,000 a type (a request is
	// at most 4 MiB). The first request is refused; nothing is held.
	sw := openSotW(t, rawConn(t, s.XDSAddr, web))
	err := flood(t, func() error { _, err := sw.s.Recv(); return err }, func(i int) bool {
		if i == len(xdsTypes) {
			return false
		}
		sw.send(&discovery.DiscoveryRequest{TypeUrl: xdsTypes[i], ResourceNames: manyNames("s", i*250_000, 250_000)})
		return true
	})
	refusedFor(t, "a state-of-the-world stream asking for 1,000,000 names", err, "at most 10000 resource names per stream (MUSTER_XDS_MAX_NAMES)")

	// Delta: 1,000,000 names in requests of 100,000: the first is
	// refused.
	d := openDelta(t, rawConn(t, s.XDSAddr, web))
	err = flood(t, func() error { _, err := d.s.Recv(); return err }, func(i int) bool {
		if i == 10 {
			return false
		}
		d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: manyNames("d", i*100_000, 100_000)})
		return true
	})
	refusedFor(t, "a delta stream subscribing to 1,000,000 names", err, "at most 10000 resource names per stream (MUSTER_XDS_MAX_NAMES)")
	if _, h := heldBy(s, "workload:web"); h.NameBytes != 0 {
		t.Fatalf("after the refusals web holds %d bytes of names, want none", h.NameBytes)
	}

	// Delta counts the names subscribed over the stream's life: 6,000,
	// unsubscribed, then 3,999 and web make 10,000, the most allowed
	// (web is answered); one more is refused.
	d = openDelta(t, rawConn(t, s.XDSAddr, web))
	first := manyNames("l", 0, 6000)
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: first})
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesUnsubscribe: first})
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: append(manyNames("l", 6000, 3999), "web")})
	if r := d.recv(); len(r.GetResources()) != 1 || r.GetResources()[0].GetName() != "web" {
		t.Fatalf("at 10,000 names the stream was sent %s, want web", names(r))
	}
	if _, h := heldBy(s, "workload:web"); h.NameBytes <= 0 || h.NameBytes > nameBytes {
		t.Fatalf("web holds %d bytes of names at 10,000 names", h.NameBytes)
	}
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"one-more"}})
	refusedFor(t, "the 10,001st name subscribed over a delta stream's life", d.end(10*time.Second), "(MUSTER_XDS_MAX_NAMES)")

	// Name bytes per principal: two streams of 7,000 names each are
	// more than web may hold (1 MiB): the second request is refused,
	// the first stream keeps being served.
	d1 := openDelta(t, rawConn(t, s.XDSAddr, web))
	d1.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: append(manyNames("b", 0, 6999), "web")})
	if r := d1.recv(); len(r.GetResources()) != 1 {
		t.Fatalf("the first 7,000-name stream was sent %s, want web", names(r))
	}
	key, h1 := heldBy(s, "workload:web")
	d2 := openDelta(t, rawConn(t, s.XDSAddr, web))
	d2.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: manyNames("b", 7000, 7000)})
	refusedFor(t, "a second 7,000-name stream of the same principal", d2.end(10*time.Second), fmt.Sprintf("at most %d bytes of resource names per principal (MUSTER_XDS_MAX_NAME_BYTES)", nameBytes))
	if _, h := heldBy(s, "workload:web"); h != h1 || h.NameBytes > nameBytes {
		t.Fatalf("after the refusal %s holds %+v, want what it held before it, %+v, within %d bytes", key, h, h1, nameBytes)
	}
	t.Logf("%s holds %d streams and %d bytes of names (limit %d)", key, h1.Streams, h1.NameBytes, nameBytes)
	v := publish("web")
	if r := d1.recv(); names(r) != fmt.Sprintf("ClusterLoadAssignment/web@%d", v) {
		t.Fatalf("the stream within the limit, after web changed: %s", names(r))
	}

	// Streams per principal: api's sixth stream is its last; a seventh,
	// on a connection of its own, is refused with a retry delay.
	api := s.Token(t, apptest.API)
	open := s.XDS.Streams()
	ca, cb := rawConn(t, s.XDSAddr, api), rawConn(t, s.XDSAddr, api)
	var apis []*deltaStream
	for i := range perPrincipal {
		c := ca
		if i%2 == 1 {
			c = cb
		}
		apis = append(apis, openDelta(t, c))
	}
	wait.For(t, 10*time.Second, "api's streams open", func() bool { return s.XDS.Streams() == open+perPrincipal })
	err = openDelta(t, rawConn(t, s.XDSAddr, api)).end(10 * time.Second)
	refusedFor(t, "a principal's seventh stream", err, fmt.Sprintf("at most %d streams per principal (MUSTER_XDS_MAX_STREAMS_PER_PRINCIPAL)", perPrincipal))
	var retry *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	if retry == nil || retry.GetRetryDelay().AsDuration() <= 0 {
		t.Fatalf("the refusal carries no retry delay: %v", status.Convert(err).Details())
	}

	// Streams per connection: another principal's fifth stream on one
	// connection is refused; on a connection of its own it is not.
	admin := s.Token(t, apptest.Admin)
	cc := rawConn(t, s.XDSAddr, admin)
	open = s.XDS.Streams()
	for range perConn {
		openDelta(t, cc)
	}
	wait.For(t, 10*time.Second, "alice's streams open", func() bool { return s.XDS.Streams() == open+perConn })
	refusedFor(t, "a connection's fifth stream", openDelta(t, cc).end(10*time.Second), fmt.Sprintf("at most %d streams per connection (MUSTER_XDS_MAX_STREAMS_PER_CONNECTION)", perConn))
	openDelta(t, rawConn(t, s.XDSAddr, admin))
	wait.For(t, 10*time.Second, "alice's stream on a connection of its own open", func() bool { return s.XDS.Streams() == open+perConn+1 })

	// Counted by reason, and on the audit record by principal.
	for reason, n := range map[string]int{
		xds.ReasonNamesPerStream: 3, xds.ReasonNameBytesPerPrincipal: 1,
		xds.ReasonStreamsPerPrincipal: 1, xds.ReasonStreamsPerConnection: 1,
	} {
		metric(t, s, fmt.Sprintf(`^muster_xds_refused_total\{reason="%s"\} %d$`, reason, n))
	}
	ctx := context.Background()
	s.XDSRefusals.RunOnce(ctx, true)
	evs, err := audit.List(ctx, db.New(s.Pool), audit.Filter{Action: audit.ActionXDSRefuse, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]int{}
	for _, e := range evs {
		var after struct {
			ByReason map[string]int `json:"by_reason"`
			First    []string       `json:"first_refused"`
		}
		if err := json.Unmarshal(e.After, &after); err != nil {
			t.Fatal(err)
		}
		if e.Outcome != audit.Refused || e.Target != e.Actor || len(after.First) == 0 || !strings.Contains(after.First[0], "MUSTER_XDS_") {
			t.Errorf("xds.refuse row %+v: %s", e, e.After)
		}
		p := strings.SplitN(e.Actor, "/", 2)[0]
		if got[p] == nil {
			got[p] = map[string]int{}
		}
		for reason, n := range after.ByReason {
			got[p][reason] += n
		}
	}
	want := map[string]map[string]int{
		"workload:web":   {xds.ReasonNamesPerStream: 3, xds.ReasonNameBytesPerPrincipal: 1},
		"workload:api":   {xds.ReasonStreamsPerPrincipal: 1},
		"operator:alice": {xds.ReasonStreamsPerConnection: 1},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("xds.refuse rows by principal %v, want %v", got, want)
	}

	// One of api's streams ends: another may open.
	open = s.XDS.Streams()
	_ = apis[0].s.CloseSend()
	apis[0].end(10 * time.Second)
	wait.For(t, 10*time.Second, "api's first stream gone", func() bool { return s.XDS.Streams() == open-1 })
	openDelta(t, rawConn(t, s.XDSAddr, api))
	wait.For(t, 10*time.Second, "api's stream in place of the one that ended", func() bool { return s.XDS.Streams() == open })
}

// TestXDSOneNodesNamesDoNotSlowAnother: with the limits raised so far
// that one principal's streams hold 1,000,000 names (delta) and 250,000
// more (state of the world), another node's updates cost what they
// cost before, both for a service only it sees and for one both see:
// the cache looks at the same resources and streams per update, and an
// update goes through while every stream of the subscribing principal
// is locked (as one taking a request of a million names would be). The
// update latencies before and during are printed, not asserted.
func TestXDSOneNodesNamesDoNotSlowAnother(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{XDS: true, XDSConfig: func(c *xds.Config) {
		c.Limits = xds.Limits{NamesPerStream: 2_000_000, NameBytesPerPrincipal: 1 << 30}
	}})
	version := uint64(100)
	publish := func(svc string) uint64 {
		version++
		s.Hub.Publish([]stream.Update{makeView(t, svc, version, 0, 2, 1, 1).update()})
		return version
	}
	publish("web")
	publish("api")
	holds(t, s)

	// The other node: an operator following api (only it sees it) and
	// web (the subscribing principal sees it too).
	other := openDelta(t, rawConn(t, s.XDSAddr, s.Token(t, apptest.Admin)))
	other.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"api", "web"}})
	if r := other.recv(); len(r.GetResources()) != 2 {
		t.Fatalf("the other node's first response: %s", names(r))
	}
	// update publishes svc n times and returns how long the other node
	// took to receive each, and what the cache looked at per update.
	update := func(svc string, n int) (lat []time.Duration, scanned []int64) {
		t.Helper()
		for range n {
			before := s.XDS.Scanned()
			start := time.Now()
			v := publish(svc)
			r := other.recv()
			lat = append(lat, time.Since(start))
			if want := fmt.Sprintf("ClusterLoadAssignment/%s@%d", svc, v); names(r) != want {
				t.Fatalf("the other node was sent %s, want %s", names(r), want)
			}
			holds(t, s)
			scanned = append(scanned, s.XDS.Scanned()-before)
		}
		return lat, scanned
	}
	const rounds = 15
	baseAPI, baseAPIScan := update("api", rounds)
	baseWeb, baseWebScan := update("web", rounds)

	// The subscriber: workload web, a million names on a delta stream
	// (web among them), a quarter million on a state-of-the-world one.
	heap0 := heapInUse()
	key := ""
	million := manyNames("m", 0, 1_000_000)
	million[0] = "web"
	var want int64
	for _, n := range million {
		want += xds.NameCost(n)
	}
	sotwNames := append(manyNames("q", 0, 249_999), "web")
	for _, n := range sotwNames {
		want += xds.NameCost(n)
	}
	conn := rawConn(t, s.XDSAddr, s.Token(t, apptest.Web))
	ad := openDelta(t, conn)
	for chunk := range slices.Chunk(million, 100_000) {
		ad.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: chunk})
	}
	as := openSotW(t, conn)
	as.send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: sotwNames})
	wait.For(t, 20*time.Second, "the subscriber holding its 1,250,000 names", func() bool {
		var h xds.Held
		key, h = heldBy(s, "workload:web")
		return h.NameBytes == want
	})
	million, sotwNames = nil, nil
	// Its clients read what they are sent, as Envoy would.
	for _, recv := range []func() error{
		func() error { _, err := ad.s.Recv(); return err },
		func() error { _, err := as.s.Recv(); return err },
	} {
		go func() {
			for recv() == nil {
			}
		}()
	}
	heap1 := heapInUse()
	t.Logf("the subscriber's 1,250,000 names: %d bytes accounted (%.0f a name), the heap grew %d KiB (%.0f bytes a name)",
		want, float64(want)/1.25e6, (heap1-heap0)>>10, float64(heap1-heap0)/1.25e6)

	attAPI, attAPIScan := update("api", rounds)
	attWeb, attWebScan := update("web", rounds)
	if !slices.Equal(attAPIScan, baseAPIScan) {
		t.Errorf("per update of api (the other node's alone) the cache looked at %v, before the subscriber %v", attAPIScan, baseAPIScan)
	}
	for i, n := range attWebScan {
		// web's updates also reach the subscriber's node: its one
		// service's resources and its two streams, never its names.
		if n-baseWebScan[i] > 16 {
			t.Errorf("per update of web the cache looked at %v, before the subscriber %v", attWebScan, baseWebScan)
			break
		}
	}

	// Every stream of the subscriber locked, as while it takes a request
	// of a million names: the other node's updates go through all the
	// same.
	release := s.XDS.HoldStreams(key)
	for _, svc := range []string{"web", "api"} {
		v := publish(svc)
		if r := other.recv(); names(r) != fmt.Sprintf("ClusterLoadAssignment/%s@%d", svc, v) {
			release()
			t.Fatalf("with the subscriber's streams locked the other node was sent %s", names(r))
		}
	}
	release()

	med := func(d []time.Duration) time.Duration {
		c := slices.Clone(d)
		slices.Sort(c)
		return c[len(c)/2]
	}
	t.Logf("the other node's update, hub to client (median, max of %d): api %s, %s before; %s, %s beside 1,250,000 names",
		rounds, med(baseAPI), slices.Max(baseAPI), med(attAPI), slices.Max(attAPI))
	t.Logf("the other node's update of web, which the subscriber sees too: %s, %s before; %s, %s beside",
		med(baseWeb), slices.Max(baseWeb), med(attWeb), slices.Max(attWeb))
	t.Logf("resources and streams the cache looked at per update: api %v before, %v beside; web %v before, %v beside",
		baseAPIScan[0], attAPIScan[0], baseWebScan[0], attWebScan[0])
}
