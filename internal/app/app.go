// Package app builds muster: every component, in the order data flows
// through them, and the workers that run them, started and stopped in one
// order. It is the only place that knows that order; `muster serve`,
// `muster dev` and the test harness (app/apptest) all build through it, so
// tests run production's components, wired as in production.
//
// Construction runs upstream first, and nothing is bound after it: each
// component is handed only components already built.
//
//	database monitor, registry, authz copy     desired state
//	policy.InForce                             the overrides in force (a copy of policy's table)
//	evaluator                                  verdicts; follows the registry
//	lease reaper                               asks the evaluator to corroborate expiries
//	policy (overrides), sweeper, shifts        budgets counted on the evaluator's snapshot
//	hub, guard log, publisher                  assembles policy.Applied: verdicts + overrides in force
//	admission, census                          the streaming tier's intake
//	UI, HTTP server, DNS zone, xDS             the surfaces
//
// Data flows downstream only, and where a downstream component must learn
// of a change upstream it pulls: the publisher takes the evaluator's
// changes (evaluator.TakeChanges), reads the shift-backs' revision and
// the services whose overrides changed (policy.InForce); the overrides
// reach the assembler's input from policy directly (policy.Applied), and
// the evaluator reads the same copy for what it shows. The one push left, the
// registration hand-off, is a subscription the downstream makes at its
// own construction (evaluator.New calls registry.Follow, as
// NewAuthzCache hands itself to its registry), not a closure assigned
// later.
//
// Workers keep the project's one shape (Start, Stop) and stop in order:
// stop admitting (not ready, the census reports a last time), drain the
// streams (watch and xDS), stop HTTP, stop the workers (the evaluator first, so it
// flushes its transitions and windows while the pool is open), and close
// the UI; the caller closes the pool.
package app

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/breakglass"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/federation"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/guardlog"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/lagstats"
	"github.com/musterhq/muster/internal/notify"
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/preview"
	"github.com/musterhq/muster/internal/publisher"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/routingcontrol"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/webui"
	"github.com/musterhq/muster/internal/xds"
	"github.com/musterhq/muster/internal/zonehistory"
	"github.com/musterhq/muster/server"
)

// DefaultShutdownGrace is Config.ShutdownGrace's default.
const DefaultShutdownGrace = 25 * time.Second

// DefaultFollowWindows is how often a replica reads the observed windows
// the other replicas write, for the services it does not evaluate: its
// state of them is then at most a flush (10 s), this and the follower's
// settle margin (5 s) behind their owners'.
const DefaultFollowWindows = 2 * time.Second

// Names of the workers, for Start's hold list and Worker.
const (
	WorkerMonitor   = "database-monitor"
	WorkerOverrides = "overrides-in-force"
	WorkerAuthz     = "authz"
	WorkerCensus    = "census"
	// WorkerOwnership keeps this replica's share of the region's shards
	// (internal/ownership): only a service's owner reaps its leases,
	// writes its windows and transitions, and publishes it.
	WorkerOwnership = "ownership"
	WorkerReaper    = "lease-reaper"
	WorkerShifts    = "shifts"
	WorkerSweeper   = "override-sweeper"
	WorkerGuards    = "guardlog"
	WorkerPublisher = "publisher"
	WorkerEvaluator = "evaluator"
	WorkerRefusals  = "refused-evidence"
	// WorkerBreakGlass lists the live break-glass grants for their
	// alarms.
	WorkerBreakGlass = "breakglass"
	// WorkerAuthFailures summarises authentication failures into the
	// audit log.
	WorkerAuthFailures = "auth-failures"
	WorkerDNS          = "dns"
	WorkerXDS          = "xds"
	// WorkerXDSRefusals summarises xDS refusals for a limit per
	// principal into the audit log.
	WorkerXDSRefusals = "xds-refusals"
	// WorkerZoneHistory samples every zone for the UI's sparklines.
	WorkerZoneHistory = "zone-history"
	// WorkerProberHistory samples every prober's reach likewise.
	WorkerProberHistory = "prober-history"
	// WorkerReconcilePrefix and a source's name name its worker.
	WorkerReconcilePrefix = "reconcile "
	// WorkerReconcileDiff keeps muster_reconcile_diff current.
	WorkerReconcileDiff = "reconcile-diff"

	// WorkerForward mirrors accepted evidence to the region's other
	// replicas (internal/forward); built only with a signing key.
	WorkerForward = "evidence-forward"
)

// Worker is the project's one worker shape.
type Worker interface {
	Start(ctx context.Context) error
	Stop()
}

// NamedWorker is a worker added by the caller (Config.Workers).
type NamedWorker struct {
	Name   string
	Worker Worker
}

