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
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

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
	// Both calls retried are safe to repeat: the PUT is idempotent, and
	// registering the same endpoint again replaces the first
	// registration.
	retry503 := func(call func() error) error { return retryUnavailable(ctx, timeout, call) }
	if err := retry503(func() error {
		return apiCall(ctx, client, "PUT", base+"/v1/services/"+lgXDSService, admin, []byte(`{"owner":"loadgen","capabilities":[]}`), nil)
	}); err != nil {
		return fmt.Errorf("create %s: %w", lgXDSService, err)
	}
	// Each change is a new instance; a stream has the change once an
	// assignment it received lists the instance's address (view versions
	// also move for other reasons: slow-start weights).
	address := func(i int) string { return fmt.Sprintf("10.250.%d.%d", (i-first)/250, (i-first)%250+1) }
	register := func(i int) error {
		body := fmt.Sprintf(`{"address":%q,"port":8080,"zone":"az%d"}`, address(i), i%3+1)
		return retry503(func() error {
			return apiCall(ctx, client, "POST", base+"/v1/services/"+lgXDSService+"/instances", admin, []byte(body), nil)
		})
	}
	if err := register(first); err != nil {
		return fmt.Errorf("register: %w", err)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cc := make([]*grpc.ClientConn, conns)
	for i := range cc {
		if cc[i], err = grpc.NewClient(xdsAddr, lgXDSDialOptions(workload)...); err != nil {
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
	// stream carries lgRawMsg (and, with --decode proto, typed
	// messages); in, out, resp and next are the receiving goroutine's,
	// reused from response to response (out's bytes are not: see
	// lgRawCodec.Marshal).
	stream  grpc.ClientStream
	in, out lgRawMsg
	resp    lgResponse
	next    lgListing
	// watch, when set (--withdrawals), is told when an endpoint leaves
	// this stream's assignment.
	watch *lgWithdrawalWatch
	// fullDecode: decode responses and assignments with protobuf-go's
	// Unmarshal (--decode proto) rather than by walking their encoding.
	fullDecode bool

	mu sync.Mutex
	// states is every endpoint an assignment has listed, in the order
	// first listed; index finds one by its key (its SocketAddress's
	// encoding with --decode wire, address:port with proto), byEP by
	// endpoint. marks holds, apart from the states so that taking an
	// assignment touches a few contiguous bytes per endpoint rather than
	// each endpoint's state, the last assignment (gen) listing each and
	// its health there; gen counts the assignments taken.
	states []lgEndpointState
	marks  []lgMark
	index  map[string]int32
	byEP   map[lgEndpoint]int32
	gen    uint32
	// cur is the latest assignment's endpoints in its order: an
	// endpoint is looked for there first, a few places on from the last
	// one found, since an assignment lists its endpoints in the same
	// order each time.
	cur lgListing
	err error
}

// lgEndpointState is what a stream knows of one endpoint.
type lgEndpointState struct {
	ep   lgEndpoint
	seen time.Time // the first assignment listing it
	lost time.Time // when it last went missing (read while not listed)
}

// lgMark is the last assignment listing an endpoint, and its health
// there.
type lgMark struct {
	gen    uint32
	health core.HealthStatus
}

// lgListing is an assignment's endpoints in its order: their keys,
// end to end in keys (each ending at ends), their health, and (once
// taken) their states' indexes (-1: a key that does not decode).
type lgListing struct {
	keys   []byte
	ends   []int32
	health []core.HealthStatus
	idx    []int32
}

func (l *lgListing) reset() {
	l.keys, l.ends, l.health, l.idx = l.keys[:0], l.ends[:0], l.health[:0], l.idx[:0]
}

func (l *lgListing) add(key []byte, health core.HealthStatus) {
	l.keys = append(l.keys, key...)
	l.ends = append(l.ends, int32(len(l.keys)))
	l.health = append(l.health, health)
}

// key is endpoint i's key.
func (l *lgListing) key(i int) []byte {
	start := int32(0)
	if i > 0 {
		start = l.ends[i-1]
	}
	return l.keys[start:l.ends[i]]
}

// lgEndpoint is an endpoint's address and port.
type lgEndpoint struct {
	addr string
	port uint32
}

func (e lgEndpoint) String() string { return net.JoinHostPort(e.addr, strconv.Itoa(int(e.port))) }

// lgWithdrawalWatch counts the streams whose assignment still lists the
// endpoint being withdrawn; done is closed when none does. Every stream
// tells it of each endpoint that leaves, so the count is an atomic one
// (a lock every stream takes at once would be contended).
type lgWithdrawalWatch struct {
	cur atomic.Pointer[lgWithdrawal]
}

// lgWithdrawal is one withdrawal's count.
type lgWithdrawal struct {
	ep        lgEndpoint
	remaining atomic.Int64
	done      chan struct{}
}

// expect starts counting ep's withdrawal from n streams.
func (w *lgWithdrawalWatch) expect(ep lgEndpoint, n int) <-chan struct{} {
	d := &lgWithdrawal{ep: ep, done: make(chan struct{})}
	d.remaining.Store(int64(n))
	w.cur.Store(d)
	return d.done
}

// left notes that ep left one stream's assignment.
func (w *lgWithdrawalWatch) left(ep lgEndpoint) {
	if d := w.cur.Load(); d != nil && ep == d.ep && d.remaining.Add(-1) == 0 {
		close(d.done)
	}
}

// open opens the stream and subscribes to the service's assignment; it
// returns the stream's first error (an admission refusal arrives as the
// first receive's error, so open waits for the first response). The
// first request goes through gRPC's proto codec; the responses and ACKs
// are lgRawMsg.
func (s *lgXDSStream) open(ctx context.Context, c discovery.AggregatedDiscoveryServiceClient) error {
	var first proto.Message
	if s.delta {
		st, err := c.DeltaAggregatedResources(ctx, lgRawStream)
		if err != nil {
			return err
		}
		s.stream, first = st, &discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{s.service}}
	} else {
		st, err := c.StreamAggregatedResources(ctx, lgRawStream)
		if err != nil {
			return err
		}
		s.stream, first = st, &discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{s.service}}
	}
	if err := s.stream.SendMsg(first); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return s.recv()
}

