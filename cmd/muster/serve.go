package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/musterhq/muster/assembler"
	"github.com/musterhq/muster/audit"
	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/demo"
	"github.com/musterhq/muster/evaluator"
	"github.com/musterhq/muster/guardlog"
	"github.com/musterhq/muster/identity"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/policy"
	"github.com/musterhq/muster/publisher"
	"github.com/musterhq/muster/registry"
	"github.com/musterhq/muster/server"
	"github.com/musterhq/muster/stream"
	"github.com/musterhq/muster/webui"
)

// devIssuerPath is where `muster dev` serves its built-in OIDC issuer.
const devIssuerPath = "/dev/issuer"

// uiPath is where the admin web UI is served.
const uiPath = "/ui"

// devUIClient registers the web UI as a client of the dev issuer, with a
// secret made up for this process, and returns the UI's OIDC settings.
func devUIClient(d *devissuer.Issuer, base string) (webui.OIDCConfig, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return webui.OIDCConfig{}, fmt.Errorf("dev UI client secret: %w", err)
	}
	c := webui.OIDCConfig{IssuerURL: d.URL(), ClientID: "muster-ui", ClientSecret: hex.EncodeToString(secret),
		RedirectURL: base + uiPath + "/auth/callback"}
	err := d.RegisterClient(devissuer.Client{ID: c.ClientID, Secret: c.ClientSecret, RedirectURIs: []string{c.RedirectURL}})
	return c, err
}

func cmdServe(ctx context.Context, args []string, dev bool, stdout, stderr io.Writer) error {
	name, defAddr := "serve", ":8080"
	if dev {
		name, defAddr = "dev", "127.0.0.1:8080"
	}
	cfg := Config{Dev: dev}
	fs := cli.NewFlags(name, stderr)
	fs.StringVar(&cfg.Addr, "addr", defAddr, "address to listen on")
	fs.StringVar(&cfg.DebugAddr, "debug-addr", "", "if set, serve Go's pprof profiles on this (loopback) address")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", "", "if set, serve /metrics without a token on this address (\":9464\" listens on loopback; MUSTER_METRICS_ADDR); the API address's /metrics needs an operator or tool token")
	if dev {
		fs.StringVar(&cfg.DataDir, "data", ".muster", "folder for the local PostgreSQL cluster and the dev issuer's key")
		fs.BoolVar(&cfg.Demo, "demo", false, "fill the database with a simulated estate and drive it with simulated evidence")
	}
	var sf shiftFlags
	fs.StringVar(&sf.steps, "shift-steps", "", "traffic weights a shift-back walks through, e.g. 0.1,0.25,0.5,1 (MUSTER_SHIFT_STEPS; default 0.1,0.25,0.5,1)")
	fs.StringVar(&sf.dwell, "shift-dwell", "", "minimum time between two shift-back steps (MUSTER_SHIFT_DWELL; default 2m)")
	fs.StringVar(&sf.pendingAlarm, "shift-pending-alarm", "", "a manual shift-back pending confirmation longer than this raises shiftback_pending (MUSTER_SHIFT_PENDING_ALARM; default 10m)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := loadEnv(&cfg); err != nil {
		return err
	}
	if cfg.Demo {
		// The demo's failover story should reach its pending confirmation
		// (and alarm) within a minute or two, not half an hour; flags and
		// the environment still win.
		sf.dwell = cmpOr(sf.dwell, cmpOr(os.Getenv("MUSTER_SHIFT_DWELL"), "10s"))
		sf.pendingAlarm = cmpOr(sf.pendingAlarm, cmpOr(os.Getenv("MUSTER_SHIFT_PENDING_ALARM"), "30s"))
	}
	if err := sf.apply(&cfg); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	return serve(ctx, cfg, log, stdout)
}