// Config configures an App. The component configurations carry their
// tuning (limits, periods, thresholds); the fields that connect one
// component to another are set by New and are ignored here, but for a
// component's clock and the evaluator's DatabaseUp and MayResolve, which
// a test may set to stand in for the app's.
type Config struct {
	// Pool is the shared pool. MonitorPool is the database monitor's own
	// (one connection): on the shared pool, a burst of slow requests
	// holding every connection would read as an outage.
	Pool, MonitorPool *pgxpool.Pool
	// Region is this muster's region.
	Region string
	// Replica is this replica's name in the stream census and in the
	// region's shard ownership; Address is where peers reach it.
	Replica string
	Address string
	// Ownership tunes the shard leases (TTL, Interval, Margin); the rest
	// is filled in.
	Ownership ownership.Config
	// Now is the clock of the registry, evaluator, policy, shifts, hub,
	// publisher, UI and the server's per-identity limits, unless their own
	// configuration sets one (the database monitor keeps the wall clock);
	// time.Now when nil.
	Now     func() time.Time
	Logger  *slog.Logger
	Metrics *prometheus.Registry

	Registry  registry.Config
	Authz     registry.AuthzCacheConfig
	Evaluator evaluator.Config
	Reaper    registry.ReaperConfig
	Policy    policy.Config
	Shifts    shift.Config
	Hub       stream.Config
	// ShutdownGrace bounds Shutdown once Serve's context ends: the drain
	// of the watch and xDS streams, HTTP's shutdown and the workers'
	// flushes. 25 s by default, inside Kubernetes' default termination
	// grace period of 30 s (MUSTER_SHUTDOWN_GRACE).
	ShutdownGrace time.Duration
	Publisher     publisher.Config
	Admission     stream.AdmissionConfig
	Census        stream.CensusConfig
	// KeyWatch tunes the running check of the region's keys against the
	// live rows' seals (seal_key_mismatch).
	KeyWatch KeyWatchConfig
	// Refusals tunes the summaries of refused evidence in the audit log
	// (its Log, Logger and Registerer are the app's).
	Refusals audit.RefusalSummariesConfig
	// BreakGlass tunes the break-glass grants (its Audience; the Pool,
	// Region, Keys, Now, Logger and Registerer are the app's). Only with
	// the region's signing key (Policy.Sealer).
	BreakGlass breakglass.Config
	// AuthFailures tunes the summaries of authentication failures (a
	// forged, expired, malformed or unknown issuer's token) in the audit
	// log: per source address per minute.
	AuthFailures audit.RefusalSummariesConfig
	// Server's Authenticator, DevIssuer, DevIssuerPath, DBTimeout,
	// MaxBodyBytes, Limits and Watch* settings are used as given.
	Server server.Config
	// UI, when set, mounts the admin web UI at its BasePath.
	UI *webui.Config
	// DNS, when set, serves the authoritative DNS zone (its Hub, Logger
	// and Registerer are the app's); nil: no DNS.
	DNS *dnszone.Config
	// XDS, when set, builds the xDS server (serve it with ServeXDS); its
	// Authenticator is Server's unless set.
	XDS *xds.Config
	// Reconcile, when it has sources, reconciles them into the registry,
	// one worker per source named "reconcile <source>"; its
	// Registry, Evidence, Logger and Registerer are the app's.
	Reconcile reconcile.Config
	// Relay tunes the relay from peer replicas (its Hub, Signer, Logger
	// and Registerer are the app's; Peers the live replicas unless set).
	Relay relay.Config
	// ClockSkewAlarm is the skew between this replica's clock and
	// PostgreSQL's above which clock_skew is raised (db.DefaultSkewAlarm,
	// 2 s, when zero; MUSTER_CLOCK_SKEW_ALARM).
	ClockSkewAlarm time.Duration
	// Forward tunes the mirroring of accepted evidence to the region's
	// other replicas (its Signer, Peers, Logger and Registerer are the
	// app's). Off without Policy.Sealer: replicas cannot prove themselves.
	Forward forward.Config
	// RoutingControl, when set, reads the out-of-band region routing
	// controls (ADR-14) from its Source; served by GET
	// /v1/routing-controls, with its alarms. Its Audit, Logger, Registerer
	// and Replica are the app's; this muster's Region is a known region.
	RoutingControl *routingcontrol.Config
	// Federation follows the peer regions (ADR-14): one worker
	// per peer, named "federation <peer>". Its Region, Audit, Owns,
	// Logger, Registerer and Now are the app's. No Peers: none.
	Federation federation.Config
	// Notify, when set, sends the alarms to the owning teams' and the
	// platform's notification targets (internal/notify); its
	// Alarms, Owner, Logger and Registerer are the app's, its Region the
	// app's unless set.
	Notify *notify.Config
	// Workers are started after muster's own and stopped right after the
	// evaluator, before the publisher: an audit checkpoint, say.
	Workers []NamedWorker
	// Peers are the base URLs of the region's other replicas, for a start
	// while PostgreSQL is unreachable (StartFromPeers): the relay follows
	// them until the ownership worker has read the live replicas, and the
	// authorisation copy is taken from them. Needs the region's signing
	// key. Empty: such a start is refused.
	Peers []string
	// PeerUpgrade is MUSTER_PEER_TRUST=upgrade, for a rolling upgrade from
	// the release before, which neither seals its row of table replicas
	// nor signs its requests the new way: this replica also believes
	// unsealed rows and accepts that release's request signatures, also
	// signs its own requests that way beside the new one, and raises
	// peer_trust_upgrade until it is restarted in strict mode (the
	// default). Other components read it to accept what that release
	// sends unsigned.
	PeerUpgrade bool
	// PeerAllowHTTP is MUSTER_PEER_ALLOW_HTTP: replicas at plain-http
	// addresses off loopback are followed and sent evidence (a lab).
	PeerAllowHTTP bool
}

// App is muster, built. Its fields are the components, for the commands
// and the tests that step them; they must not be replaced.
type App struct {
	Registry  *registry.Registry
	Authz     *registry.AuthzCache
	Monitor   *db.Monitor
	InForce   *policy.InForce
	Evaluator *evaluator.Evaluator
	Reaper    *registry.Reaper
	Policy    *policy.Service
	Sweeper   *policy.Sweeper
	Shifts    *shift.Service
	Hub       *stream.Hub
	Guards    *guardlog.Log
	Publisher *publisher.Publisher
	Admission *stream.Admission
	Census    *stream.Census
	// Ownership keeps this replica's share of the region's shards.
	Ownership *ownership.Manager
	// Fence binds what this replica writes as an owner to the tenure it
	// decided under (internal/fence).
	Fence *fence.Fence
	// RoutingControlReconciler keeps this region's drain and return in
	// step with the routing control (WorkerRoutingControlReconcile); nil
	// without a routing control or a region.
	RoutingControlReconciler *RoutingControlReconciler
	// Relay follows the peer replicas' publications; nil without the
	// region's signing key.
	Relay *relay.Relay
	// Forwarder mirrors accepted evidence to the other live replicas; nil
	// without a signing key.
	Forwarder *forward.Forwarder
	Refusals  *audit.RefusalSummaries
	KeyWatch  *KeyWatch
	// AuthFailures summarises authentication failures into the audit log.
	AuthFailures *audit.RefusalSummaries
	// OwnerReads answers reads of evaluator state from each service's
	// owner (eligibility, quarantines, the UI's counts, contract
	// previews).
	OwnerReads *ownerread.Reader
	// BreakGlass takes break-glass tokens and alarms live grants; nil
	// without the region's signing key.
	BreakGlass *breakglass.Service
	// Reconcile is nil unless Config.Reconcile has sources.
	Reconcile *reconcile.Reconciler
	// RoutingControls is nil unless Config.RoutingControl is set.
	RoutingControls *routingcontrol.Controls
	// Federation follows the peer regions; nil without any.
	Federation *federation.Federation
	UI         *webui.UI
	Server     *server.Server
	// Notifier is nil unless Config.Notify was set.
	Notifier *notify.Notifier
	// XDS is nil unless Config.XDS was set.
	XDS *xds.Server
	// XDSRefusals summarises xDS refusals for a limit into the audit log;
	// nil unless Config.XDS was set.
	XDSRefusals *audit.RefusalSummaries
	// ZoneHistory samples every zone's published state for the admin
	// UI's sparklines.
	ZoneHistory *zonehistory.History
	// ProberHistory samples every prober's reach likewise.
	ProberHistory *zonehistory.History
	// Lags keeps each service's withdrawal and delivery lags for the
	// admin UI's histograms.
	Lags    *lagstats.Recorder
	Metrics *prometheus.Registry

	// DNS is the DNS zone when Config.DNS is set.
	DNS *dnszone.Server

	log     *slog.Logger
	clock   func() time.Time // Config.Now
	grace   time.Duration    // Config.ShutdownGrace
	ready   atomic.Bool
	workers []worker // in start order
	// startedAt is when Start ran (UnixNano): the relay's opening
	// snapshots are awaited for at most relaySyncWait from there.
	startedAt atomic.Int64

	// fromPeers: started without the database (StartFromPeers); readOnly
	// until Resume has started every worker.
	fromPeers, readOnly atomic.Bool
	peerAuthz           *peerAuthzWorker
	// peerUpgradeSince is when this replica started in upgrade mode
	// (Config.PeerUpgrade; zero: strict), for peer_trust_upgrade.
	peerUpgradeSince time.Time
	// lifecycle orders Resume and Shutdown: no worker starts once the
	// shutdown has begun (shut).
	lifecycle sync.Mutex
	shut      bool

	mu      sync.Mutex
	started map[string]bool
}

