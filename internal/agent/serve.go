package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/peer"

	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/xds"
)

// MaxWatchServices bounds the services of one local watch, as muster's
// own /v1/watch does.
const MaxWatchServices = 256

// DefaultHeartbeat is how often an idle local watch stream gets a
// heartbeat (muster's: a resolver client counts three missed ones as a
// dead stream).
const DefaultHeartbeat = 15 * time.Second

// DefaultMaxStreams bounds the local streams open at once on each
// surface (xDS, watch): far above what one workload or one host opens,
// low enough that a client leaking streams cannot grow the agent without
// bound.
const DefaultMaxStreams = 1000

// Server is the agent's local surfaces over an Agent's hub: xDS, and
// the HTTP handler for /v1/resolve, /v1/watch, /readyz and /metrics.
type Server struct {
	a          *Agent
	xds        *xds.Server
	dns        *dnszone.Server
	reg        *prometheus.Registry
	log        *slog.Logger
	heartbeat  time.Duration
	admission  *stream.Admission
	maxStreams int
	watches    atomic.Int64
	// Watch streams refused by admission and by MaxStreams (xDS's are
	// muster_xds_admission_refused_total and muster_xds_refused_total).
	watchAdmissionRefused, watchStreamsRefused prometheus.Counter
}

// ServerConfig configures a Server.
type ServerConfig struct {
	// Heartbeat: DefaultHeartbeat.
	Heartbeat time.Duration
	// Listeners are counted in muster_agent_refused_connections_total.
	Listeners []*Listener
	// DNSAddr, when set, serves the services the agent follows as
	// muster's DNS zone does (internal/dnszone) on this loopback
	// HOST:PORT (UDP and TCP); DNSZone is its zone
	// (dnszone.DefaultZone when empty).
	DNSAddr, DNSZone string
	// Admission is reconnect admission for local streams, xDS and watch
	// together, as muster's own /v1/watch and xDS share one: zero
	// fields take stream.NewAdmission's defaults (50, or 5% of the
	// recent peak, per 10 s). A restarted agent's clients then come
	// back over windows instead of at once; a refused one keeps what it
	// holds and is told when to come back.
	Admission stream.AdmissionConfig
	// MaxStreams bounds the streams open at once on each surface, xDS
	// and watch: DefaultMaxStreams.
	MaxStreams int
	Logger     *slog.Logger
}

// NewServer builds the local surfaces of a; the xDS feeder runs from
// Start to Stop, the xDS server serves a listener from ServeXDS.
func NewServer(a *Agent, cfg ServerConfig) (*Server, error) {
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	s := &Server{a: a, reg: prometheus.NewRegistry(), log: cfg.Logger.With("component", "agent"), heartbeat: cfg.Heartbeat,
		admission: stream.NewAdmission(cfg.Admission), maxStreams: cfg.MaxStreams}
	// Every local stream has the agent's principal: the per-principal
	// stream limit is the xDS surface's cap.
	limits := xds.DefaultLimits()
	limits.StreamsPerPrincipal = cfg.MaxStreams
	x, err := xds.New(xds.Config{
		Hub:           a.hub,
		Admission:     s.admission,
		Limits:        limits,
		Authenticator: localOnly{},
		Authz:         localAuthz{a},
		Anonymous:     anonymous,
		Requested: func(names []string) {
			for _, n := range names {
				_ = a.Want(n)
			}
		},
		Ready: a.Ready,
		// A local client has this agent only: spreading its
		// reconnection over muster's 5 s would only delay it.
		DrainWindow: 500 * time.Millisecond,
		Region:      a.cfg.Region,
		Regions:     a.cfg.Regions,
		// A peer region's series of a service the agent follows: muster
		// served it to the agent's identity, the peer's grants applied.
		MayResolveRemote: func(_ identity.Principal, _, service string) bool { return a.Held(service) },
		Logger:           cfg.Logger,
		Registerer:       s.reg,
	})
	if err != nil {
		return nil, err
	}
	s.xds = x
	if cfg.DNSAddr != "" {
		if err := CheckLoopback(cfg.DNSAddr); err != nil {
			return nil, fmt.Errorf("dns: %w", err)
		}
		// Every service the local hub holds: the agent's, which
		// upstream granted it.
		if s.dns, err = dnszone.New(dnszone.Config{Addr: cfg.DNSAddr, Zone: cfg.DNSZone, Services: []string{dnszone.AllServices},
			Regions: a.cfg.Regions, Hub: a.hub, Ready: a.Ready, Logger: cfg.Logger, Registerer: s.reg}); err != nil {
			return nil, err
		}
	}
	if err := s.register(cfg.Listeners); err != nil {
		return nil, err
	}
	return s, nil
}

// Start starts the xDS feeder, and the DNS server when configured.
func (s *Server) Start(ctx context.Context) error {
	if err := s.xds.Start(ctx); err != nil {
		return err
	}
	if s.dns != nil {
		if err := s.dns.Start(ctx); err != nil {
			s.xds.Stop()
			return err
		}
	}
	return nil
}

