package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/lagstats"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/worker"
)

// connectTimeout is the clusters' connect timeout (Envoy's; gRPC ignores it).
const connectTimeout = 5 * time.Second

// Authenticator turns a bearer token into a principal: the HTTP server's
// (identity.Verifier), so a token means the same on every surface.
type Authenticator interface {
	Verify(ctx context.Context, raw string) (identity.Principal, error)
}

// ClientCertificates maps a client certificate chain the TLS handshake
// took to the workload it proves (the HTTP server's, so a certificate
// means the same on every surface). Its errors wrap
// identity.ErrCertificateUnmapped.
type ClientCertificates interface {
	Principal(chain []*x509.Certificate) (identity.Principal, error)
}

// Authz is who may resolve what (registry.AuthzCache, the copy /v1/watch
// and /v1/resolve authorise from).
type Authz interface {
	MayResolve(actor identity.Principal, service string) error
	// Revoked is closed when authority is taken away.
	Revoked() <-chan struct{}
}

// AuthFailures takes the streams refused for a token presented and not
// accepted, by source address (audit.NewAuthFailureSummaries).
type AuthFailures interface {
	Record(actorKind, actor string, items []audit.RefusedItem)
}

// Refusals takes the streams and requests refused for a limit, by
// principal (audit.NewXDSRefusalSummaries).
type Refusals interface {
	Record(actorKind, actor string, items []audit.RefusedItem)
}

// peerAddress is the stream's source address as the HTTP server keys it:
// the address, an IPv6 address's /64.
func peerAddress(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	ap, err := netip.ParseAddrPort(p.Addr.String())
	if err != nil {
		return p.Addr.String()
	}
	a := ap.Addr().Unmap()
	if a.Is6() {
		if pre, err := a.Prefix(64); err == nil {
			return pre.String()
		}
	}
	return a.String()
}

// Config configures a Server. Hub, Admission, Authenticator and Authz
// connect it to the rest of muster (internal/app sets them).
type Config struct {
	Hub *stream.Hub
	// Lags, when set, keeps each push's latency per service for the admin
	// UI's propagation page (lagstats.DeliveredXDS), beside the watch
	// streams' deliveries.
	Lags          *lagstats.Recorder
	Admission     *stream.Admission
	Authenticator Authenticator
	// AuthFailures, when set, puts streams refused for a forged, expired,
	// malformed or unknown issuer's token on the audit record, by source
	// address (audit.NewAuthFailureSummaries).
	AuthFailures AuthFailures
	// Refusals, when set, puts streams and requests refused for a limit
	// (Limits) on the audit record, by principal, as the HTTP surface's
	// refusals are (audit.NewXDSRefusalSummaries).
	Refusals Refusals
	// Limits bound what one principal can make a replica hold; zero
	// fields take DefaultLimits'.
	Limits Limits
	Authz  Authz
	// Region is this region's name: the locality.region of the local
	// endpoints in an assignment that has peer regions' priorities.
	Region string
	// Regions are the peer regions a service's assignment falls back to,
	// in order of preference: each one whose series
	// SERVICE@REGION the hub holds and the node may resolve adds its
	// endpoints at the next priority (Priorities). Empty: local
	// endpoints only.
	Regions []string
	// MayResolveRemote reports whether p may resolve service's series in
	// region: that region's grants decide (app: the federation
	// aggregate's copy of them, registry.MayResolveGranted). Nil: no
	// peer region's series is ever seen.
	MayResolveRemote func(p identity.Principal, region, service string) bool
	// ClientCertificates, when set, authenticates a stream whose TLS
	// handshake took a client certificate and that presents no token as
	// the workload the certificate maps to, and refuses a workload token
	// the certificate contradicts (mutual TLS).
	ClientCertificates ClientCertificates
	// Ready reports whether muster can answer for what exists: the
	// evaluator rebuilt, views published, the authorisation copy loaded.
	// Until it is, no node gets a snapshot: its streams are held without
	// an answer and clients keep what they have, rather than being told
	// that nothing exists (which a gRPC client would act on by dropping
	// its listener). Nil: always ready.
	Ready func() bool
	// Anonymous, when set, authenticates a stream that presents neither a
	// token nor a client certificate: it gets the principal Anonymous
	// returns, and is refused UNAUTHENTICATED with its error. muster
	// agent sets it, on loopback only, to give its local clients (which
	// can send no credentials) the agent's own principal. Nil: such a
	// stream is refused.
	Anonymous func(ctx context.Context) (identity.Principal, error)
	// Requested, when set, is told the names a stream asks for that the
	// server holds no service of (muster agent fetches them upstream).
	// It is called on the stream's goroutine and must not block.
	Requested func(names []string)
	// TLS, when set, is the listener's TLS configuration (clients that send
	// their token as JWT call credentials, gRFC A97, need one).
	TLS *tls.Config
	// DrainWindow spreads the end of the open streams at shutdown, so
	// clients reconnect elsewhere over it rather than at once: 5 s.
	DrainWindow time.Duration
	// Rescan is how often the hub's services and every node's authority
	// are re-read (a new service, a new grant): 1 s. A withdrawn grant is
	// followed at once.
	Rescan time.Duration
	// VerifyTimeout bounds one token verification: 10 s.
	VerifyTimeout time.Duration
	Now           func() time.Time
	Logger        *slog.Logger
	// Registerer receives the muster_xds_* metrics; nil registers nowhere.
	Registerer prometheus.Registerer
}