type worker struct {
	name string
	w    Worker
	// detached workers run on a context the caller's cancellation does
	// not end: they are stopped explicitly, after HTTP, so they can flush.
	detached bool
}

// stopOrder is the order workers stop in: the census (Shutdown stops it
// before the streams drain), the notifier (it only reads alarms), the surfaces (xDS, the DNS zone: they answer
// until HTTP has stopped), the reconciliation workers (they write the
// registry and feed the evaluator readiness evidence, so they stop before
// it), the evaluator (it flushes transitions and
// windows), the refused-evidence and authentication-failure summaries
// (their last rows, before the
// caller's audit checkpoint covers them), the caller's (""), then the
// rest downstream to upstream, the guard log last (it records the
// publisher's last events).
var stopOrder = []string{WorkerCensus, WorkerNotify, WorkerBreakGlass, WorkerRelay, stopFederation, WorkerXDS, WorkerXDSRefusals, WorkerDNS, stopReconcile, WorkerEvaluator, WorkerForward, WorkerRefusals, WorkerAuthFailures, WorkerRoutingControlReconcile, WorkerRoutingControl, "", WorkerOwnership, WorkerPublisher, WorkerShifts, WorkerSweeper, WorkerReaper, WorkerOverrides, WorkerPeerAuthz, WorkerAuthz, WorkerMonitor, WorkerGuards}

