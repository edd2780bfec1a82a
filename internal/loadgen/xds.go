package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
)

// lgXDSPrefix names the services loadgen xds creates and changes, one per
// run.
const lgXDSPrefix = "lgxds-"

// loadgenXDS holds --clients ADS streams (state of the world, or delta
// with --delta) subscribed to one service's assignment, makes --changes
// changes to it (a new instance each, --interval apart) and prints, per
// change, how long from the API call until every stream had the new view
// version, then p50/p99 over the changes and over every delivery. With
// --withdrawals it times hard failures instead (loadgenXDSWithdrawals).
func loadgenXDS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		base, xdsAddr, dir string
		clients, changes   int
		conns              int
		interval, timeout  time.Duration
		delta, withdrawals bool
		instances          int
		cpuProfile, decode string
	)
	fs := cli.NewFlags("loadgen xds", stderr)
	fs.StringVar(&base, "url", "http://127.0.0.1:8080", "muster dev's API")
	fs.StringVar(&xdsAddr, "xds", "127.0.0.1:18000", "muster dev's xDS address")
	fs.StringVar(&dir, "data", ".muster", "dev data folder, for minting tokens")
	fs.IntVar(&clients, "clients", 1000, "ADS streams to hold")
	fs.IntVar(&conns, "conns", 10, "gRPC connections the streams share")
	fs.IntVar(&changes, "changes", 20, "changes to time")
	fs.DurationVar(&interval, "interval", 2*time.Second, "time between changes")
	fs.DurationVar(&timeout, "timeout", 30*time.Second, "give up on a change (or the connect) after this long")
	fs.BoolVar(&delta, "delta", false, "delta xDS (DeltaAggregatedResources) instead of state of the world")
	fs.BoolVar(&withdrawals, "withdrawals", false, "time withdrawals (hard failures of routable instances, reported by a prober) instead of additions")
	fs.IntVar(&instances, "instances", 60, "with --withdrawals: the service's instances (--changes may withdraw at most a third)")
	fs.StringVar(&decode, "decode", "wire", "how each stream decodes an assignment: wire (walks its encoding for every endpoint's address, port and health) or proto (protobuf-go's Unmarshal, which allocates every nested message)")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "with --withdrawals: write a CPU profile of this client over the withdrawals to this file")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if decode != "wire" && decode != "proto" {
		fmt.Fprintf(stderr, "muster loadgen xds: --decode %q: wire or proto\n", decode)
		return cli.ErrUsage
	}
	if clients < 1 || conns < 1 || changes < 1 || interval <= 0 || timeout <= 0 {
		fmt.Fprintln(stderr, "muster loadgen xds: --clients, --conns, --changes, --interval and --timeout must be positive")
		return cli.ErrUsage
	}
	base = strings.TrimRight(base, "/")
	if withdrawals {
		return loadgenXDSWithdrawals(ctx, lgXDSOptions{base: base, xdsAddr: xdsAddr, dir: dir, clients: clients, conns: conns,
			changes: changes, instances: instances, interval: interval, timeout: timeout, delta: delta, cpuProfile: cpuProfile, fullDecode: decode == "proto"}, stdout, stderr)
	}
	// A service of its own per run, its instances numbered from first.
	first := int(time.Now().Unix() % 100000)
	lgXDSService := lgXDSPrefix + strconv.Itoa(first)
	iss, err := devissuer.LoadOrCreate(dir)
	if err != nil {
		return err
	}
	admin, err := iss.Mint(devissuer.TokenRequest{Kind: identity.KindTool, Subject: "loadgen", Role: identity.RoleAdmin, TTL: 2 * time.Hour}, time.Now())
	if err != nil {
		return err
	}
	workload, err := iss.Mint(devissuer.TokenRequest{Kind: identity.KindWorkload, Service: lgXDSService, TTL: 2 * time.Hour}, time.Now())
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 30 * time.Second}
	if err := apiCall(ctx, client, "PUT", base+"/v1/services/"+lgXDSService, admin, []byte(`{"owner":"loadgen","capabilities":[]}`), nil); err != nil {
		return fmt.Errorf("create %s: %w", lgXDSService, err)
	}
	// Each change is a new instance; a stream has the change once an
	// assignment it received lists the instance's address (view versions
	// also move for other reasons: slow-start weights).
	address := func(i int) string { return fmt.Sprintf("10.250.%d.%d", (i-first)/250, (i-first)%250+1) }
	// A registration answered 503 (muster's database slow to answer,
	// which the API says to retry) is tried again, as a workload would,
	// within the timeout; the figures then include the wait. Registering
	// the same endpoint again is safe: a second registration replaces
	// the first.
	register := func(i int) error {
		body := fmt.Sprintf(`{"address":%q,"port":8080,"zone":"az%d"}`, address(i), i%3+1)
		deadline := time.Now().Add(timeout)
		for {
			err := apiCall(ctx, client, "POST", base+"/v1/services/"+lgXDSService+"/instances", admin, []byte(body), nil)
			if err == nil || !strings.Contains(err.Error(), ": 503 ") || time.Now().After(deadline) {
				return err
			}
			select {
			case <-ctx.Done():
				return err
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	if err := register(first); err != nil {
		return fmt.Errorf("register: %w", err)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cc := make([]*grpc.ClientConn, conns)
	for i := range cc {
		if cc[i], err = grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearerCreds(workload))); err != nil {
			return err
		}
		defer cc[i].Close()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	start := time.Now()
	streams, refused, err := openXDSStreams(ctx, &wg, cc, clients, delta, lgXDSService, timeout, func(s *lgXDSStream) { s.fullDecode = decode == "proto" })
	if err != nil {
		return err
	}
	if err := waitAll(ctx, streams, address(first), start, timeout); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	fmt.Fprintf(stdout, "%d %s ADS streams over %d connections hold %s (connected in %s, %d admission refusals)\n",
		clients, map[bool]string{false: "state-of-the-world", true: "delta"}[delta], conns, lgXDSService,
		time.Since(start).Round(time.Millisecond), refused)

	var toAll, toFirst []time.Duration
	var deliveries []time.Duration
	for k := range changes {
		t0 := time.Now()
		addr := address(first + 1 + k)
		if err := register(first + 1 + k); err != nil {
			return fmt.Errorf("change %d: %w", k+1, err)
		}
		if err := waitAll(ctx, streams, addr, t0, timeout); err != nil {
			return fmt.Errorf("change %d: %w", k+1, err)
		}
		var lo, hi time.Duration
		for i, s := range streams {
			d := s.arrival(addr).Sub(t0)
			deliveries = append(deliveries, d)
			if i == 0 || d < lo {
				lo = d
			}
			hi = max(hi, d)
		}
		toFirst, toAll = append(toFirst, lo), append(toAll, hi)
		fmt.Fprintf(stdout, "change %2d: %-14s first stream %8s  all %d streams %8s\n", k+1, addr, lo.Round(100*time.Microsecond), clients, hi.Round(100*time.Microsecond))
		if k+1 < changes {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(interval): // pacing between changes
			}
		}
	}
	q := func(ds []time.Duration, f float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(f*float64(len(s))))].Round(100 * time.Microsecond)
	}
	fmt.Fprintf(stdout, "time to all %d streams, from the API call (%d changes): p50 %s  p99 %s  max %s\n", clients, changes, q(toAll, .5), q(toAll, .99), q(toAll, 1))
	fmt.Fprintf(stdout, "time to the first stream: p50 %s  p99 %s\n", q(toFirst, .5), q(toFirst, .99))
	spread := make([]time.Duration, len(toAll))
	for i := range toAll {
		spread[i] = toAll[i] - toFirst[i]
	}
	fmt.Fprintf(stdout, "fan-out, first stream to last: p50 %s  p99 %s\n", q(spread, .5), q(spread, .99))
	fmt.Fprintf(stdout, "every delivery (%d): p50 %s  p99 %s\n", len(deliveries), q(deliveries, .5), q(deliveries, .99))
	return nil
}