func (c *Config) validate() error {
	if c.Hub == nil || c.Admission == nil || c.Authenticator == nil || c.Authz == nil {
		return errors.New("xds: Hub, Admission, Authenticator and Authz are required")
	}
	for i, r := range c.Regions {
		if r == "" || strings.ContainsAny(r, "@,") || r == c.Region || slices.Contains(c.Regions[:i], r) {
			return fmt.Errorf("xds: Regions %q: each a peer region's name, once, not this region (%q)", c.Regions, c.Region)
		}
	}
	if c.DrainWindow == 0 {
		c.DrainWindow = 5 * time.Second
	}
	if c.Rescan == 0 {
		c.Rescan = time.Second
	}
	if c.VerifyTimeout == 0 {
		c.VerifyTimeout = 10 * time.Second
	}
	if c.DrainWindow < 0 || c.Rescan < 0 || c.VerifyTimeout < 0 {
		return fmt.Errorf("xds: DrainWindow %s, Rescan %s and VerifyTimeout %s must not be negative", c.DrainWindow, c.Rescan, c.VerifyTimeout)
	}
	if err := c.Limits.validate(); err != nil {
		return err
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Ready == nil {
		c.Ready = func() bool { return true }
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Server is muster's xDS surface: a gRPC server for ADS (state of the
// world and delta) and the feeder that keeps its cache in step with the
// hub. Start and Stop run the feeder (the project's worker shape); Serve
// serves a listener until Drain or Close.
type Server struct {
	cfg    Config
	log    *slog.Logger
	cache  *watchCache
	grpc   *grpc.Server
	ctx    context.Context // the xDS handlers' (Close ends every stream)
	cancel context.CancelFunc
	runner worker.Runner
	m      metrics
	acct   *accounts

	draining atomic.Bool
	// ready: Config.Ready was seen true; snapshots are set from then on.
	ready atomic.Bool

	// mu guards what the feeder keeps: it writes under the lock, and
	// the streams' requests read under a read lock.
	mu       sync.RWMutex
	services map[string]*serviceResources
	nodes    map[string]*node
	rpcs     map[*rpc]struct{}

	pubMu     sync.RWMutex
	published map[uint64]publication
	pubOrder  []uint64
}

// rpc is one xDS stream.
type rpc struct {
	principal identity.Principal
	key       string
	end       context.CancelCauseFunc

	mu     sync.Mutex
	denied map[string]bool // names already counted as denied
}

// New builds a Server; nothing runs until Start and Serve.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger.With("component", "xds"),
		services: map[string]*serviceResources{}, nodes: map[string]*node{},
		rpcs: map[*rpc]struct{}{}, published: map[uint64]publication{},
		acct: newAccounts(cfg.Limits),
	}
	var err error
	if s.m, err = newMetrics(cfg.Registerer, s); err != nil {
		return nil, err
	}
	s.cache = newWatchCache(s.log)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	opts := []grpc.ServerOption{
		grpc.StreamInterceptor(s.intercept),
		// Responses muster encoded once go out as they are (adsCodec).
		grpc.ForceServerCodecV2(newADSCodec()),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	s.grpc = grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(s.grpc, ads{s})
	return s, nil
}

// Start starts the feeder: it follows the hub until Stop.
func (s *Server) Start(ctx context.Context) error { return s.runner.Start(ctx, s.follow) }

// Stop stops the feeder and waits. Safe to call twice or before Start.
// The streams keep what they hold; Drain ends them.
func (s *Server) Stop() { s.runner.Stop() }

// Serve serves xDS on ln until Drain or Close.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("xds: serve: %w", err)
	}
	return nil
}

var errDraining = status.Error(codes.Unavailable, "muster is shutting down; keep routing on what you hold and reconnect elsewhere with jitter")