// New builds muster in data-flow order. Nothing is started.
func New(cfg Config) (*App, error) {
	if cfg.Pool == nil || cfg.MonitorPool == nil {
		return nil, errors.New("app: Pool and MonitorPool are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	pool, log, metrics, now := cfg.Pool, cfg.Logger, cfg.Metrics, cfg.Now
	a := &App{log: log, clock: now, grace: cfg.ShutdownGrace, Metrics: metrics, started: map[string]bool{}}
	a.peerUpgradeSince = a.peerTrustMode(cfg)
	var err error

	// Desired state.
	// The monitor measures this replica's clock (the app's) against
	// PostgreSQL's at every ping (clock_skew).
	if a.Monitor, err = db.NewMonitor(db.MonitorConfig{Pool: cfg.MonitorPool, Logger: log, Registerer: metrics,
		Clock: now, SkewAlarm: cfg.ClockSkewAlarm}); err != nil {
		return nil, err
	}
	rc := cfg.Registry
	rc.Pool, rc.Region, rc.Logger, rc.Registerer = pool, cfg.Region, log.With("component", "registry"), metrics
	// One key per region seals instances, overrides and shifts alike.
	rc.Sealer, rc.SealKeys = cfg.Policy.Sealer, cfg.Policy.SealKeys
	// ... and is trusted through one seal.Trust, which a keyless replica
	// seals when it meets sealed rows (keywatch.go).
	trust := seal.NewTrust(cfg.Policy.SealKeys.With(cfg.Policy.Sealer))
	rc.Trust = trust
	rc.Now = orNow(rc.Now, now)
	if a.Registry, err = registry.New(rc); err != nil {
		return nil, err
	}
	ac := cfg.Authz
	ac.Registry, ac.Logger, ac.Registerer = a.Registry, log, metrics
	if a.Authz, err = registry.NewAuthzCache(ac); err != nil {
		return nil, err
	}
	// The overrides in force: only those muster sealed, when it has a key
	// (policy/seal.go); the policy Service seals with the same one.
	a.InForce = policy.NewInForce(policy.InForceConfig{Pool: pool, Now: now, RefreshEvery: cfg.Evaluator.RefreshEvery,
		DatabaseUp: a.Monitor.Up, Keys: cfg.Policy.SealKeys.With(cfg.Policy.Sealer), Trust: trust, Logger: log, Registerer: metrics})

	// Ownership: which services this replica evaluates for the record,
	// reaps and publishes.
	oc := cfg.Ownership
	oc.Pool, oc.ID, oc.Address, oc.Region, oc.Logger, oc.Registerer = pool, cfg.Replica, cfg.Address, cfg.Region, log, metrics
	// Its reading of table replicas is the region's membership for every
	// reader (relay, forwarder, census): only rows sealed by the region's
	// key are believed (unsealed ones too in upgrade mode).
	oc.Sealer, oc.Trust, oc.BelieveUnsealed, oc.AllowHTTP = cfg.Policy.Sealer, trust, cfg.PeerUpgrade, cfg.PeerAllowHTTP
	if oc.Ready == nil {
		// Dealt shards only once it can publish them (make before break).
		oc.Ready = func() bool { return a.canPublish(cfg.Region) }
	}
	if a.Ownership, err = ownership.New(oc); err != nil {
		return nil, err
	}
	// Every write made as an owner is checked, in its transaction, under
	// the tenure it was decided under.
	if a.Fence, err = fence.New(a.Ownership, metrics); err != nil {
		return nil, err
	}

	// Evaluation.
	ec := cfg.Evaluator
	ec.Registry, ec.Pool, ec.Logger, ec.Registerer = a.Registry, pool, log, metrics
	ec.Now = orNow(ec.Now, now)
	ec.Overrides = a.InForce
	// Windows and transitions are written by the owner, under its
	// tenure, or by anyone while no other replica is known to own the
	// service.
	ec.Fence = a.Fence
	if cfg.Policy.Sealer != nil && ec.Evaluates == nil {
		// With forwarding, a replica keeps only the evidence of the
		// services it owns (or is being offered), and follows the
		// windows their owners write for the others (docs/replicas.md,
		// "Evidence reaches the owner").
		ec.Evaluates = a.Ownership.Evaluates
		if ec.FollowEvery == 0 {
			ec.FollowEvery = DefaultFollowWindows
		}
	}
	if ec.Replica == "" {
		ec.Replica = a.Ownership.ID()
	}
	if ec.DatabaseUp == nil { // a test may stand in for the monitor
		ec.DatabaseUp = a.Monitor.Up
	}
	if ec.MayResolve == nil {
		// Passive evidence only from callers that may resolve the service.
		ec.MayResolve = a.Authz.MayResolve
	}
	if a.Evaluator, err = evaluator.New(ec); err != nil {
		return nil, err
	}
	// Reconciliation writes existence through the registry and hands
	// readiness evidence to the evaluator.
	if len(cfg.Reconcile.Sources) > 0 {
		rcc := cfg.Reconcile
		rcc.Registry, rcc.Evidence, rcc.Logger, rcc.Registerer = a.Registry, a.Evaluator, log, metrics
		rcc.Now = orNow(rcc.Now, now)
		// Every replica reads every source; the owner of the source's
		// shard alone applies it, under its tenure.
		rcc.Fence, rcc.Key = a.Fence, ReconcileOwnershipKey
		if a.Reconcile, err = reconcile.New(rcc); err != nil {
			return nil, err
		}
	}
	rpc := cfg.Reaper
	rpc.Registry, rpc.Logger, rpc.Registerer = a.Registry, log, metrics
	rpc.Evidence = a.Evaluator.LeaseExpiryEvidence
	// A lease's clock runs only while renewals could land: from the
	// moment PostgreSQL answers again after an outage.
	rpc.UpSince = a.Monitor.UpSince
	// Nor while this replica is not ready (rebuilding after a start): the
	// grace after a start counts from readiness.
	rpc.Ready = func() bool { return a.ready.Load() && a.Evaluator.Ready() }
	// Only a service's owner expires its leases, under its tenure. Until
	// the ownership worker's first round (never past the reaper's grace
	// in a running process) it expires nothing either.
	rpc.Fence = a.Fence
	if a.Reaper, err = registry.NewReaper(rpc); err != nil {
		return nil, err
	}

	// Policy: budgets count on the evaluator's snapshot.
	pc := cfg.Policy
	pc.Pool, pc.Logger, pc.Registerer = pool, log.With("component", "policy"), metrics
	pc.Now = orNow(pc.Now, now)
	pc.Trust = trust
	pc.Verdicts, pc.InForce, pc.Services = a.Evaluator, a.InForce, a.Registry
	if a.Policy, err = policy.New(pc); err != nil {
		return nil, err
	}
	// A reconciled endpoint ends a live instance at its address only
	// within the budget an operator's deregistration needs.
	a.Registry.GateReplacements(a.Policy)
	a.Sweeper = policy.NewSweeper(a.Policy, 0)
	sc := cfg.Shifts
	sc.Pool, sc.Region, sc.Logger, sc.Registerer = pool, cfg.Region, log, metrics
	sc.Sealer, sc.SealKeys, sc.Trust = cfg.Policy.Sealer, cfg.Policy.SealKeys, trust
	sc.Now = orNow(sc.Now, now)
	// A drain's budget counts the overrides in force, as the views do.
	applied := policy.Applied{Verdicts: a.Evaluator, InForce: a.InForce, Now: now}
	sc.Verdicts = applied
	// A region drain moves clients to the peer regions that can take
	// them, or is refused.
	if sc.Fallback == nil {
		sc.Fallback = a.fallbackRegions
	}
	if a.Shifts, err = shift.New(sc); err != nil {
		return nil, err
	}

	// Assembly and propagation.
	hc := cfg.Hub
	hc.Now = orNow(hc.Now, now)
	a.Hub = stream.NewHub(hc)
	a.Guards = guardlog.New(pool, log)
	pbc := cfg.Publisher
	pbc.Snapshot, pbc.Changes, pbc.Traffic, pbc.Overrides = applied.Snapshot, a.Evaluator, a.Shifts, a.InForce
	pbc.Ready = a.Evaluator.Ready
	a.Lags = lagstats.New()
	pbc.Hub, pbc.Pool, pbc.Logger, pbc.Registerer, pbc.Lags = a.Hub, pool, log, metrics, a.Lags
	pbc.Now = orNow(pbc.Now, now)
	pbc.GuardEvents = a.Guards.Record
	// Only a service's owner publishes it; one whose tenure lapsed while
	// PostgreSQL is unreachable goes on (ownership.Manager.Publishes).
	pbc.Owns, pbc.Services = a.Ownership.Publishes, a.Evaluator.Services
	pbc.HandingOver = a.Ownership.HandingOver
	// A replica dealt a service has followed its owner's windows; the
	// admissions the owner recorded are restored before it publishes.
	pbc.Adopting = func(ctx context.Context, owns func(string) bool) error {
		_, err := a.Evaluator.RestoreAdmissions(ctx, owns)
		return err
	}
	// Views are signed by the region's key as the owner publishes them,
	// each epoch recorded as the tenures of the shards held.
	pbc.Signer, pbc.Replica, pbc.ViewKeys = cfg.Policy.Sealer, cfg.Replica, cfg.Policy.SealKeys
	pbc.ShardOf = a.shardOf
	// In a rolling upgrade from the release before (which signs nothing)
	// its saved views may be restored unsigned.
	pbc.AcceptUnsigned = pbc.AcceptUnsigned || cfg.PeerUpgrade
	if cfg.Policy.Sealer == nil {
		// Without the region's key replicas cannot relay to each other
		// (buildRelay), so each publishes every service itself, as
		// before replicas relayed views: a subscriber's replica must hold every view.
		pbc.Owns, pbc.Services, pbc.HandingOver, pbc.Adopting = nil, nil, nil, nil
	}
	if a.Publisher, err = publisher.New(pbc); err != nil {
		return nil, err
	}
	a.Ownership.OnChange(a.Publisher.OwnershipChanged)
	a.Ownership.OnLapseEnd(a.Publisher.LapseEnded)
	a.Admission = stream.NewAdmission(cfg.Admission)
	cc := cfg.Census
	cc.Pool, cc.Replica, cc.Hub, cc.Admission, cc.Logger = pool, cfg.Replica, a.Hub, a.Admission, log
	cc.ReplicaTTL = cfg.Ownership.TTL // who is alive, as the shard balance sees it (0: the default both share)
	// ... and only the replicas whose rows it believes.
	cc.Members = func() []string {
		var ids []string
		for _, r := range a.Ownership.Region().Replicas {
			ids = append(ids, r.ID)
		}
		return ids
	}
	if a.Census, err = stream.NewCensus(cc); err != nil {
		return nil, err
	}
	peers, err := a.buildRelay(cfg)
	if err != nil {
		return nil, err
	}

	// Surfaces.
	sumc := cfg.Refusals
	sumc.Log, sumc.Logger, sumc.Registerer = audit.NewLog(pool), log, metrics
	sumc.Now = orNow(sumc.Now, now)
	if a.Refusals, err = audit.NewRefusalSummaries(sumc); err != nil {
		return nil, err
	}
	afc := cfg.AuthFailures
	afc.Log, afc.Logger, afc.Registerer = audit.NewLog(pool), log, metrics
	afc.Now = orNow(afc.Now, now)
	if a.AuthFailures, err = audit.NewAuthFailureSummaries(afc); err != nil {
		return nil, err
	}
	svc := cfg.Server
	svc.RefusedEvidence, svc.AuthFailures = a.Refusals, a.AuthFailures
	// A replica started without its database serves the views its peers
	// relayed (StartFromPeers) until its own rebuild is done.
	servingReady := a.viewsReady(server.ServingReady(a.Evaluator, a.Hub))
	svc.Logger, svc.Registry, svc.Policy, svc.Audit, svc.Evaluator, svc.Metrics = log, a.Registry, a.Policy, audit.NewLog(pool), a.Evaluator, metrics
	svc.Hub, svc.Admission, svc.Alarms, svc.Probers, svc.Shifts, svc.Leases = a.Hub, a.Admission, a.Publisher, a.Evaluator, a.Shifts, a.Reaper
	svc.Lags = a.Lags
	svc.Replicas, svc.EpochsLeft = a.Ownership, a.Publisher.EpochsLeft
	svc.Region = cfg.Region
	if len(cfg.Federation.Peers) > 0 {
		fc := cfg.Federation
		fc.Region, fc.Audit, fc.Logger, fc.Registerer = cfg.Region, audit.NewLog(pool), log, metrics
		// One replica of the region writes a peer's reconciliation rows:
		// the owner of its key; every replica follows for its own reads.
		fc.Owns = func(key string) bool { _, ok := a.Ownership.Owns(key); return ok }
		// ... and writes them under its tenure of that key.
		fc.Audit = ownerAudit{pool: pool, fence: a.Fence, writer: "federation-reconcile",
			key: func(e audit.Entry) string { return federation.OwnershipKey(e.Target) }}
		fc.Now = orNow(fc.Now, now)
		if a.Federation, err = federation.New(fc); err != nil {
			return nil, err
		}
		svc.Regions = a.Federation.Aggregate
		// Cross-region resolution: the peers' views reach this region's
		// watch streams as remote series of the hub.
		a.Federation.Aggregate.SetSink(func(frames []*stream.Frame) { a.Hub.PublishRemote(frames) })
	}
	svc.Authz, svc.Database = a.Authz, a.Monitor
	svc.ReadOnly = a.ReadOnly
	if peers != nil {
		svc.Peers, svc.Relay = peers, a.Relay
	}
	svc.Now = orNow(svc.Now, now)
	// Rows written outside muster: overrides, instances, contracts,
	// services and grants, and the authorisation copy's held reloads
	// (shifts list theirs with their other alarms).
	trusted := seal.Keys(nil)
	if cfg.Policy.Sealer != nil {
		trusted = cfg.Policy.SealKeys.With(cfg.Policy.Sealer)
	}
	// Evidence reaches the replica that keeps it (each service's owner,
	// and the replica offered it during a move), signed and checked with
	// the region's key.
	if cfg.Policy.Sealer != nil {
		fc := cfg.Forward
		fc.Signer = peer.Signer{ID: cfg.Replica, Key: cfg.Policy.Sealer, Now: now, V1: cfg.PeerUpgrade}
		fc.Peers = func() []forward.Peer {
			var out []forward.Peer
			for _, r := range livePeers(a.Ownership.Region(), cfg.Region) {
				out = append(out, forward.Peer{ID: r.ID, Address: r.Address})
			}
			return out
		}
		fc.Route, fc.ShardRoute = a.Ownership.EvidenceRoute, a.Ownership.ShardRoute
		fc.Local = func(actor identity.Principal, reports []evaluator.Report) {
			ctx, cancel := context.WithTimeout(context.Background(), forward.DefaultTimeout)
			defer cancel()
			if _, err := a.Evaluator.IngestForwarded(ctx, actor, reports); err != nil {
				log.Warn("recent evidence of a shard this replica now keeps not taken", "items", len(reports), "err", err)
			}
		}
		fc.Logger, fc.Registerer, fc.Now = log, metrics, orNow(fc.Now, now)
		if a.Forwarder, err = forward.New(fc); err != nil {
			return nil, err
		}
		svc.Forwarder = a.Forwarder
	} else {
		log.Info("no signing key: evidence is neither forwarded to the region's other replicas nor taken from them")
	}
	if err := a.buildOwnerReads(cfg, &svc); err != nil {
		return nil, err
	}
	if a.KeyWatch, err = NewKeyWatch(cfg.KeyWatch, pool, trusted, trust, now, log, metrics); err != nil {
		return nil, err
	}
	// Break glass: a token the region's key signed for a sealed, live
	// grant is an operator's (internal/breakglass); every other token
	// goes to the issuers as before.
	if cfg.Policy.Sealer != nil && svc.Authenticator != nil {
		bc := cfg.BreakGlass
		bc.Pool, bc.Region, bc.Keys, bc.Logger, bc.Registerer = pool, cfg.Region, trusted, log, metrics
		bc.Now = orNow(bc.Now, now)
		if a.BreakGlass, err = breakglass.New(bc); err != nil {
			return nil, err
		}
		svc.Authenticator = a.BreakGlass.Wrap(svc.Authenticator)
	}
	svc.Tampering = func() []assembler.Alarm {
		return slices.Concat(a.InForce.Alarms(), a.Evaluator.SealAlarms(), a.Authz.Alarms(), a.KeyWatch.Alarms(), a.Registry.ConfirmationAlarms(),
			a.BreakGlass.Alarms())
	}
	svc.ReplicaAlarms = a.replicaAlarms
	if a.Reconcile != nil {
		svc.Reconcile = a.Reconcile
	}
	if err := a.buildRoutingControl(cfg, audit.NewLog(pool)); err != nil {
		return nil, err
	}
	if a.RoutingControls != nil {
		svc.RoutingControls = a.RoutingControls
		a.actOnRoutingControl(cfg.Region)
		if cfg.Region != "" {
			a.RoutingControlReconciler = &RoutingControlReconciler{a: a, region: cfg.Region, now: now,
				every: cmp.Or(cfg.Shifts.Dwell, shift.DefaultDwell)}
			svc.RoutingControls = routingControlsWithReturns{Controls: a.RoutingControls, returns: a.RoutingControlReconciler}
		}
	}
	// Whether this replica can serve views, not whether PostgreSQL
	// answers (that is muster_database_up and database_unreachable).
	svc.Ready = func(ctx context.Context) error {
		if !a.ready.Load() {
			return errors.New("starting or stopping")
		}
		if a.Relay != nil {
			// Cut off from every peer while others follow them: behind
			// on every service it does not own (relay.Relay.Ready).
			if err := a.Relay.Ready(); err != nil {
				return err
			}
		}
		return servingReady(ctx)
	}
	// The histories live in PostgreSQL, written by the owner of each
	// kind's shard, so a restart keeps them and every replica draws the
	// same points.
	if a.ZoneHistory, err = zonehistory.New(zonehistory.Config{Read: a.zoneCounts, Now: now,
		Pool: pool, Kind: zonehistory.KindZone, Fence: a.Fence, Logger: log}); err != nil {
		return nil, err
	}
	if a.ProberHistory, err = zonehistory.New(zonehistory.Config{Read: a.proberReach, Now: now,
		Pool: pool, Kind: zonehistory.KindProber, Fence: a.Fence, Logger: log}); err != nil {
		return nil, err
	}
	if cfg.UI != nil {
		uc := *cfg.UI
		uc.ZoneHistory, uc.ZoneHistoryEvery = a.ZoneHistory, 30*time.Second
		uc.ProberHistory = a.ProberHistory
		uc.Lags, uc.Hub = a.Lags, a.Hub
		uc.Logger, uc.Pool, uc.Registry, uc.Evaluator, uc.Publisher, uc.Audit = log, pool, a.Registry, a.OwnerReads, a.Publisher, audit.NewLog(pool)
		uc.Overrides, uc.InForce, uc.Guards, uc.Shifts = a.Policy, a.InForce, a.Guards, a.Shifts
		uc.ContractPreview = func(ctx context.Context, actor identity.Principal, service string, c registry.Contract) (preview.Result, error) {
			pv, err := a.Registry.PreviewContract(ctx, actor, service, c)
			if err != nil {
				return preview.Result{}, err
			}
			return a.OwnerReads.PreviewContract(ctx, pv)
		}
		if a.Reconcile != nil {
			uc.Reconcile = a.Reconcile
		}
		uc.Now = orNow(uc.Now, now)
		// The banner lists what GET /v1/alarms lists.
		uc.Alarms = server.AlarmsOf(svc)
		uc.Ownership = a.Ownership
		uc.EpochsLeft = a.Publisher.EpochsLeft
		uc.Region = cfg.Region
		if a.Federation != nil {
			uc.PeerRegions, uc.PeerStaleAfter = a.Federation.Aggregate, cmp.Or(cfg.Federation.StaleAfter, federation.DefaultStaleAfter)
		}
		if a.RoutingControls != nil {
			uc.RoutingControls = a.RoutingControls
		}
		if a.Relay != nil {
			uc.Relay = a.Relay
		}
		uc.Removals = &webui.Removals{
			Holds:      func() []disbelief.Hold { return server.RemovalHolds(&svc) },
			LeaseGrace: a.Reaper.InGrace,
			Confirm: func(ctx context.Context, actor identity.Principal, gate, scope, reason string) (any, error) {
				return server.ConfirmRemoval(ctx, &svc, actor, gate, scope, reason)
			},
		}
		if a.UI, err = webui.New(uc); err != nil {
			return nil, err
		}
		svc.UI, svc.UIPath = a.UI, a.UI.BasePath()
	}
	if a.Server, err = server.New(svc); err != nil {
		a.closeUI()
		return nil, err
	}
	if err := metrics.Register(newAlarmsOpen(server.AlarmsOf(svc))); err != nil {
		a.closeUI()
		return nil, fmt.Errorf("register muster_alarms_open: %w", err)
	}
	if err := a.buildNotifier(cfg, svc); err != nil {
		a.closeUI()
		return nil, err
	}
	if cfg.DNS != nil {
		dc := *cfg.DNS
		dc.Hub, dc.Logger, dc.Registerer = a.Hub, log, metrics
		if len(dc.Regions) == 0 && a.Federation != nil {
			dc.Regions = a.Federation.Aggregate.Peers()
		}
		// Served once views are, as /readyz says: a rebuilding muster's
		// empty zone would say no service exists.
		dc.Ready = func() bool { return servingReady(context.Background()) == nil }
		if a.DNS, err = dnszone.New(dc); err != nil {
			a.closeUI()
			return nil, err
		}
	}

	if cfg.XDS != nil {
		xc := *cfg.XDS
		xc.Hub, xc.Admission, xc.Authz, xc.Logger, xc.Registerer = a.Hub, a.Admission, a.Authz, log, metrics
		xc.Lags = a.Lags
		if xc.Authenticator == nil {
			xc.Authenticator = cfg.Server.Authenticator
		}
		if xc.AuthFailures == nil {
			xc.AuthFailures = a.AuthFailures
		}
		if xc.Refusals == nil {
			rc := audit.RefusalSummariesConfig{Log: audit.NewLog(pool), Logger: log, Registerer: metrics, Now: now}
			if a.XDSRefusals, err = audit.NewXDSRefusalSummaries(rc); err != nil {
				a.closeUI()
				return nil, err
			}
			xc.Refusals = a.XDSRefusals
		}
		xc.Now = orNow(xc.Now, now)
		if xc.Region == "" {
			xc.Region = cfg.Region
		}
		if a.Federation != nil && xc.MayResolveRemote == nil {
			// xDS priorities across regions: a service's
			// assignment falls back to the peer regions in configuration
			// order, each as far as its grants let the node resolve it.
			if xc.Regions == nil {
				for _, p := range cfg.Federation.Peers {
					xc.Regions = append(xc.Regions, p.Name)
				}
			}
			xc.MayResolveRemote = mayResolveRemote(a.Federation.Aggregate)
		}
		if xc.Ready == nil {
			// Answer for what exists only once it is known: a node told
			// nothing exists drops what it routes on.
			xc.Ready = func() bool {
				_, loaded := a.Authz.Age()
				return loaded && servingReady(context.Background()) == nil
			}
		}
		if a.XDS, err = xds.New(xc); err != nil {
			a.closeUI()
			return nil, err
		}
	}

	// The workers, in start order. The census reads the expected
	// population before the first watch request can arrive, so a
	// restarted replica admits by the clients coming back, not by the
	// nothing it remembers. Shifts load before the publisher starts, so
	// the first views after a restart already carry every drained zone.
	a.workers = []worker{
		{name: WorkerMonitor, w: a.Monitor},
	}
	if a.peerAuthz != nil {
		a.workers = append(a.workers, worker{name: WorkerPeerAuthz, w: a.peerAuthz})
	}
	a.workers = append(a.workers, []worker{
		{name: WorkerAuthz, w: a.Authz},
		{name: WorkerOverrides, w: a.InForce},
		{name: WorkerCensus, w: a.Census},
		{name: WorkerOwnership, w: a.Ownership, detached: true},
		{name: WorkerReaper, w: a.Reaper},
		{name: WorkerShifts, w: a.Shifts},
		{name: WorkerSweeper, w: a.Sweeper},
		{name: WorkerGuards, w: a.Guards, detached: true},
		{name: WorkerPublisher, w: a.Publisher, detached: true},
		{name: WorkerEvaluator, w: a.Evaluator, detached: true},
		{name: WorkerRefusals, w: a.Refusals, detached: true},
		{name: WorkerKeyWatch, w: a.KeyWatch},
		{name: WorkerAuthFailures, w: a.AuthFailures, detached: true},
		{name: WorkerZoneHistory, w: a.ZoneHistory, detached: true},
		{name: WorkerProberHistory, w: a.ProberHistory, detached: true},
	}...)
	if a.Relay != nil {
		a.workers = append(a.workers, worker{name: WorkerRelay, w: a.Relay, detached: true})
	}
	if a.Forwarder != nil {
		a.workers = append(a.workers, worker{name: WorkerForward, w: a.Forwarder, detached: true})
	}
	if a.DNS != nil {
		a.workers = append(a.workers, worker{name: WorkerDNS, w: a.DNS, detached: true})
	}
	if a.XDS != nil {
		a.workers = append(a.workers, worker{name: WorkerXDS, w: a.XDS})
	}
	if a.XDSRefusals != nil {
		a.workers = append(a.workers, worker{name: WorkerXDSRefusals, w: a.XDSRefusals, detached: true})
	}
	if a.Reconcile != nil {
		for _, w := range a.Reconcile.Workers() {
			a.workers = append(a.workers, worker{name: WorkerReconcilePrefix + w.Name(), w: w, detached: true})
		}
		a.workers = append(a.workers, worker{name: WorkerReconcileDiff, w: a.Reconcile.DiffWorker(), detached: true})
	}
	if a.RoutingControls != nil {
		a.workers = append(a.workers, worker{name: WorkerRoutingControl, w: a.RoutingControls, detached: true})
		if cfg.Region != "" {
			a.workers = append(a.workers, worker{name: WorkerRoutingControlReconcile, w: a.RoutingControlReconciler, detached: true})
		}
	}
	if a.Federation != nil {
		for _, f := range a.Federation.Followers() {
			a.workers = append(a.workers, worker{name: f.Name(), w: f, detached: true})
		}
	}
	if a.Notifier != nil {
		a.workers = append(a.workers, worker{name: WorkerNotify, w: a.Notifier, detached: true})
	}
	if a.BreakGlass != nil {
		a.workers = append(a.workers, worker{name: WorkerBreakGlass, w: a.BreakGlass, detached: true})
	}
	for _, w := range cfg.Workers {
		if w.Name == "" || w.Worker == nil || slices.ContainsFunc(a.workers, func(x worker) bool { return x.name == w.Name }) {
			return nil, fmt.Errorf("app: worker %q needs a name of its own and a worker", w.Name)
		}
		a.workers = append(a.workers, worker{name: w.Name, w: w.Worker, detached: true})
	}
	return a, nil
}

// Start starts the workers in order, but for those named in hold (tests
// step them themselves). On a failure it stops those it started and
// closes the UI.
func (a *App) Start(ctx context.Context, hold ...string) error {
	a.startedAt.Store(time.Now().UnixNano())
	return a.startWorkers(ctx, func(name string) bool {
		// The authorisation copy from the peers is for StartFromPeers only.
		return !slices.Contains(hold, name) && name != WorkerPeerAuthz
	})
}

// startWorkers starts, in order, the workers start says to. On a failure
// it stops every worker and closes the UI.
func (a *App) startWorkers(ctx context.Context, start func(name string) bool) error {
	for _, w := range a.workers {
		if !start(w.name) {
			continue
		}
		wctx := ctx
		if w.detached {
			// Not ended by the caller's cancellation: stopped explicitly
			// after HTTP, so it can flush.
			wctx = context.WithoutCancel(ctx)
		}
		if err := w.w.Start(wctx); err != nil {
			a.stopWorkers()
			a.closeUI()
			return fmt.Errorf("start %s: %w", w.name, err)
		}
		a.mu.Lock()
		a.started[w.name] = true
		a.mu.Unlock()
	}
	return nil
}

// SetReady says whether the replica admits traffic: /readyz answers ready
// only while it is set and views can be served.
func (a *App) SetReady(ready bool) { a.ready.Store(ready) }

// Serve serves a's HTTP surface on ln until ctx ends or serving fails,
// then shuts down (Shutdown). serving, when set, is called once requests
// are being served and the replica is ready.
func (a *App) Serve(ctx context.Context, ln net.Listener, serving func()) error {
	hs := &http.Server{
		Handler:           a.Server,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	// Renewals can land from now on: every lease gets a full TTL from
	// here, however long this process (or its database) was away.
	a.Reaper.HearingFrom(time.Now())
	a.SetReady(true)
	if serving != nil {
		serving()
	}
	var err error
	select {
	case err = <-serveErr:
		err = fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	a.log.Info("shutting down")
	shutCtx, cancel := context.WithTimeout(context.Background(), a.grace)
	defer cancel()
	return errors.Join(err, a.Shutdown(shutCtx, hs.Shutdown))
}

// relaySyncWait bounds how long a replica that has peers waits for one
// of their opening snapshots before it takes shards anyway: the newest
// view is restored from published_views too (saved every second), so
// the relay only makes the first delta smaller; an unreachable peer must
// not keep a replica from ever owning anything.
const relaySyncWait = 15 * time.Second

// canPublish says whether this replica could publish what it would be
// dealt, the readiness the ownership balance asks for: it serves HTTP
// (so its peers can relay what it publishes), its evaluator has rebuilt,
// its publisher is prepared, and it holds its peers' views (or has none,
// or waited relaySyncWait for them).
func (a *App) canPublish(region string) bool {
	if !a.ready.Load() || !a.Evaluator.Ready() || !a.Publisher.Prepared() {
		return false
	}
	if a.Relay != nil && a.Relay.Ready() != nil {
		// Cut off from every peer that the others still hear: what it
		// publishes reaches none of their subscribers, so its shards go
		// to replicas that are heard (handed over through PostgreSQL,
		// which it still reaches), and come back once it hears them.
		return false
	}
	if a.Relay == nil || a.Relay.Synced() {
		return true
	}
	if time.Since(time.Unix(0, a.startedAt.Load())) > relaySyncWait {
		return true
	}
	return len(livePeers(a.Ownership.Region(), region)) == 0
}

// handOverTimeout bounds the handover before a graceful stop: the other
// replicas look at offers every 250 ms and adopt in well under a second;
// what they have not taken by then is released as before.
const handOverTimeout = 5 * time.Second

// handOver hands this replica's shards to the other ready replicas and
// goes on publishing them until their new owners have published each
// service (or handOverTimeout), so a graceful stop leaves no service
// unpublished even for a round. It returns at once for a replica that
// owns nothing (alone in its region, it keeps its shards until Release).
func (a *App) handOver(ctx context.Context) {
	if !a.Running(WorkerOwnership) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, handOverTimeout)
	defer cancel()
	start := time.Now()
	before := len(a.Ownership.Owned())
	left := a.Ownership.Handover(ctx)
	took := time.Since(start)
	for len(a.Publisher.HandingOver()) > 0 && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond): // polling the hub, bounded by ctx
		}
	}
	if before > 0 {
		a.log.Info("handed shards over before stopping", "shards", before-left, "kept", left,
			"taken_in", took.Round(time.Millisecond), "published_in", time.Since(start).Round(time.Millisecond),
			"not_yet_republished", len(a.Publisher.HandingOver()))
	}
}