// openXDSStreams opens n streams over cc (round-robin), each receiving in
// a goroutine of wg until ctx ends, retrying admission refusals (paced)
// for up to timeout. It returns the streams and the refusals met.
func openXDSStreams(ctx context.Context, wg *sync.WaitGroup, cc []*grpc.ClientConn, n int, delta bool, service string, timeout time.Duration, configure func(*lgXDSStream)) ([]*lgXDSStream, int, error) {
	streams := make([]*lgXDSStream, n)
	refused := 0
	start := time.Now()
	for i := range streams {
		streams[i] = &lgXDSStream{delta: delta, service: service}
		if configure != nil {
			configure(streams[i])
		}
		for {
			err := streams[i].open(ctx, discovery.NewAggregatedDiscoveryServiceClient(cc[i%len(cc)]))
			if err == nil {
				break
			}
			if status.Code(err) != codes.ResourceExhausted || time.Since(start) > timeout {
				return nil, refused, fmt.Errorf("open stream %d: %w (for 1,000 streams, run muster dev with MUSTER_ADMISSION_FLOOR=100000)", i, err)
			}
			refused++
			time.Sleep(100 * time.Millisecond) // admission's retry: paced, bounded by --timeout
		}
		wg.Go(func() { streams[i].run(ctx) })
	}
	return streams, refused, nil
}