// Drain stops accepting streams (GOAWAY on every connection, the
// listener closed) and ends the open ones spread over DrainWindow with
// UNAVAILABLE, so their clients reconnect elsewhere over the window
// instead of all at once; it returns when they have ended, or ends what
// is left when ctx does. Clients keep routing on what they hold.
func (s *Server) Drain(ctx context.Context) {
	s.draining.Store(true)
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	s.mu.Lock()
	for r := range s.rpcs {
		time.AfterFunc(time.Duration(rand.Float64()*float64(s.cfg.DrainWindow)), func() { r.end(errDraining) })
	}
	s.mu.Unlock()
	select {
	case <-stopped:
	case <-ctx.Done():
		s.grpc.Stop()
		<-stopped
	}
	s.cancel()
}

var errNotCurrent = status.Error(codes.Unavailable, "this replica cannot follow the owner of a service you see while another replica can; keep routing on what you hold and reconnect elsewhere with jitter")

// DrainServices ends, each after a random part of
// stream.NotCurrentSpread, the streams of every node that sees one of
// services, which have just stopped being current here (this replica
// cannot follow their owner while another replica can: internal/relay):
// UNAVAILABLE, so the proxy keeps what it holds and reconnects
// elsewhere. While they stay stale, a new stream of a node that sees one
// is refused the same way.
func (s *Server) DrainServices(services []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for r := range s.rpcs {
		n := s.nodes[r.key]
		if n == nil {
			continue
		}
		for _, name := range services {
			if n.visible[name].local {
				s.m.notCurrent.Inc()
				time.AfterFunc(time.Duration(rand.Float64()*float64(stream.NotCurrentSpread)), func() { r.end(errNotCurrent) })
				break
			}
		}
	}
}

// seesStale reports whether r's node sees a service that is stale in the
// hub (stream.Hub.SetStale).
func (s *Server) seesStale(r *rpc) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := s.nodes[r.key]
	if n == nil {
		return false
	}
	for name, a := range n.visible {
		if a.local && s.cfg.Hub.Stale(name) {
			return true
		}
	}
	return false
}

// Close ends every stream and connection at once.
func (s *Server) Close() {
	s.draining.Store(true)
	s.grpc.Stop()
	s.cancel()
}

// Streams is how many xDS streams are open.
func (s *Server) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rpcs)
}

// Answering reports whether nodes get snapshots yet (Config.Ready has
// been seen true).
func (s *Server) Answering() bool { return s.ready.Load() }

// Version is the version of the local view of service the resources
// held were built from (false: none held yet).
func (s *Server) Version(service string) (uint64, bool) {
	return s.SeriesVersion(service)
}

// SeriesVersion is Version for a local service or a peer region's
// series SERVICE@REGION (false: none held yet).
func (s *Server) SeriesVersion(series string) (uint64, bool) {
	service, region, remote := stream.SplitRemote(series)
	if !remote {
		service = series
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.services[service].part(region, remote)
	if p == nil {
		return 0, false
	}
	return p.version, true
}

type rpcKey struct{}

// intercept admits, authenticates and accounts for every stream: the
// watch stream's reconnect admission (checked before the token is looked
// at, taken once it is verified), then the token, then the stream runs
// with a context its authority can end (token expiry, drain).
func (s *Server) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if s.draining.Load() {
		return errDraining
	}
	current, _ := s.cfg.Hub.Subscribers()
	if ok, retry := s.cfg.Admission.Check(current); !ok {
		return s.refuseAdmission(ss, retry)
	}
	p, err := s.authenticate(ss.Context())
	if err != nil {
		return err
	}
	// The principal's and the connection's streams are counted before
	// admission takes a slot, so that a refused stream takes none.
	key, conn := p.String(), connectionKey(ss.Context())
	if reason, held := s.acct.open(key, conn); reason != "" {
		return s.refuseLimit(ss.Context(), p, reason, s.cfg.Limits.streamsDetail(reason, key, held))
	}
	defer s.acct.close(key, conn)
	current, _ = s.cfg.Hub.Subscribers()
	if ok, retry := s.cfg.Admission.Admit(current); !ok {
		return s.refuseAdmission(ss, retry)
	}
	done := s.cfg.Hub.CountSubscriber()
	ctx, end := context.WithCancelCause(ss.Context())
	r := &rpc{principal: p, key: key, end: end, denied: map[string]bool{}}
	s.register(r)
	if s.seesStale(r) {
		s.unregister(r)
		done()
		end(nil)
		s.m.notCurrent.Inc()
		return errNotCurrent
	}
	var expiry *time.Timer
	if !p.Expiry.IsZero() {
		expiry = time.AfterFunc(time.Until(p.Expiry), func() {
			end(status.Error(codes.Unauthenticated, "the token this stream was opened with has expired; reconnect with a fresh one"))
		})
	}
	// The handler (serveADS) ends when ctx does (token expiry, drain),
	// and sends nothing once it has: gRPC then ends the RPC, and the
	// stream's receive fails. What the stream holds is released when it
	// has returned.
	err = handler(srv, &authorisedStream{ServerStream: ss, ctx: context.WithValue(ctx, rpcKey{}, r)})
	if expiry != nil {
		expiry.Stop()
	}
	s.unregister(r)
	done()
	end(nil)
	if cause := context.Cause(ctx); cause != nil && ss.Context().Err() == nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

func (s *Server) refuseAdmission(ss grpc.ServerStream, retry time.Duration) error {
	s.m.admissionRefused.Inc()
	secs := int(retry / time.Second)
	_ = grpc.SetTrailer(ss.Context(), metadata.Pairs("retry-after", strconv.Itoa(secs)))
	st := status.New(codes.ResourceExhausted, fmt.Sprintf(
		"too many clients are (re)subscribing right now; keep routing on what you hold and come back in %d s", secs))
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}); err == nil {
		st = d
	}
	return st.Err()
}