// Shutdown stops a in order: stop admitting (not ready), hand the
// shards over to the other replicas and go on publishing until they have
// (handOver), let the census report the subscriber count a last time
// while the streams are still
// open, so the next process knows who is coming, drain the watch and xDS streams
// (subscribers are told to reconnect elsewhere with jitter), stop HTTP
// with stopHTTP, stop the workers (Config.Workers after the evaluator),
// close the UI. Safe to call twice.
func (a *App) Shutdown(ctx context.Context, stopHTTP func(context.Context) error) error {
	a.lifecycle.Lock()
	a.shut = true
	a.lifecycle.Unlock()
	a.SetReady(false)
	// Make before break: the other replicas own and publish this one's
	// services before its subscribers are let go.
	a.handOver(ctx)
	a.Census.Stop()
	a.Hub.Close()
	xdsDrained := make(chan struct{})
	go func() {
		defer close(xdsDrained)
		if a.XDS != nil {
			a.XDS.Drain(ctx)
		}
	}()
	if err := a.Server.WaitStreams(ctx); err != nil {
		a.log.Warn("watch streams still open at shutdown", "err", err)
	}
	<-xdsDrained
	var err error
	if stopHTTP != nil {
		if herr := stopHTTP(ctx); herr != nil {
			err = fmt.Errorf("http shutdown: %w", herr)
		}
	}
	a.stopWorkers()
	a.closeUI()
	return err
}