// recv takes one response, notes when each address first arrived in an
// assignment, and ACKs it.
func (s *lgXDSStream) recv() error {
	if s.fullDecode {
		return s.recvProto()
	}
	if err := s.stream.RecvMsg(&s.in); err != nil {
		return err
	}
	defer s.in.free()
	at := time.Now()
	r := &s.resp
	decode := decodeResponse
	if s.delta {
		decode = decodeDeltaResponse
	}
	if err := decode(s.in.b, r); err != nil {
		return fmt.Errorf("xDS response: %w", err)
	}
	for _, res := range r.resources {
		s.note(res, at)
	}
	s.out.b = s.ack(r)
	return s.stream.SendMsg(&s.out)
}

// ack is the encoded ACK of response r, in bytes of its own.
func (s *lgXDSStream) ack(r *lgResponse) []byte {
	if s.delta {
		return appendDeltaACK(make([]byte, 0, stringSize(fieldDeltaReqTypeURL, r.typeURL)+stringSize(fieldDeltaReqNonce, r.nonce)), r.typeURL, r.nonce)
	}
	return appendACK(make([]byte, 0, stringSize(fieldReqVersion, r.version)+protowire.SizeTag(fieldReqNames)+protowire.SizeBytes(len(s.service))+
		stringSize(fieldReqTypeURL, r.typeURL)+stringSize(fieldReqNonce, r.nonce)), r.typeURL, s.service, r.version, r.nonce)
}

// recvProto is recv with --decode proto: protobuf-go builds the response
// and marshals the ACK.
func (s *lgXDSStream) recvProto() error {
	if s.delta {
		var r discovery.DeltaDiscoveryResponse
		if err := s.stream.RecvMsg(&r); err != nil {
			return err
		}
		at := time.Now()
		for _, res := range r.GetResources() {
			s.note(res.GetResource().GetValue(), at)
		}
		return s.stream.SendMsg(&discovery.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()})
	}
	var r discovery.DiscoveryResponse
	if err := s.stream.RecvMsg(&r); err != nil {
		return err
	}
	at := time.Now()
	for _, res := range r.GetResources() {
		s.note(res.GetValue(), at)
	}
	return s.stream.SendMsg(&discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResourceNames: []string{s.service}, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()})
}