// authenticate verifies the stream's "authorization: Bearer" metadata. A
// stream without a valid token is refused UNAUTHENTICATED before it can
// ask for anything, and counted.
func (s *Server) authenticate(ctx context.Context) (identity.Principal, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	raw, err := identity.BearerToken(&http.Request{Header: http.Header{"Authorization": md.Get("authorization")}})
	if err == nil {
		vctx, cancel := context.WithTimeout(ctx, s.cfg.VerifyTimeout)
		var p identity.Principal
		p, err = s.cfg.Authenticator.Verify(vctx, raw)
		cancel()
		if err == nil {
			if cp, cerr := s.certificatePrincipal(ctx); cerr == nil && p.Kind == identity.KindWorkload && cp.Service != p.Service {
				s.m.denied.WithLabelValues(identity.FailureConflictingProofs).Inc()
				s.recordAuthFailure(ctx, identity.FailureConflictingProofs)
				return identity.Principal{}, status.Errorf(codes.PermissionDenied,
					"the bearer token is %s's, of service %s, and the client certificate maps to service %s: a stream proves one workload", p, p.Service, cp.Service)
			}
			return p, nil
		}
	} else if errors.Is(err, identity.ErrNoToken) && len(peerCertificates(ctx)) > 0 {
		var p identity.Principal
		if p, err = s.certificatePrincipal(ctx); err == nil {
			return p, nil
		}
		s.m.denied.WithLabelValues(identity.FailureCertificateUnmapped).Inc()
		s.recordAuthFailure(ctx, identity.FailureCertificateUnmapped)
		return identity.Principal{}, status.Error(codes.Unauthenticated, "present a muster token as \"authorization: Bearer TOKEN\" metadata, or a client certificate that maps to a workload: "+err.Error())
	}
	if errors.Is(err, identity.ErrNoToken) && s.cfg.Anonymous != nil {
		p, aerr := s.cfg.Anonymous(ctx)
		if aerr == nil {
			return p, nil
		}
		s.m.denied.WithLabelValues("unauthenticated").Inc()
		return identity.Principal{}, status.Error(codes.Unauthenticated, aerr.Error())
	}
	switch {
	case errors.Is(err, identity.ErrIssuerUnavailable):
		s.m.denied.WithLabelValues("issuer_unavailable").Inc()
		return identity.Principal{}, status.Error(codes.Unavailable, "the token's issuer cannot be reached to verify it; retry with backoff")
	case errors.Is(err, identity.ErrNoToken):
		s.m.denied.WithLabelValues("unauthenticated").Inc()
		return identity.Principal{}, status.Error(codes.Unauthenticated, "present a muster token as \"authorization: Bearer TOKEN\" metadata")
	}
	s.m.denied.WithLabelValues("invalid_token").Inc()
	s.recordAuthFailure(ctx, identity.FailureCode(err))
	return identity.Principal{}, status.Error(codes.Unauthenticated, "the bearer token was not accepted: "+err.Error())
}

// recordAuthFailure puts a refused stream on the audit record by source
// address.
func (s *Server) recordAuthFailure(ctx context.Context, code string) {
	if s.cfg.AuthFailures != nil {
		s.cfg.AuthFailures.Record("anonymous", audit.AuthSourcePrefix+peerAddress(ctx), []audit.RefusedItem{{Code: code}})
	}
}