// stopWorkers stops every worker in stopOrder (Stop is safe on a worker
// that never started).
func (a *App) stopWorkers() {
	for _, name := range stopOrder {
		for _, w := range a.workers {
			slot := stopSlot(w.name)
			own := slices.Contains(stopOrder, slot)
			if (name == "" && !own) || (name != "" && slot == name) {
				w.w.Stop()
			}
		}
	}
	a.mu.Lock()
	clear(a.started)
	a.mu.Unlock()
}

// stopReconcile is the stop slot of every reconciliation worker.
const stopReconcile = "reconcile workers"

// WorkerFederationPrefix and a peer region's name name its follower.
const WorkerFederationPrefix = "federation "

// stopFederation is the stop slot of the peer regions' followers: they
// only read from the peers, so they stop early, with the relay.
const stopFederation = "federation workers"

// stopSlot is the name a worker stops under in stopOrder: its own, or
// stopReconcile for the reconciliation workers (one per source).
func stopSlot(name string) string {
	if name == WorkerReconcileDiff || strings.HasPrefix(name, WorkerReconcilePrefix) {
		return stopReconcile
	}
	if strings.HasPrefix(name, WorkerFederationPrefix) {
		return stopFederation
	}
	return name
}

func (a *App) closeUI() {
	if a.UI != nil {
		if err := a.UI.Close(); err != nil {
			a.log.Warn("close the web UI", "err", err)
		}
	}
}