// Stop stops the xDS feeder and the DNS server. Safe to call twice.
func (s *Server) Stop() {
	s.xds.Stop()
	if s.dns != nil {
		s.dns.Stop()
	}
}

// DNS is the local DNS server (nil unless ServerConfig.DNSAddr).
func (s *Server) DNS() *dnszone.Server { return s.dns }

// XDS is the local xDS server (ServeXDS, Drain, Close).
func (s *Server) XDS() *xds.Server { return s.xds }

// ServeXDS serves xDS on ln until the xDS server is drained or closed.
func (s *Server) ServeXDS(ln *Listener) error { return s.xds.Serve(ln) }

// anonymous gives a local stream the agent's principal, when it comes
// from loopback or a Unix socket (the listener already dropped any
// other; this holds if the xDS server is ever handed another listener).
func anonymous(ctx context.Context) (identity.Principal, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || !loopbackPeer(p.Addr) {
		return identity.Principal{}, errors.New("muster agent serves only loopback and Unix socket peers")
	}
	return Principal, nil
}

// localOnly is the xDS server's Authenticator: a token a local client
// sends anyway is not looked at; the stream is the agent's, as without
// one.
type localOnly struct{}

func (localOnly) Verify(ctx context.Context, _ string) (identity.Principal, error) {
	return anonymous(ctx)
}

// localAuthz: a local client may see what upstream serves the agent; a
// service not followed yet is asked for (and seen once upstream allows
// it and its view arrives).
type localAuthz struct{ a *Agent }

func (z localAuthz) MayResolve(_ identity.Principal, service string) error {
	if z.a.Held(service) {
		return nil
	}
	if err := z.a.Want(service); err != nil {
		return err
	}
	return fmt.Errorf("%s: not followed yet", service)
}

// Revoked is closed when services leave the set because upstream no
// longer serves them to the agent.
func (z localAuthz) Revoked() <-chan struct{} { return z.a.Revoked() }

// Handler serves /v1/resolve/{service}, /v1/watch, /readyz and
// /metrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/resolve/{service}", s.resolve)
	mux.HandleFunc("GET /v1/watch", s.watch)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, "not-found", "muster agent serves GET /v1/resolve/{service}, GET /v1/watch, /readyz and /metrics", 0)
	})
	return mux
}

// problem is an application/problem+json body, as muster writes them.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

func writeProblem(w http.ResponseWriter, status int, code, detail string, retryAfter int) {
	w.Header().Set("Content-Type", "application/problem+json")
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(problem{Type: "https://muster.dev/problems/" + code, Title: http.StatusText(status), Status: status, Detail: detail})
}

// admit checks a service a local client names: a problem is written and
// false returned when it is not a service name, upstream refused it, or
// the set is full; otherwise it is followed, or asked for.
func (s *Server) admit(w http.ResponseWriter, service string) bool {
	if !validName(service) {
		writeProblem(w, http.StatusBadRequest, "bad-parameter", fmt.Sprintf("%q is not a service name", service), 0)
		return false
	}
	err := s.a.Want(service)
	var ref Refusal
	switch {
	case errors.As(err, &ref):
		code := "forbidden"
		if ref.Status == http.StatusNotFound {
			code = "not-found"
		}
		writeProblem(w, ref.Status, code, ref.Detail, 0)
		return false
	case errors.Is(err, ErrTooManyServices):
		writeProblem(w, http.StatusServiceUnavailable, "too-many-services", err.Error(), 0)
		return false
	case err != nil:
		writeProblem(w, http.StatusBadRequest, "bad-parameter", err.Error(), 0)
		return false
	}
	return true
}