// serve runs muster until ctx ends, then shuts down in order: stop
// admitting requests, stop workers, close the pool, stop the cluster.
func serve(ctx context.Context, cfg Config, log *slog.Logger, stdout io.Writer) (err error) {
	dbURL, stopDB, err := openDatabase(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopDB()) }()

	if err := db.Migrate(dbURL); err != nil {
		return err
	}
	pool, err := db.OpenPool(ctx, db.PoolConfig{URL: dbURL, IOTimeout: cfg.DBIOTimeout})
	if err != nil {
		return err
	}
	defer pool.Close()
	// The health monitor pings on a connection of its own: on the shared
	// pool, a burst of slow requests holding every connection would read
	// as an outage.
	monPool, err := db.OpenPool(ctx, db.PoolConfig{URL: dbURL, IOTimeout: cfg.DBIOTimeout, MaxConns: 1})
	if err != nil {
		return err
	}
	defer monPool.Close()

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	defer ln.Close()
	base := "http://" + dialable(ln.Addr().(*net.TCPAddr))

	issuers := cfg.Issuers
	var devIssuer *devissuer.Issuer
	if cfg.Dev {
		if devIssuer, err = devissuer.LoadOrCreate(cfg.DataDir); err != nil {
			return err
		}
		if err := devIssuer.SetURL(base + devIssuerPath); err != nil {
			return err
		}
		// The dev issuer is the home issuer (principals named without
		// their issuer) unless issuers are configured: then the first of
		// those is, so that processes trusting the same configured issuer
		// name its principals alike, whatever their own dev issuer.
		issuers = append(issuers, identity.IssuerConfig{URL: devIssuer.URL(), Audience: "muster"})
	}
	verifier, err := identity.NewVerifier(issuers, &http.Client{Timeout: 10 * time.Second})
	if err != nil {
		return err
	}

	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var (
		eval   *evaluator.Evaluator
		shifts *policy.Shifts
	)
	reg, err := registry.New(registry.Config{
		Pool: pool, Region: cfg.Region, LeaseTTL: cfg.LeaseTTL,
		Logger: log.With("component", "registry"), Registerer: metrics,
		// The registration hand-off: a workload's first report, sent as
		// soon as it has its id, finds its instance known.
		Registered:     func(ctx context.Context, ins []registry.Instance) { eval.InstancesRegistered(ctx, ins) },
		ProberAssigned: func(a registry.ProberAssignments) { eval.ProberAssigned(a) },
	})
	if err != nil {
		return err
	}
	authz, err := registry.NewAuthzCache(registry.AuthzCacheConfig{Registry: reg, Logger: log, Registerer: metrics})
	if err != nil {
		return err
	}
	dbHealth, err := db.NewMonitor(db.MonitorConfig{Pool: monPool, Logger: log, Registerer: metrics})
	if err != nil {
		return err
	}
	reaper, err := registry.NewReaper(registry.ReaperConfig{
		Registry: reg, Logger: log, Registerer: metrics,
		Corroborated: func(ids []uuid.UUID) map[uuid.UUID]string { return eval.LeaseExpiriesCorroborated(ids) },
		// A lease's clock runs only while renewals could land: from the
		// moment PostgreSQL answers again after an outage.
		UpSince: dbHealth.UpSince,
	})
	if err != nil {
		return err
	}
	hub := stream.NewHub(stream.Config{})
	guards := guardlog.New(pool, log)
	pub, err := publisher.New(publisher.Config{
		Snapshot: func(s string) (evaluator.ServiceSnapshot, bool) { return eval.Snapshot(s) },
		Hub:      hub, Pool: pool, Logger: log, Registerer: metrics,
		Traffic:     func() assembler.TrafficWeights { return shifts.Weights() },
		GuardEvents: guards.Record,
	})
	if err != nil {
		return err
	}
	shifts, err = policy.NewShifts(policy.ShiftsConfig{
		Pool: pool, Region: cfg.Region, Steps: cfg.ShiftSteps, Dwell: cfg.ShiftDwell, PendingAlarmAfter: cfg.ShiftPendingAlarm,
		Verdicts: policy.VerdictsFunc(func(s string) (evaluator.ServiceSnapshot, bool) { return eval.Snapshot(s) }),
		OnChange: pub.TrafficChanged, Logger: log, Registerer: metrics,
	})
	if err != nil {
		return err
	}
	pol, err := policy.New(policy.Config{
		Pool: pool, Logger: log.With("component", "policy"), Registerer: metrics,
		Verdicts:      policy.VerdictsFunc(func(s string) (evaluator.ServiceSnapshot, bool) { return eval.Snapshot(s) }),
		OverrideLimit: cfg.OverrideLimit, WriteLimit: cfg.WriteLimit, MaxExpiry: cfg.MaxExpiry, CosignWindow: cfg.CosignWindow,
		Changed: func(string) { eval.RefreshSoon() },
	})
	if err != nil {
		return err
	}
	eval, err = evaluator.New(evaluator.Config{
		Registry: reg, Pool: pool, Logger: log, Registerer: metrics, Sink: pub, Overrides: pol,
		MaxPendingWindows: cfg.MaxPendingWindows, DatabaseUp: dbHealth.Up,
		// Passive evidence only from callers that may resolve the service.
		MayResolve: authz.MayResolve,
	})
	if err != nil {
		return err
	}
	sweeper := policy.NewSweeper(pol, 0)
	// Audit checkpoints and refused-evidence summaries (audit.go).
	auditWork, err := newAuditWorkers(ctx, cfg, pool, log, metrics)
	if err != nil {
		return err
	}

	admission := stream.NewAdmission(stream.AdmissionConfig{Floor: cfg.AdmissionFloor, Window: cfg.AdmissionWindow})
	census, err := stream.NewCensus(stream.CensusConfig{
		Pool: pool, Replica: replicaName(cfg, ln), Hub: hub, Admission: admission, Logger: log,
	})
	if err != nil {
		return err
	}

	var ready atomic.Bool
	servingReady := server.ServingReady(eval, hub)
	scfg := server.Config{
		Logger: log, Registry: reg, Policy: pol, Audit: audit.NewLog(pool), RefusedEvidence: auditWork.refusals, Evaluator: eval, Authenticator: verifier, Metrics: metrics,
		Hub: hub, Admission: admission, Alarms: pub, Probers: eval, Shifts: shifts, Leases: reaper,
		Authz: authz, Database: dbHealth, DBTimeout: cfg.DBTimeout, Limits: cfg.Limits,
		// Whether this replica can serve views, not whether PostgreSQL
		// answers (that is muster_database_up and database_unreachable).
		Ready: func(ctx context.Context) error {
			if !ready.Load() {
				return errors.New("starting or stopping")
			}
			return servingReady(ctx)
		},
	}
	if devIssuer != nil {
		scfg.DevIssuer, scfg.DevIssuerPath = devIssuer.Handler(), devIssuerPath
	}
	uiOIDC := cfg.UI
	if cfg.Dev {
		if uiOIDC, err = devUIClient(devIssuer, base); err != nil {
			return err
		}
	}
	var srv *server.Server
	if uiOIDC.IssuerURL != "" {
		uiOIDC.HomeIssuer = verifier.Home()
		ui, err := webui.New(webui.Config{
			Logger: log, Pool: pool, Registry: reg, Evaluator: eval, Publisher: pub, Audit: audit.NewLog(pool),
			Overrides: pol, Guards: guards, Shifts: shifts, OIDC: uiOIDC, BasePath: uiPath, InsecureCookie: cfg.UIInsecureCookie,
			// The banner lists what GET /v1/alarms lists; srv is set below,
			// before anything is served.
			Alarms: func() []assembler.Alarm { return srv.Alarms() },
		})
		if err != nil {
			return err
		}
		defer ui.Close()
		scfg.UI, scfg.UIPath = ui, uiPath
	}
	srv, err = server.New(scfg)
	if err != nil {
		return err
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}

	if err := dbHealth.Start(ctx); err != nil {
		return err
	}
	defer dbHealth.Stop()
	if err := authz.Start(ctx); err != nil {
		return err
	}
	defer authz.Stop()
	// The census reads the expected population before the first watch
	// request can arrive, so a restarted replica admits by the clients
	// coming back, not by the nothing it remembers.
	if err := census.Start(ctx); err != nil {
		return err
	}
	defer census.Stop()
	if err := reaper.Start(ctx); err != nil {
		return err
	}
	defer reaper.Stop()
	// Shifts load before the publisher starts, so the first views after a
	// restart already carry every drained zone.
	if err := shifts.Start(ctx); err != nil {
		return err
	}
	defer shifts.Stop()
	if err := sweeper.Start(ctx); err != nil {
		return err
	}
	defer sweeper.Stop()
	// The evaluator's context is not the signal context: on shutdown it
	// is stopped explicitly after the HTTP server, so it can flush.
	if err := guards.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer guards.Stop()
	if err := pub.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer pub.Stop()
	if err := eval.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer eval.Stop()
	// Stopped after the HTTP server (deferred): the last summaries and the
	// last checkpoint cover everything served.
	if err := auditWork.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer auditWork.Stop()

	if cfg.DebugAddr != "" {
		stopDebug, err := serveDebug(cfg.DebugAddr, log)
		if err != nil {
			return err
		}
		defer stopDebug()
	}
	if cfg.MetricsAddr != "" {
		_, stopMetrics, err := serveMetrics(cfg.MetricsAddr, srv.MetricsHandler(), log)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	// Renewals can land from now on: every lease gets a full TTL from
	// here, however long this process (or its database) was away.
	reaper.HearingFrom(time.Now())
	ready.Store(true)
	log.Info("muster is serving", "url", base, "region", cfg.Region, "dev", cfg.Dev)
	if cfg.Dev {
		fmt.Fprintf(stdout, "muster dev is serving on %s\n  web UI: %s%s/ (sign in as alice, oscar, otto or vera)\n  data:   %s\n  issuer: %s\n  token:  go run ./cmd/muster token --data %s --kind operator --subject alice --role admin\n",
			base, base, uiPath, cfg.DataDir, devIssuer.URL(), cfg.DataDir)
	}
	var demoDone chan struct{}
	if cfg.Demo {
		demoDone = make(chan struct{})
		demoCtx, stopDemo := context.WithCancel(ctx)
		defer func() { stopDemo(); <-demoDone }()
		go func() {
			defer close(demoDone)
			err := demo.Run(demoCtx, demo.Config{
				URL: base, Logger: log,
				Mint: func(req devissuer.TokenRequest) (string, error) { return devIssuer.Mint(req, time.Now()) },
			})
			if err != nil {
				log.Error("demo stopped", "err", err)
			}
		}()
		fmt.Fprintf(stdout, "  demo:   a simulated estate of %d services is being set up and driven\n", len(demo.ServiceNames()))
	}

	select {
	case err := <-serveErr:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	ready.Store(false)
	// The census reports the subscriber count a last time while the
	// streams are still open, so the next process knows who is coming.
	census.Stop()
	// Drain watch streams first: subscribers are told to reconnect
	// elsewhere with jitter, and their handlers return.
	hub.Close()
	shutCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.WaitStreams(shutCtx); err != nil {
		log.Warn("watch streams still open at shutdown", "err", err)
	}
	if err := hs.Shutdown(shutCtx); err != nil {
		return fmt.Errorf("http shutdown: %w", err)
	}
	eval.Stop()
	pub.Stop()
	shifts.Stop()
	sweeper.Stop()
	reaper.Stop()
	authz.Stop()
	dbHealth.Stop()
	return nil
}

// openDatabase returns the database URL: DATABASE_URL when set, otherwise
// the local cluster in cfg.DataDir (started, or adopted when it is already
// running: a muster dev next door, or one left by a killed muster), with a
// function that stops the local cluster unless another live muster is
// still using it (see db.Cluster).
func openDatabase(ctx context.Context, cfg Config, log *slog.Logger) (string, func() error, error) {
	if cfg.DatabaseURL != "" {
		return cfg.DatabaseURL, func() error { return nil }, nil
	}
	if cfg.DataDir == "" {
		return "", nil, errors.New("DATABASE_URL is not set and no --data folder was given")
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return "", nil, err
	}
	start := time.Now()
	cluster, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir})
	if err != nil {
		return "", nil, err
	}
	if cluster.Adopted() {
		log.Info("using the PostgreSQL cluster already running; stopping it on exit unless another muster still uses it", "dir", dir)
	} else {
		log.Info("started local PostgreSQL", "dir", dir, "took", time.Since(start).Round(time.Millisecond))
	}
	if err := cluster.EnsureDatabase(ctx, "muster"); err != nil {
		return "", nil, errors.Join(err, cluster.Stop())
	}
	return cluster.URL("muster"), cluster.Stop, nil
}