// peerGrants is the federation aggregate's copy of the peer regions'
// grants.
type peerGrants interface {
	Granted(region, service, caller string) bool
}

// mayResolveRemote is xds.Config.MayResolveRemote over the peers'
// grants: /v1's rule for a remote series (server's mayResolveSeries),
// operators and tools by role, a workload for its own service or one the
// peer region granted its service.
func mayResolveRemote(g peerGrants) func(p identity.Principal, region, service string) bool {
	return func(p identity.Principal, region, service string) bool {
		return registry.MayResolveGranted(p, service, func(caller string) bool { return g.Granted(region, service, caller) }) == nil
	}
}

// ServeXDS serves xDS on ln until Shutdown drains it (or serving fails).
func (a *App) ServeXDS(ln net.Listener) error {
	if a.XDS == nil {
		return errors.New("app: xDS is not configured (Config.XDS)")
	}
	return a.XDS.Serve(ln)
}

// Running reports whether the named worker was started and not stopped.
func (a *App) Running(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.started[name]
}

// Workers lists the workers' names in start order.
func (a *App) Workers() []string {
	out := make([]string, len(a.workers))
	for i, w := range a.workers {
		out[i] = w.name
	}
	return out
}

// livePeers are the live replicas of region other than this one, from
// the ownership manager's last reading: whom this replica relays from
// and forwards evidence to. A replica that names no region, or a peer
// that names none, is taken for the same region.
func livePeers(r ownership.RegionStatus, region string) []ownership.ReplicaStatus {
	var out []ownership.ReplicaStatus
	for _, rep := range r.Replicas {
		if rep.ID != r.Self && rep.Address != "" && (rep.Region == "" || region == "" || rep.Region == region) {
			out = append(out, rep)
		}
	}
	return out
}

