package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
)

// lgXDSService is the service loadgen xds creates and changes.
const lgXDSService = "lgxds"

// loadgenXDS holds --clients ADS streams (state of the world, or delta
// with --delta) subscribed to one service's assignment, makes --changes
// changes to it (a new instance each, --interval apart) and prints, per
// change, how long from the API call until every stream had the new view
// version, then p50/p99 over the changes and over every delivery.
func loadgenXDS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		base, xdsAddr, dir string
		clients, changes   int
		conns              int
		interval, timeout  time.Duration
		delta              bool
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
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if clients < 1 || conns < 1 || changes < 1 || interval <= 0 || timeout <= 0 {
		fmt.Fprintln(stderr, "muster loadgen xds: --clients, --conns, --changes, --interval and --timeout must be positive")
		return cli.ErrUsage
	}
	base = strings.TrimRight(base, "/")
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
	register := func(i int) error {
		body := fmt.Sprintf(`{"address":"10.250.%d.%d","port":8080,"zone":"az%d"}`, i/250, i%250+1, i%3+1)
		return apiCall(ctx, client, "POST", base+"/v1/services/"+lgXDSService+"/instances", admin, []byte(body), nil)
	}
	// A run of its own: instance numbers past what earlier runs took.
	first := int(time.Now().Unix() % 10000 * 10)
	if err := register(first); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	version := func() (uint64, error) {
		var v struct{ Version uint64 }
		err := apiCall(ctx, client, "GET", base+"/v1/resolve/"+lgXDSService, admin, nil, &v)
		return v.Version, err
	}
	v0, err := waitVersion(ctx, version, 0, timeout)
	if err != nil {
		return err
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
	streams := make([]*lgXDSStream, clients)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	refused := 0
	start := time.Now()
	for i := range streams {
		streams[i] = &lgXDSStream{delta: delta}
		for {
			err := streams[i].open(ctx, discovery.NewAggregatedDiscoveryServiceClient(cc[i%conns]))
			if err == nil {
				break
			}
			if status.Code(err) != codes.ResourceExhausted || time.Since(start) > timeout {
				return fmt.Errorf("open stream %d: %w (for 1,000 streams, run muster dev with MUSTER_ADMISSION_FLOOR=100000)", i, err)
			}
			refused++
			time.Sleep(100 * time.Millisecond) // admission's retry: paced, bounded by --timeout
		}
		wg.Go(func() { streams[i].run(ctx) })
	}
	if err := waitAll(ctx, streams, v0, start, timeout); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	fmt.Fprintf(stdout, "%d %s ADS streams over %d connections hold %s v%d (connected in %s, %d admission refusals)\n",
		clients, map[bool]string{false: "state-of-the-world", true: "delta"}[delta], conns, lgXDSService, v0,
		time.Since(start).Round(time.Millisecond), refused)

	var toAll, toFirst []time.Duration
	var deliveries []time.Duration
	prev := v0
	for k := range changes {
		t0 := time.Now()
		if err := register(first + 1 + k); err != nil {
			return fmt.Errorf("change %d: %w", k+1, err)
		}
		v, err := waitVersion(ctx, version, prev, timeout)
		if err != nil {
			return fmt.Errorf("change %d: %w", k+1, err)
		}
		prev = v
		if err := waitAll(ctx, streams, v, t0, timeout); err != nil {
			return fmt.Errorf("change %d: %w", k+1, err)
		}
		var lo, hi time.Duration
		for i, s := range streams {
			d := s.arrival(v).Sub(t0)
			deliveries = append(deliveries, d)
			if i == 0 || d < lo {
				lo = d
			}
			hi = max(hi, d)
		}
		toFirst, toAll = append(toFirst, lo), append(toAll, hi)
		fmt.Fprintf(stdout, "change %2d: v%d  first stream %8s  all %d streams %8s\n", k+1, v, lo.Round(100*time.Microsecond), clients, hi.Round(100*time.Microsecond))
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

// waitVersion polls the resolve API until the view version passes after
// (a change is published after the addition window).
func waitVersion(ctx context.Context, version func() (uint64, error), after uint64, timeout time.Duration) (uint64, error) {
	deadline := time.Now().Add(timeout)
	for {
		v, err := version()
		if err == nil && v > after {
			return v, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no view of %s past v%d within %s (last error: %v)", lgXDSService, after, timeout, err)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond): // polling with a deadline
		}
	}
}

// waitAll waits until every stream holds version v.
func waitAll(ctx context.Context, streams []*lgXDSStream, v uint64, t0 time.Time, timeout time.Duration) error {
	deadline := t0.Add(timeout)
	for {
		missing := 0
		var failed error
		for _, s := range streams {
			if s.arrival(v).IsZero() {
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
			return fmt.Errorf("%d of %d streams lack v%d after %s", missing, len(streams), v, timeout)
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

// lgXDSStream is one ADS stream and when each view version reached it.
type lgXDSStream struct {
	delta bool
	sotw  grpc.BidiStreamingClient[discovery.DiscoveryRequest, discovery.DiscoveryResponse]
	dlt   grpc.BidiStreamingClient[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]

	mu   sync.Mutex
	seen []lgArrival // in arrival order; versions increase
	err  error
}

type lgArrival struct {
	version uint64
	at      time.Time
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
		if err := s.dlt.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{lgXDSService}}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		return s.recv()
	}
	if s.sotw, err = c.StreamAggregatedResources(ctx); err != nil {
		return err
	}
	if err := s.sotw.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{lgXDSService}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return s.recv()
}

// recv takes one response, notes its view version and ACKs it.
func (s *lgXDSStream) recv() error {
	var v uint64
	if s.delta {
		r, err := s.dlt.Recv()
		if err != nil {
			return err
		}
		at := time.Now()
		for _, res := range r.GetResources() {
			if n, err := strconv.ParseUint(res.GetVersion(), 10, 64); err == nil {
				v = max(v, n)
			}
		}
		s.note(v, at)
		return s.dlt.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()})
	}
	r, err := s.sotw.Recv()
	if err != nil {
		return err
	}
	at := time.Now()
	lead, _, _ := strings.Cut(r.GetVersionInfo(), ".")
	v, _ = strconv.ParseUint(lead, 10, 64)
	s.note(v, at)
	return s.sotw.Send(&discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResourceNames: []string{lgXDSService}, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()})
}

func (s *lgXDSStream) note(v uint64, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = append(s.seen, lgArrival{v, at})
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

// arrival is when the stream first held version v or later (zero: not yet).
func (s *lgXDSStream) arrival(v uint64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.seen {
		if a.version >= v {
			return a.at
		}
	}
	return time.Time{}
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
