// Package server is muster's HTTP surface: the chi router, authentication,
// problem+json errors, metrics, and one thin handler file per API. Handlers
// decode, call a domain package, and encode; they hold no business rules and
// no SQL.
package server

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/lagstats"
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/preview"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/openapi"
)

// Authenticator turns a bearer token into a principal.
type Authenticator interface {
	Verify(ctx context.Context, raw string) (identity.Principal, error)
}

// KnownTokens is what an Authenticator may also offer: the principal of
// a token it accepted before and may still reuse, without verifying it
// again (identity.Verifier does). While a source address is refused for
// a flood of invalid tokens (Limits.Unauthenticated), its known tokens are
// still served.
type KnownTokens interface {
	Known(raw string) (identity.Principal, bool)
}

// ClientCertificates maps a client certificate chain the TLS handshake
// took (leaf first) to the workload it proves, checking it against the
// client CA bundle first (mutual TLS). Its errors wrap
// identity.ErrCertificateUnmapped.
type ClientCertificates interface {
	Principal(chain []*x509.Certificate) (identity.Principal, error)
}

// Evaluator ingests evidence and shows verdicts.
type Evaluator interface {
	Ingest(ctx context.Context, actor identity.Principal, reports []evaluator.Report) (evaluator.Result, error)
	// IngestForwarded applies evidence another replica of the region
	// accepted (POST /v1/peer/reports).
	IngestForwarded(ctx context.Context, actor identity.Principal, reports []evaluator.Report) (evaluator.Result, error)
	ServiceEligibility(service string) (evaluator.ServiceEligibility, error)
	// PreviewContract replays a service's retained observed windows under
	// its contract and a proposed one, changing nothing.
	PreviewContract(ctx context.Context, p registry.ContractPreview) (preview.Result, error)
}

// Authz answers who may watch or resolve what from memory (the
// registry's AuthzCache), so that subscription keeps working while
// PostgreSQL is away.
type Authz interface {
	MayResolve(actor identity.Principal, service string) error
	ServiceExists(name string) (bool, error)
	// Revoked returns a channel closed when authority may have been
	// taken away (a grant removed): open watch streams ask MayResolve
	// again then.
	Revoked() <-chan struct{}
}

// Database is what the server knows of PostgreSQL's health (db.Monitor).
type Database interface {
	// Up reports whether the database answers; while it does not,
	// requests that need it are answered 503 without trying.
	Up() bool
	// DownSince is when the current outage began.
	DownSince() time.Time
	// Err is the last failure seen while down.
	Err() error
	// Observe is told of errors requests met on the database.
	Observe(err error)
	// Unavailable reports whether err means the database could not be
	// reached or did not answer in time (503, not 500): the database's
	// own errors are its package's to classify, not the handlers'.
	Unavailable(err error) bool
}

// DefaultDBTimeout is the database budget of an API request.
const DefaultDBTimeout = 1500 * time.Millisecond

// AuditLog lists audit events.
type AuditLog interface {
	List(ctx context.Context, f audit.Filter) ([]audit.Event, error)
	// Append records one entry in a transaction of its own.
	Append(ctx context.Context, now time.Time, e audit.Entry) (audit.Event, error)
}