// ReconcileOwnershipKey is what a reconciliation source hashes onto the
// region's shards as (ownership.ShardOf): the owner of that shard applies
// the source. A service name cannot take this form (no colon).
func ReconcileOwnershipKey(source string) string { return "reconcile-source:" + source }

// orNow is a component's own clock if it has one, else the app's.
func orNow(own, app func() time.Time) func() time.Time {
	if own != nil {
		return own
	}
	return app
}

// zoneCounts is every zone's state as published: the guard's eligible
// and capacity counts and the instances muster cannot vouch for (verdict
// unknown, or health unknown), summed over the last view of every
// service of the region the hub holds: those this replica publishes and
// those relayed from their owners, so one replica's reading is the
// region's.
func (a *App) zoneCounts() map[string]zonehistory.Counts {
	out := map[string]zonehistory.Counts{}
	for _, name := range a.Hub.Services() {
		v, ok := a.Publisher.View(name)
		if !ok {
			f, held := a.Hub.View(name)
			if !held {
				continue
			}
			v = &assembler.View{}
			if err := json.Unmarshal(f.JSON, v); err != nil {
				continue
			}
		}
		for zone, z := range v.Zones {
			c := out[zone]
			c.Eligible, c.Total = c.Eligible+z.Eligible, c.Total+z.Total
			out[zone] = c
		}
		for _, e := range v.Endpoints {
			// No verdict yet, or in rotation with no class of evidence
			// speaking (silence is unknown, not dead).
			if e.State == "unknown" || e.Health == assembler.HealthUnknown {
				c := out[e.Zone]
				c.Unknown++
				out[e.Zone] = c
			}
		}
	}
	return out
}

// proberReach is every prober's reach as a zonehistory record: targets
// reported on (Eligible) of those assigned (Total), and its state.
func (a *App) proberReach() map[string]zonehistory.Counts {
	out := map[string]zonehistory.Counts{}
	for _, r := range a.Evaluator.ProberReaches() {
		c := zonehistory.Counts{Eligible: r.Reported, Total: r.Targets}
		switch {
		case r.Outage:
			c.State = "outage"
		case r.Suspect:
			c.State = "suspect"
		}
		out[r.Prober] = c
	}
	return out
}