// peerCertificates is the client certificate chain the stream's TLS
// handshake took (it verified it, or the handshake would have failed).
func peerCertificates(ctx context.Context) []*x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	return ti.State.PeerCertificates
}

// certificatePrincipal is the workload the stream's client certificate
// maps to.
func (s *Server) certificatePrincipal(ctx context.Context) (identity.Principal, error) {
	chain := peerCertificates(ctx)
	switch {
	case len(chain) == 0:
		return identity.Principal{}, fmt.Errorf("no client certificate: %w", identity.ErrCertificateUnmapped)
	case s.cfg.ClientCertificates == nil:
		return identity.Principal{}, fmt.Errorf("client certificates are not mapped to workloads here: %w", identity.ErrCertificateUnmapped)
	}
	return s.cfg.ClientCertificates.Principal(chain)
}

// register adds r to its principal's node, giving a new node its
// snapshot before the stream's first request can be answered.
func (s *Server) register(r *rpc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rpcs[r] = struct{}{}
	n := s.nodes[r.key]
	if n == nil {
		n = &node{key: r.key, principal: r.principal, visible: s.visibleTo(r.principal)}
		s.nodes[r.key] = n
		s.setSnapshot(n)
	}
	n.streams++
}

func (s *Server) unregister(r *rpc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.rpcs, r)
	if n := s.nodes[r.key]; n != nil {
		if n.streams--; n.streams == 0 {
			delete(s.nodes, r.key)
			s.cache.ClearSnapshot(r.key)
		}
	}
}

// authorisedStream is a server stream whose context its authority ends
// (the interceptor's).
type authorisedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *authorisedStream) Context() context.Context { return s.ctx }

// nack logs and counts a rejected response. It is logged once per
// rejection; muster does not resend it (adsStream.sotwRequest).
func (s *Server) nack(r *rpc, typeURL, nonce, detail string) {
	s.m.nacks.WithLabelValues(typeName(typeURL)).Inc()
	// The client writes the detail and the nonce: a few hundred bytes
	// of them say why, and a client cannot make muster log megabytes.
	s.log.Warn("xDS client rejected (NACKed) muster's resources; they are not resent until they change",
		"principal", r.key, "type", typeName(typeURL), "nonce", audit.Clip(nonce, 64), "error", audit.Clip(detail, 512))
}

// checkDenied counts, once per stream, each name the stream asks for that
// is a service muster holds and its principal may not resolve. The
// stream is not told: to it the service is absent, like one that does
// not exist.
func (s *Server) checkDenied(r *rpc, names []string) {
	if len(names) == 0 {
		return
	}
	// The server's lock is taken for a few hundred names at a time, so
	// that a request of many names never holds up the feeder.
	var denied, unheld []string
	for chunk := range slices.Chunk(names, 256) {
		s.mu.RLock()
		n := s.nodes[r.key]
		for _, name := range chunk {
			_, held := s.services[name]
			if held && n != nil && !n.visible[name].visible() {
				denied = append(denied, name)
			}
			if !held && s.cfg.Requested != nil && name != "*" && name != "" {
				unheld = append(unheld, name)
			}
		}
		s.mu.RUnlock()
	}
	if len(unheld) > 0 {
		s.cfg.Requested(unheld)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range denied {
		if !r.denied[name] {
			r.denied[name] = true
			s.m.denied.WithLabelValues("not_granted").Inc()
			s.log.Info("xDS client asked for a service it may not resolve; it sees none", "principal", r.key, "service", name)
		}
	}
}

// observeLead records how long ago the hub received the local view
// version v, whose assignment was just sent.
func (s *Server) observeLead(v uint64) {
	if p, ok := s.publishedAt(v); ok {
		d := s.cfg.Now().Sub(p.at)
		s.m.latency.Observe(d.Seconds())
		s.cfg.Lags.Observe(p.service, lagstats.DeliveredXDS, d)
	}
}

// observeLatency records how long ago the hub received the view version
// v (a decimal string) that was just sent.
func (s *Server) observeLatency(v string) {
	// A version with a peer region's part (LEAD.HASH) may have
	// changed by that part alone: not timed.
	if n, err := strconv.ParseUint(v, 10, 64); err == nil {
		s.observeLead(n)
	}
}

func typeName(url string) string {
	switch url {
	case resource.ListenerType:
		return "listener"
	case resource.RouteType:
		return "route"
	case resource.ClusterType:
		return "cluster"
	case resource.EndpointType:
		return "endpoint"
	}
	return "other"
}