// Config configures the server.
type Config struct {
	Logger   *slog.Logger
	Registry *registry.Registry
	// Policy admits overrides and rate-limits policy writes per actor.
	Policy *policy.Service
	Audit  AuditLog
	// RefusedEvidence, when set, puts evidence refused for want of
	// authority on the audit record (audit.RefusalSummaries: one row per
	// identity per minute); nil, such refusals are only answered.
	RefusedEvidence RefusedEvidence
	// AuthFailures, when set, puts requests refused for a forged,
	// expired, malformed or unknown issuer's token on the audit record
	// (audit.NewAuthFailureSummaries: one row per source address per
	// minute); nil, they are only answered and counted.
	AuthFailures  AuthFailures
	Evaluator     Evaluator
	Authenticator Authenticator
	// ClientCertificates, when set, authenticates requests that carry a
	// verified client certificate and no bearer token as the workload its
	// SPIFFE ID maps to, and refuses a workload token whose service the
	// certificate contradicts. Nil: certificates prove nothing.
	ClientCertificates ClientCertificates
	// Ready reports whether this replica can serve views (see
	// ServingReady); it is what /readyz answers.
	Ready func(ctx context.Context) error
	// Authz authorises watch and resolve from memory.
	Authz Authz
	// Database, when set, is PostgreSQL's health: requests that need the
	// database fail fast while it is down, and the database_unreachable
	// alarm is listed with the others.
	Database Database
	// DBTimeout is the deadline of every /v1 request but the watch stream
	// (DefaultDBTimeout, 1.5 s): whatever database work a request does
	// ends by then, and a database that has not answered by then is
	// answered for with 503 database-unavailable.
	DBTimeout time.Duration
	// Metrics is where the server registers its own metrics and what
	// /metrics serves.
	Metrics *prometheus.Registry
	// DevIssuer, when set, is mounted at DevIssuerPath (muster dev only).
	DevIssuer     http.Handler
	DevIssuerPath string
	// UI, when set, is the admin web UI, mounted at UIPath; it sees full
	// paths (UIPath included). Its HTML pages are not part of the API
	// description.
	UI     http.Handler
	UIPath string
	// MaxBodyBytes bounds request bodies; 1 MiB by default.
	MaxBodyBytes int64
	// Hub and Admission are the streaming tier behind /v1/watch and
	// /v1/resolve.
	Hub *stream.Hub
	// Lags, when set, keeps how long each view change took from the hub
	// to each watch stream it was written to, per service (the admin
	// UI's histogram; lagstats.Delivered).
	Lags      *lagstats.Recorder
	Admission *stream.Admission
	// Alarms lists the open alarms (the publisher).
	Alarms interface{ Alarms() []assembler.Alarm }
	// Tampering, when set, lists the alarms of rows written outside muster
	// (override_unsealed, instance_unsealed, their _replayed kinds) with
	// the others.
	Tampering func() []assembler.Alarm
	// ReplicaAlarms, when set, lists the alarms of this replica's clock
	// and of its exchanges with its peers (clock_skew, evidence_refused)
	// with the others.
	ReplicaAlarms func() []assembler.Alarm
	// Probers, when set, lists prober outages and suspect probers (the
	// evaluator); they are listed with the other alarms.
	Probers interface {
		ProberAlarms() []evaluator.ProberAlarm
	}
	// Shifts is the shift-back API (shift.Service); its alarms are listed
	// with the others. Nil: /v1/shifts answers 404.
	Shifts Shifts
	// Leases is the lease reaper; its holds are listed with the other
	// removal holds (GET /v1/removal-holds, alarm removal_held). Nil: none.
	Leases Leases
	// Reconcile, when set, serves /v1/reconcile and lists its alarms.
	Reconcile Reconcile
	// Replicas, when set, is the region's shard ownership (GET
	// /v1/replicas) and its shard_unowned alarm.
	Replicas Replicas
	// Relay, when set, is the relay from peer replicas, listed by GET
	// /v1/replicas.
	Relay Relay
	// RoutingControls, when set, are the region routing controls this
	// replica reads (GET /v1/routing-controls) with their alarms.
	RoutingControls RoutingControls
	// Region is this muster's region, in GET /v1/regions.
	Region string
	// Regions, when set, is the aggregate of the peer regions (GET
	// /v1/regions) and its peer_stale alarm.
	Regions Regions
	// EpochsLeft, when set, is the region's version epochs left
	// (publisher.Publisher.EpochsLeft), in GET /v1/replicas.
	EpochsLeft func() uint64
	// Forwarder, when set, is offered the evidence this replica accepts,
	// to mirror it to the region's other replicas; nil, none
	// is forwarded.
	Forwarder Forwarder
	// Peers authenticates the region's other replicas (peer.Verifier):
	// GET /v1/peer/updates streams them this replica's publications, POST
	// /v1/peer/reports takes the evidence they accepted. Nil: every such
	// request is refused 401 (a region without a signing key).
	Peers PeerVerifier
	// Reads, when set, answers reads of evaluator state (a service's
	// eligibility, the quarantines GET /v1/alarms lists, contract
	// previews) from the replica that owns each service, and serves the
	// peer reads (/v1/peer/eligibility, /v1/peer/quarantines,
	// /v1/peer/stats, /v1/peer/contract-preview). Nil:
	// this replica's evaluator answers everything (it evaluates every
	// service), and /v1/alarms lists no quarantine.
	Reads OwnerReads
	// PeerLive, when set, says whether a replica has been seen live
	// (ownership.Manager.Seen); peer reads from one never seen are
	// refused 403.
	PeerLive func(id string) bool
	// ReadOnly, when set and true, refuses reports (and forwarded
	// reports) 503 read-only: the replica serves views it took from its
	// peers while its database is unreachable. Requests that
	// need the database are refused by Database already.
	ReadOnly func() bool
	// PeerHeartbeat is the peer stream's heartbeat period:
	// DefaultPeerHeartbeat (2 s).
	PeerHeartbeat time.Duration
	// PeerTapLimit is how many publications a peer stream may fall behind
	// before it is sent a snapshot again (stream.Hub.Tap): 4,096.
	PeerTapLimit int
	// WatchHeartbeat is the idle-stream heartbeat period: 15 s.
	WatchHeartbeat time.Duration
	// WatchWriteTimeout cuts off a subscriber that cannot take a frame:
	// 30 s.
	WatchWriteTimeout time.Duration
	// Limits bound what one identity or source address may ask; zero
	// fields take DefaultLimits.
	Limits Limits
	// Now is the clock the limits refill by; time.Now when nil.
	Now func() time.Time
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	switch {
	case c.Registry == nil:
		return errors.New("server: Registry is required")
	case c.Policy == nil:
		return errors.New("server: Policy is required")
	case c.Audit == nil:
		return errors.New("server: Audit is required")
	case c.Evaluator == nil:
		return errors.New("server: Evaluator is required")
	case c.Hub == nil || c.Admission == nil || c.Alarms == nil:
		return errors.New("server: Hub, Admission and Alarms are required")
	case c.Authenticator == nil:
		return errors.New("server: Authenticator is required")
	case c.Ready == nil:
		return errors.New("server: Ready is required")
	case c.Authz == nil:
		return errors.New("server: Authz is required")
	case c.Metrics == nil:
		return errors.New("server: Metrics is required")
	case c.DevIssuer != nil && c.DevIssuerPath == "":
		return errors.New("server: DevIssuerPath is required with DevIssuer")
	case c.UI != nil && c.UIPath == "":
		return errors.New("server: UIPath is required with UI")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.DBTimeout == 0 {
		c.DBTimeout = DefaultDBTimeout
	}
	if c.DBTimeout < 0 {
		return errors.New("server: DBTimeout must not be negative")
	}
	if c.WatchHeartbeat == 0 {
		c.WatchHeartbeat = 15 * time.Second
	}
	if c.PeerHeartbeat == 0 {
		c.PeerHeartbeat = DefaultPeerHeartbeat
	}
	if c.WatchWriteTimeout == 0 {
		c.WatchWriteTimeout = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c.Limits.validate()
}

// Server is the HTTP handler.
type Server struct {
	cfg     Config
	log     *slog.Logger
	router  chi.Router
	metrics serverMetrics
	limits  limiters
	// metricsHandler serves cfg.Metrics.
	metricsHandler http.Handler
	// streams counts watch streams running on hijacked connections, which
	// http.Server.Shutdown does not wait for.
	streams streamSet
	// unknown is what peerUnknownField has logged.
	unknown unknownFields
}

type serverMetrics struct {
	requests         *prometheus.CounterVec
	duration         *prometheus.HistogramVec
	authFailures     *prometheus.CounterVec
	admissionRefused prometheus.Counter
	framesSent       *prometheus.CounterVec
	// framesSentBy holds framesSent's counter of each frame kind, so the
	// fan-out does not hash a label per frame (10,000 subscribers: 10,000
	// lookups per change).
	framesSentBy    map[stream.Kind]prometheus.Counter
	rateLimited     *prometheus.CounterVec
	unauthenticated *prometheus.CounterVec
	streamsEnded    *prometheus.CounterVec
	peerUnknown     *prometheus.CounterVec
}

// New builds the router.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "http")}
	var err error
	if s.limits, err = newLimiters(s.cfg.Limits, s.cfg.Now); err != nil {
		return nil, err
	}
	s.metrics = serverMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_http_requests_total", Help: "HTTP requests by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "muster_http_request_duration_seconds", Help: "HTTP request latency by route pattern and method.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"route", "method"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_auth_failures_total", Help: "Requests refused for want of a valid token, by reason.",
		}, []string{"reason"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_http_rate_limited_total", Help: "Requests answered 429 by a per-identity or per-address limit of this replica, by limit.",
		}, []string{"limit"}),
		unauthenticated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_http_unauthenticated_total",
			Help: "Requests refused for want of a valid token, by response: 401, or 429 when their source address had too many 401s (the token was not verified).",
		}, []string{"response"}),
		streamsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_watch_streams_ended_total", Help: "Watch streams ended by muster with a drain event because their authority lapsed, by reason (token_expired, grant_revoked).",
		}, []string{"reason"}),
		peerUnknown: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_peer_unknown_fields_total",
			Help: "Requests from another replica of the region carrying a member this release does not know (ignored, not refused: a newer release beside this one), by route.",
		}, []string{"route"}),
	}
	s.metrics.admissionRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "muster_watch_admission_refused_total", Help: "Watch (re)subscriptions refused by reconnect admission.",
	})
	s.metrics.framesSent = newFramesSent()
	s.metrics.framesSentBy = map[stream.Kind]prometheus.Counter{}
	for _, k := range []stream.Kind{stream.KindView, stream.KindDelta, stream.KindHeartbeat, stream.KindDrain, stream.KindSynced} {
		s.metrics.framesSentBy[k] = s.metrics.framesSent.WithLabelValues(string(k))
	}
	subscribers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "muster_watch_subscribers", Help: "Open watch streams, xDS streams included (the population admission and the census count).",
	}, func() float64 { n, _ := cfg.Hub.Subscribers(); return float64(n) })
	adm := func(f func(stream.AdmissionStats) float64) func() float64 {
		return func() float64 { return f(cfg.Admission.Stats()) }
	}
	admission := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_watch_expected_population",
			Help: "The region's expected watch subscriber population, as the census last read it from PostgreSQL (sum over replicas of their recent peak).",
		}, adm(func(st stream.AdmissionStats) float64 { return float64(st.Population.Expected) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_watch_population_known",
			Help: "1 while a census reading sizes admission; 0 when none is fresh (PostgreSQL away since start) and admission falls back to this process's own peak.",
		}, adm(func(st stream.AdmissionStats) float64 {
			if st.PopulationKnown {
				return 1
			}
			return 0
		})),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_watch_admission_budget", Help: "Watch (re)subscriptions admitted per admission window now.",
		}, adm(func(st stream.AdmissionStats) float64 { return float64(st.Budget) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_watch_admitted_window", Help: "Watch (re)subscriptions admitted within the last admission window.",
		}, adm(func(st stream.AdmissionStats) float64 { return float64(st.InWindow) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_watch_admitted_window_max", Help: "The most watch (re)subscriptions admitted within any one admission window since start.",
		}, adm(func(st stream.AdmissionStats) float64 { return float64(st.MaxWindow) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "muster_watch_admitted_total", Help: "Watch (re)subscriptions admitted since start.",
		}, adm(func(st stream.AdmissionStats) float64 { return float64(st.Admitted) })),
	}
	for _, c := range append([]prometheus.Collector{s.metrics.requests, s.metrics.duration, s.metrics.authFailures,
		s.metrics.admissionRefused, s.metrics.framesSent, s.metrics.rateLimited, s.metrics.unauthenticated, s.metrics.streamsEnded,
		s.metrics.peerUnknown, subscribers}, admission...) {
		if err := cfg.Metrics.Register(c); err != nil {
			return nil, err
		}
	}
	s.metricsHandler = promhttp.HandlerFor(cfg.Metrics, promhttp.HandlerOpts{})
	s.router = s.routes()
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.router.ServeHTTP(w, r) }