// replicaName is this replica's name in the stream census: MUSTER_REPLICA,
// or the host name and listening port, which stay the same across a
// restart on the same host (or pod).
func replicaName(cfg Config, ln net.Listener) string {
	if cfg.Replica != "" {
		return cfg.Replica
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return net.JoinHostPort(host, fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
}

// dialable turns a listener address into one a client can dial: an
// unspecified host becomes loopback.
func dialable(a *net.TCPAddr) string {
	if a.IP == nil || a.IP.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", fmt.Sprint(a.Port))
	}
	return a.String()
}

// serveDebug serves net/http/pprof on its own listener, never on the API
// address: profiles are for the operator at the machine, not for callers.
func serveDebug(addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on debug address %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	log.Info("serving pprof", "addr", ln.Addr().String())
	return func() { _ = hs.Close() }, nil
}

// serveMetrics serves the metrics without authentication on a listener of
// their own, for a scraper that can reach it and nobody else: a bare
// ":port" listens on loopback, and another host is the operator's explicit
// choice (a pod address behind a network policy), logged as such.
// It returns the address it listens on.
func serveMetrics(addr string, h http.Handler, log *slog.Logger) (bound string, stop func(), err error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", nil, fmt.Errorf("metrics address %q: %w", addr, err)
	}
	if host == "" {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("listen on metrics address %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	if ip := net.ParseIP(host); host != "" && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		log.Warn("serving /metrics without authentication on a non-loopback address", "addr", ln.Addr().String())
	} else {
		log.Info("serving /metrics", "addr", ln.Addr().String())
	}
	return ln.Addr().String(), func() { _ = hs.Close() }, nil
}