// waitAll waits until every stream has seen addr.
func waitAll(ctx context.Context, streams []*lgXDSStream, addr string, t0 time.Time, timeout time.Duration) error {
	deadline := t0.Add(timeout)
	for {
		missing := 0
		var failed error
		for _, s := range streams {
			if s.arrival(addr).IsZero() {
				missing++
				failed = cmpOrErr(failed, s.failed())
			}
		}
		if missing == 0 {
			return nil
		}
		if failed != nil {
			return fmt.Errorf("a stream failed: %w", failed)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d streams lack %s after %s", missing, len(streams), addr, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond): // polling with a deadline
		}
	}
}

func cmpOrErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// lgXDSStream is one ADS stream and when each address first reached it.
type lgXDSStream struct {
	delta   bool
	service string
	sotw    grpc.BidiStreamingClient[discovery.DiscoveryRequest, discovery.DiscoveryResponse]
	dlt     grpc.BidiStreamingClient[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]
	// watch, when set (--withdrawals), is told when an endpoint leaves
	// this stream's assignment.
	watch *lgWithdrawalWatch
	// fullDecode: decode assignments with protobuf-go's Unmarshal
	// (--decode proto) rather than by walking their encoding.
	fullDecode bool

	mu sync.Mutex
	// eps is every endpoint an assignment has listed, by its
	// SocketAddress's encoding (--decode wire) or address:port (proto),
	// and byEP the same by endpoint; gen counts the assignments taken.
	eps  map[string]*lgEndpointState
	byEP map[lgEndpoint]*lgEndpointState
	gen  uint32
	// order is the endpoints of the latest assignment in its order
	// (spare the slice the next one is built in): an endpoint is looked
	// for there first, a few places on from the last one found, since an
	// assignment lists its endpoints in the same order each time.
	order, spare []*lgEndpointState
	err          error
}

// lgEndpointState is what a stream knows of one endpoint.
type lgEndpointState struct {
	key    string // its key in eps
	ep     lgEndpoint
	health core.HealthStatus // in the last assignment listing it
	gen    uint32            // the last assignment listing it
	seen   time.Time         // the first assignment listing it
	lost   time.Time         // when it went missing (zero while listed)
}

// lgEndpoint is an endpoint's address and port.
type lgEndpoint struct {
	addr string
	port uint32
}

func (e lgEndpoint) String() string { return net.JoinHostPort(e.addr, strconv.Itoa(int(e.port))) }

// lgWithdrawalWatch counts the streams whose assignment still lists the
// endpoint being withdrawn; done is closed when none does.
type lgWithdrawalWatch struct {
	mu        sync.Mutex
	ep        lgEndpoint
	remaining int
	done      chan struct{}
}

// expect starts counting ep's withdrawal from n streams.
func (w *lgWithdrawalWatch) expect(ep lgEndpoint, n int) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ep, w.remaining, w.done = ep, n, make(chan struct{})
	return w.done
}

// left notes that ep left one stream's assignment.
func (w *lgWithdrawalWatch) left(ep lgEndpoint) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ep != w.ep || w.remaining == 0 {
		return
	}
	if w.remaining--; w.remaining == 0 {
		close(w.done)
	}
}

// open opens the stream and subscribes to the service's assignment; it
// returns the stream's first error (an admission refusal arrives as the
// first receive's error, so open waits for the first response).
func (s *lgXDSStream) open(ctx context.Context, c discovery.AggregatedDiscoveryServiceClient) error {
	var err error
	if s.delta {
		if s.dlt, err = c.DeltaAggregatedResources(ctx); err != nil {
			return err
		}
		if err := s.dlt.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{s.service}}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		return s.recv()
	}
	if s.sotw, err = c.StreamAggregatedResources(ctx); err != nil {
		return err
	}
	if err := s.sotw.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{s.service}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return s.recv()
}