// resolve answers the current view of one service, the bytes the watch
// stream sends, as muster's /v1/resolve does.
func (s *Server) resolve(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("service")
	if !s.admit(w, name) {
		return
	}
	// The hub keeps the last view of a service upstream stopped
	// serving; only a service followed is answered.
	f, ok := s.a.view(name)
	if !ok || !s.a.Held(name) {
		writeProblem(w, http.StatusServiceUnavailable, "not-ready", "the agent holds no view of "+name+" yet (it is asking muster for it); retry shortly", 1)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("ETag", `"`+strconv.FormatUint(f.Version, 10)+`"`)
	_, _ = w.Write(f.JSON)
}

// watch is muster's watch stream over the local hub: full views, then
// synced once every service asked for has one, heartbeats, and a view
// whenever the agent routes on a newer one.
func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	services := slices.Compact(slices.Sorted(slices.Values(q["service"])))
	if len(services) == 0 || len(services) > MaxWatchServices {
		writeProblem(w, http.StatusBadRequest, "bad-parameter", fmt.Sprintf("name 1 to %d services with ?service=", MaxWatchServices), 0)
		return
	}
	// Refused before anything is asked of muster for it: a refused
	// watch changes nothing.
	current, _ := s.a.hub.Subscribers()
	if ok, retry := s.admission.Check(current); !ok {
		s.refuseAdmission(w, retry)
		return
	}
	for _, name := range services {
		if !s.admit(w, name) {
			return
		}
		// The hub keeps the last view of a service upstream stopped
		// serving: a watch of one is held off until upstream says
		// again that the agent may follow it.
		if _, has := s.a.view(name); has && !s.a.Held(name) {
			writeProblem(w, http.StatusServiceUnavailable, "not-ready", "the agent is asking muster whether it may follow "+name+" again; retry shortly", 1)
			return
		}
	}
	// A client following peer regions (the resolver's Config.Regions)
	// asks for each service's series in them too: regions the agent
	// follows.
	if rs := q.Get("regions"); rs != "" {
		local := services
		for _, r := range strings.Split(rs, ",") {
			if !slices.Contains(s.a.cfg.Regions, r) {
				writeProblem(w, http.StatusBadRequest, "bad-parameter", fmt.Sprintf("region %q is not one the agent follows (%s)", r, strings.Join(s.a.cfg.Regions, ",")), 0)
				return
			}
			for _, name := range local {
				services = append(services, stream.RemoteSeries(name, r))
			}
		}
		services = slices.Compact(slices.Sorted(slices.Values(services)))
	}
	var since uint64
	if v := q.Get("since"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, "bad-parameter", "since must be a view version (a whole number)", 0)
			return
		}
		since = n
	}
	held := map[string]uint64{}
	for _, v := range q["held"] {
		name, ver, ok := strings.Cut(v, ":")
		n, err := strconv.ParseUint(ver, 10, 64)
		if _, found := slices.BinarySearch(services, name); !ok || err != nil || !found {
			writeProblem(w, http.StatusBadRequest, "bad-parameter", fmt.Sprintf("held %q: SERVICE:VERSION of a service asked for", v), 0)
			return
		}
		held[name] = n
	}
	if open := s.watches.Add(1); open > int64(s.maxStreams) {
		s.watches.Add(-1)
		s.watchStreamsRefused.Inc()
		writeProblem(w, http.StatusServiceUnavailable, "too-many-streams",
			fmt.Sprintf("the agent holds %d watch streams, its limit (--max-streams); keep routing on your cached view and come back later", s.maxStreams), 10)
		return
	}
	defer s.watches.Add(-1)
	current, _ = s.a.hub.Subscribers()
	if ok, retry := s.admission.Admit(current); !ok {
		s.refuseAdmission(w, retry)
		return
	}
	sub, err := s.a.hub.SubscribeHeld(services, since, held)
	if err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "draining", "the agent is shutting down; reconnect with jitter", 1)
		return
	}
	defer sub.Close()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	send := func(frames ...*stream.Frame) bool {
		for _, f := range frames {
			if writeFrame(w, f) != nil {
				return false
			}
		}
		return rc.Flush() == nil
	}
	if !send(sub.Initial...) {
		return
	}
	beat := time.NewTicker(s.heartbeat)
	defer beat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case f := <-sub.C():
			if !send(f) || f.Kind == stream.KindDrain {
				return
			}
		case <-sub.Resync():
			if !send(sub.TakeResync()...) {
				return
			}
		case <-beat.C:
			if !send(heartbeat) {
				return
			}
		}
	}
}

// refuseAdmission answers a watch admission has no slot for, as muster
// does: 503 and a jittered Retry-After.
func (s *Server) refuseAdmission(w http.ResponseWriter, retry time.Duration) {
	s.watchAdmissionRefused.Inc()
	writeProblem(w, http.StatusServiceUnavailable, "admission",
		"too many clients are (re)subscribing right now; keep routing on your cached view and come back after Retry-After", int(retry/time.Second))
}

var heartbeat = &stream.Frame{Kind: stream.KindHeartbeat, JSON: []byte(`{}`)}

// writeFrame writes one SSE event as muster's watch stream does.
func writeFrame(w http.ResponseWriter, f *stream.Frame) error {
	b := make([]byte, 0, len(f.JSON)+64)
	b = append(b, "event: "...)
	b = append(b, f.Kind...)
	if f.Version != 0 {
		b = append(b, "\nid: "...)
		b = strconv.AppendUint(b, f.Version, 10)
	}
	b = append(b, "\ndata: "...)
	b = append(b, f.JSON...)
	b = append(b, "\n\n"...)
	_, err := w.Write(b)
	return err
}

// readyz is 200 once every service followed has a view (fresh, held or
// from the cache folder), else 503 naming those without.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	var missing []string
	for _, name := range s.a.Services() {
		if _, ok := s.a.view(name); !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		writeProblem(w, http.StatusServiceUnavailable, "not-ready", "no view yet of "+strings.Join(missing, ", "), 1)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}