// Router exposes the chi router so tests can walk its routes.
func (s *Server) Router() chi.Routes { return s.router }

func (s *Server) routes() chi.Router {
	r := chi.NewRouter()
	r.Use(middleware.RequestID, s.observe, s.recoverer)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, problem(http.StatusNotFound, "not-found", "no such route: "+r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		// RFC 9110 wants the methods that are allowed in Allow; chi keeps
		// them to itself when the handler is custom, so ask the router.
		var allowed []string
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if r.Match(chi.NewRouteContext(), m, req.URL.Path) {
				allowed = append(allowed, m)
			}
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeProblem(w, req, problem(http.StatusMethodNotAllowed, "method-not-allowed", req.Method+" is not allowed on "+req.URL.Path+"; allowed: "+strings.Join(allowed, ", ")))
	})

	r.Get("/healthz", s.healthz)
	r.Get("/readyz", s.readyz)
	r.Get("/openapi.yaml", serveSpec)
	if s.cfg.DevIssuer != nil {
		r.Mount(s.cfg.DevIssuerPath, http.StripPrefix(s.cfg.DevIssuerPath, s.cfg.DevIssuer))
	}
	if s.cfg.UI != nil {
		r.Mount(s.cfg.UIPath, s.cfg.UI)
	}

	// A Group's middleware runs after routing, so metrics and logs carry the
	// route pattern even for refused requests.
	// The watch stream is long-lived and served from memory: no database
	// budget. Reconnect admission is checked before the token: in a
	// reconnect storm most callers are refused, and a refusal should cost
	// no signature check (the slot is taken only once the caller is
	// authorised, so callers without a valid token cannot spend it).
	r.With(s.watchAdmission, s.authenticate).Get("/v1/watch", s.watch)
	// Replicas of the region, and only they, by their signature (issue
	// 27): no bearer token is asked or looked at. They stream each
	// other's publications and mirror the evidence they accepted.
	r.With(s.authenticatePeer).Get("/v1/peer/updates", s.peerUpdates)
	r.With(s.authenticatePeer).Get(PeerAuthzPath, s.peerAuthz)
	// Reads of evaluator state a replica that does not own a service
	// asks its owner for; the asker has authorised its own caller.
	r.With(s.authenticatePeer, s.livePeer).Get(ownerread.EligibilityPath+"{service}", s.peerEligibility)
	r.With(s.authenticatePeer, s.livePeer).Get(ownerread.QuarantinesPath, s.peerQuarantines)
	r.With(s.authenticatePeer, s.livePeer).Get(ownerread.StatsPath, s.peerStats)
	r.With(s.authenticatePeer, s.livePeer).Post(ownerread.PreviewPath, s.peerContractPreview)
	r.With(s.authenticatePeer, s.readOnly, s.dbBudget).Post(forward.Path, s.peerReportsPost)
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate)
		// Metrics describe the whole estate (service names, counts, who
		// is failing): operators and tools only. MetricsHandler serves
		// them without a token on a listener of their own.
		r.Get("/metrics", s.metricsGet)
		r.Group(func(r chi.Router) {
			r.Use(s.dbBudget)
			// Served from memory: they keep working while PostgreSQL is
			// away (reports are taken into memory and flushed later).
			r.With(s.readOnly).Post("/v1/reports", s.reportsPost)
			r.Get("/v1/resolve/{service}", s.resolve)
			r.Get("/v1/alarms", s.alarmsGet)
			r.Get("/v1/leases/expiry", s.leaseExpiryGet)
			r.Get("/v1/removal-holds", s.removalHoldsGet)
			r.Get("/v1/replicas", s.replicasGet)
			r.Get("/v1/evidence/routes", s.evidenceRoutesGet)
			r.Get("/v1/routing-controls", s.routingControlsGet)
			r.Get("/v1/regions", s.regionsGet)
			r.Get("/v1/regions/{region}/views/{service}", s.remoteViewGet)
			r.Get("/v1/services/{name}/eligibility", s.eligibilityGet)
			// Everything else reads or writes PostgreSQL.
			r.Group(func(r chi.Router) {
				r.Use(s.needsDatabase)
				r.Get("/v1/services", s.servicesList)
				r.Get("/v1/services/{name}", s.serviceGet)
				r.Put("/v1/services/{name}", s.servicePut)
				r.Get("/v1/services/{name}/contract", s.contractGet)
				r.Put("/v1/services/{name}/contract", s.contractPut)
				r.Post("/v1/services/{name}/contract/preview", s.contractPreview)
				r.Get("/v1/services/{name}/instances", s.instancesList)
				r.With(s.limitActor(s.limits.registrations, "registrations")).Post("/v1/services/{name}/instances", s.instanceRegister)
				r.Get("/v1/instances/{id}", s.instanceGet)
				r.With(s.limitActor(s.limits.deregistrations, "deregistrations")).Delete("/v1/instances/{id}", s.instanceDeregister)
				// Renewals are limited in their handlers: a refused one is
				// noted so that it never expires its lease.
				r.Put("/v1/instances/{id}/lease", s.leaseRenew)
				r.Post("/v1/leases/renewals", s.leaseRenewBatch)
				r.Post("/v1/leases/expiry-confirmations", s.leaseExpiryConfirm)
				r.Post("/v1/removal-holds/confirmations", s.removalConfirm)
				r.Post("/v1/authz/reload-confirmations", s.authzReloadConfirm)
				r.Get("/v1/reconcile/diff", s.reconcileDiffGet)
				r.Post("/v1/reconcile/sources/{kind}/{name}/confirm", s.reconcileConfirm)
				r.Get("/v1/audit", s.auditList)
				r.Get("/v1/probers/{subject}/assignments", s.proberAssignmentsGet)
				r.Put("/v1/probers/{subject}/assignments", s.proberAssignmentsPut)
				r.Get("/v1/services/{name}/grants", s.grantsGet)
				r.Put("/v1/services/{name}/grants", s.grantsPut)
				r.Get("/v1/services/{name}/member-sources", s.memberSourcesGet)
				r.Put("/v1/services/{name}/member-sources", s.memberSourcesPut)
				r.Get("/v1/shifts", s.shiftsList)
				r.Post("/v1/shifts", s.shiftStart)
				r.Get("/v1/shifts/{id}", s.shiftGet)
				r.Post("/v1/shifts/{id}/step", s.shiftStep)
				r.Post("/v1/shifts/{id}/confirm", s.shiftConfirm)
				r.Post("/v1/overrides", s.overrideCreate)
				r.Get("/v1/overrides", s.overridesList)
				r.Get("/v1/overrides/{id}", s.overrideGet)
				r.Delete("/v1/overrides/{id}", s.overrideLift)
				r.Post("/v1/overrides/{id}/cosign", s.overrideCosign)
			})
		})
	})
	return r
}