// note takes an encoded assignment received at at: it decodes every
// endpoint (into next, without the lock), then marks each listed, new
// ones seen and those the latest assignment listed and this one does not
// lost. An assignment that does not decode is not taken.
func (s *lgXDSStream) note(a []byte, at time.Time) {
	next := &s.next
	next.reset()
	if s.fullDecode {
		var cla endpoint.ClusterLoadAssignment
		if proto.Unmarshal(a, &cla) != nil {
			return
		}
		for _, loc := range cla.GetEndpoints() {
			for _, e := range loc.GetLbEndpoints() {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				next.add([]byte(lgEndpoint{sa.GetAddress(), sa.GetPortValue()}.String()), e.GetHealthStatus())
			}
		}
	} else if decodeAssignmentWire(a, next) != nil {
		return
	}

	var left []lgEndpoint
	s.mu.Lock()
	if s.index == nil {
		s.index, s.byEP = map[string]int32{}, map[lgEndpoint]int32{}
	}
	g := s.gen + 1
	cur, cursor := &s.cur, 0
	for k := range next.ends {
		key, i := next.key(k), int32(-1)
		for j := cursor; j < len(cur.ends) && j <= cursor+2; j++ {
			if string(cur.key(j)) == string(key) {
				i, cursor = cur.idx[j], j+1
				break
			}
		}
		if i < 0 {
			i = s.take(key, at)
		}
		next.idx = append(next.idx, i)
		if i >= 0 {
			s.marks[i] = lgMark{g, next.health[k]}
		}
	}
	for _, i := range cur.idx {
		// Listed by the last assignment, not this one; marked with an
		// older assignment once found, in case it was listed twice.
		if i >= 0 && s.marks[i].gen == s.gen {
			s.marks[i].gen = s.gen - 1
			s.states[i].lost = at
			left = append(left, s.states[i].ep)
		}
	}
	s.gen, s.cur, s.next = g, *next, *cur
	s.mu.Unlock()
	if s.watch != nil {
		for _, ep := range left {
			s.watch.left(ep)
		}
	}
}

// take is the state of the endpoint key names (-1: the key does not
// decode), a new one seen at at.
func (s *lgXDSStream) take(key []byte, at time.Time) int32 {
	if i, ok := s.index[string(key)]; ok { // no copy of the key to look it up
		return i
	}
	var ep lgEndpoint
	if s.fullDecode {
		host, port, err := net.SplitHostPort(string(key))
		if err != nil {
			return -1
		}
		p, _ := strconv.ParseUint(port, 10, 32)
		ep = lgEndpoint{host, uint32(p)}
	} else {
		var err error
		if ep, err = socketAddress(key); err != nil {
			return -1
		}
	}
	i := int32(len(s.states))
	s.states = append(s.states, lgEndpointState{ep: ep, seen: at})
	s.marks = append(s.marks, lgMark{})
	s.index[string(key)], s.byEP[ep] = i, i
	return i
}

// current is the endpoints the latest assignment lists, with their
// health.
func (s *lgXDSStream) current() map[lgEndpoint]core.HealthStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[lgEndpoint]core.HealthStatus{}
	for ep, i := range s.byEP {
		if m := s.marks[i]; m.gen == s.gen {
			out[ep] = m.health
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
	i, ok := s.byEP[ep]
	return ok && s.marks[i].gen == s.gen && s.marks[i].health == core.HealthStatus_HEALTHY
}

// withdrawn is when endpoint ep left the stream's latest assignment (zero:
// it is still there, or never was).
func (s *lgXDSStream) withdrawn(ep lgEndpoint) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.byEP[ep]
	if !ok || s.marks[i].gen == s.gen {
		return time.Time{}
	}
	return s.states[i].lost
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
	for ep, i := range s.byEP {
		if seen := s.states[i].seen; ep.addr == addr && (first.IsZero() || seen.Before(first)) {
			first = seen
		}
	}
	return first
}

func (s *lgXDSStream) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// lgEnvoyWindow is Envoy's default initial HTTP/2 stream and connection
// flow-control window (256 MiB, http2_protocol_options).
const lgEnvoyWindow = 256 << 20

// lgXDSDialOptions are the options of the load generator's xDS
// connections, which stand for sidecars: Envoy's HTTP/2 windows (so the
// client sends no WINDOW_UPDATE round trips, and no BDP pings, that an
// Envoy would not), a read buffer that takes a burst of 100 streams'
// assignments in few reads, and the workload's token.
func lgXDSDialOptions(token string) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearerCreds(token)),
		grpc.WithStaticStreamWindowSize(lgEnvoyWindow),
		grpc.WithStaticConnWindowSize(lgEnvoyWindow),
		grpc.WithReadBufferSize(256 << 10),
	}
}

// bearerCreds sends a token on every call.
type bearerCreds string

func (t bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}
func (bearerCreds) RequireTransportSecurity() bool { return false }

// retryUnavailable makes call again while it is answered 503 (muster's
// database slow to answer, which the API says to retry), every 250 ms
// for up to within, as a workload would; the figures then include the
// wait. Only for calls that are safe to repeat.
func retryUnavailable(ctx context.Context, within time.Duration, call func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := call()
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