// recv takes one response, notes when each address first arrived in an
// assignment, and ACKs it.
func (s *lgXDSStream) recv() error {
	if s.delta {
		r, err := s.dlt.Recv()
		if err != nil {
			return err
		}
		at := time.Now()
		for _, res := range r.GetResources() {
			s.note(res.GetResource(), at)
		}
		return s.dlt.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()})
	}
	r, err := s.sotw.Recv()
	if err != nil {
		return err
	}
	at := time.Now()
	for _, res := range r.GetResources() {
		s.note(res, at)
	}
	return s.sotw.Send(&discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResourceNames: []string{s.service}, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()})
}

func (s *lgXDSStream) note(a *anypb.Any, at time.Time) {
	var left []lgEndpoint
	s.mu.Lock()
	if s.eps == nil {
		s.eps, s.byEP = map[string]*lgEndpointState{}, map[lgEndpoint]*lgEndpointState{}
	}
	g := s.gen + 1
	order, cursor := s.spare[:0], 0
	// take notes that key (an endpoint's, decode decodes it) is listed.
	take := func(key []byte, decode func() (lgEndpoint, error), health core.HealthStatus) {
		var st *lgEndpointState
		for k := cursor; k < len(s.order) && k <= cursor+2; k++ {
			if s.order[k].key == string(key) {
				st, cursor = s.order[k], k+1
				break
			}
		}
		if st == nil {
			st = s.eps[string(key)] // no copy of the key to look it up
		}
		if st == nil {
			ep, err := decode()
			if err != nil {
				return
			}
			st = &lgEndpointState{key: string(key), ep: ep, seen: at}
			s.eps[st.key], s.byEP[ep] = st, st
		}
		st.gen, st.health, st.lost = g, health, time.Time{}
		order = append(order, st)
	}
	if s.fullDecode {
		var cla endpoint.ClusterLoadAssignment
		if a.UnmarshalTo(&cla) != nil {
			s.mu.Unlock()
			return
		}
		for _, loc := range cla.GetEndpoints() {
			for _, e := range loc.GetLbEndpoints() {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				ep := lgEndpoint{sa.GetAddress(), sa.GetPortValue()}
				take([]byte(ep.String()), func() (lgEndpoint, error) { return ep, nil }, e.GetHealthStatus())
			}
		}
	} else if err := decodeAssignmentWire(a.GetValue(), func(sa []byte, health core.HealthStatus) {
		take(sa, func() (lgEndpoint, error) { return socketAddress(sa) }, health)
	}); err != nil {
		s.mu.Unlock()
		return
	}
	for _, st := range s.order {
		if st.gen != g { // listed by the last assignment, not this one
			st.lost = at
			left = append(left, st.ep)
		}
	}
	s.gen, s.order, s.spare = g, order, s.order
	s.mu.Unlock()
	if s.watch != nil {
		for _, ep := range left {
			s.watch.left(ep)
		}
	}
}

// current is the endpoints the latest assignment lists, with their
// health.
func (s *lgXDSStream) current() map[lgEndpoint]core.HealthStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[lgEndpoint]core.HealthStatus{}
	for ep, st := range s.byEP {
		if st.gen == s.gen {
			out[ep] = st.health
		}
	}
	return out
}

// healthy says whether the stream's latest assignment lists endpoint ep
// as HEALTHY (eligible; not merely health-unknown, which is routable too
// but which a hard failure alone does not withdraw).
func (s *lgXDSStream) healthy(ep lgEndpoint) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.byEP[ep]
	return st != nil && st.gen == s.gen && st.health == core.HealthStatus_HEALTHY
}

// withdrawn is when endpoint ep left the stream's latest assignment (zero:
// it is still there, or never was).
func (s *lgXDSStream) withdrawn(ep lgEndpoint) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.byEP[ep]
	if st == nil || st.gen == s.gen {
		return time.Time{}
	}
	return st.lost
}

func (s *lgXDSStream) run(ctx context.Context) {
	for ctx.Err() == nil {
		if err := s.recv(); err != nil {
			if ctx.Err() == nil {
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
			}
			return
		}
	}
}

// arrival is when addr first reached the stream (zero: not yet).
func (s *lgXDSStream) arrival(addr string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var first time.Time
	for ep, st := range s.byEP {
		if ep.addr == addr && (first.IsZero() || st.seen.Before(first)) {
			first = st.seen
		}
	}
	return first
}

func (s *lgXDSStream) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// bearerCreds sends a token on every call.
type bearerCreds string

func (t bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}
func (bearerCreds) RequireTransportSecurity() bool { return false }