func (s *Server) metricsGet(w http.ResponseWriter, r *http.Request) {
	if p := principal(r); p.Kind != identity.KindOperator && p.Kind != identity.KindTool {
		writeProblem(w, r, problem(http.StatusForbidden, "forbidden", "metrics describe the whole estate; they are for operator and tool identities, not "+string(p.Kind)+"s"))
		return
	}
	s.metricsHandler.ServeHTTP(w, r)
}

// MetricsHandler serves the metrics without authentication, for a
// listener of their own that only the scraper can reach (muster's
// --metrics-addr, loopback by default). On the API listener /metrics
// needs an operator or tool token.
func (s *Server) MetricsHandler() http.Handler { return s.metricsHandler }

func serveSpec(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(openapi.Spec)
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.cfg.Ready(ctx); err != nil {
		s.log.Warn("not ready", "err", err)
		p := problem(http.StatusServiceUnavailable, "not-ready", "muster is not ready to serve views: "+err.Error())
		p.retryAfter = 1
		writeProblem(w, r, p)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ready\n"))
}

// ReadyEvaluator is what readiness needs of the evaluator.
type ReadyEvaluator interface {
	// Ready reports whether the rebuild after start is done.
	Ready() bool
	// Stats counts what it holds (the services, for readiness).
	Stats() evaluator.Stats
}

// ServingReady is /readyz's test: a replica is ready when it can serve
// views, that is when the evaluator has rebuilt its state and the hub
// holds views (at least one published since start, when the registry has
// any service; an empty registry is ready once rebuilt). Whether
// PostgreSQL answers is not part of it: a database outage must not take
// every replica out of its load balancer at once while each can still
// serve what it holds. Database health is muster_database_up and the
// database_unreachable alarm instead.
func ServingReady(ev ReadyEvaluator, hub *stream.Hub) func(context.Context) error {
	return func(context.Context) error {
		switch {
		case !ev.Ready():
			return errors.New("the evaluator is rebuilding its state after a start")
		case hub.Views() == 0 && ev.Stats().Services > 0:
			return errors.New("no view has been published since start")
		}
		return nil
	}
}

func newFramesSent() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "muster_watch_frames_sent_total", Help: "Frames written to watch streams, by kind.",
	}, []string{"kind"})
}
