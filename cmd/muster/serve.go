package main

import (
	"cmp"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/demo"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/webui"
	"github.com/musterhq/muster/server"
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
	fs.StringVar(&cfg.DebugAddr, "debug-addr", "", "if set, serve Go's pprof profiles on this address, without authentication (a bare :port is loopback; another host is warned about)")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", "", "if set, serve /metrics without a token on this address (\":9464\" listens on loopback; MUSTER_METRICS_ADDR); the API address's /metrics needs an operator or tool token")
	if dev {
		fs.StringVar(&cfg.DataDir, "data", ".muster", "folder for the local PostgreSQL cluster and the dev issuer's key")
		fs.BoolVar(&cfg.Demo, "demo", false, "fill the database with a simulated estate and drive it with simulated evidence")
	}
	if !dev {
		fs.BoolVar(&cfg.DBIAM, "db-iam", false, "log in to PostgreSQL with IAM database authentication tokens (Aurora, RDS) instead of DATABASE_URL's password (MUSTER_DB_IAM=1; docs/production.md)")
	}
	xdsFlags(fs, &cfg, dev)
	tlsFlags(fs, &cfg)
	var reconcileFile string
	fs.StringVar(&cfg.AdvertiseURL, "advertise-url", "", "the base URL peers reach this replica at, when not the listener's address (a StatefulSet pod's DNS name); also MUSTER_ADVERTISE_URL")
	fs.StringVar(&reconcileFile, "reconcile-config", "", "YAML or JSON file of Kubernetes clusters and inventory snapshots to reconcile instances from, and their platform issuers (see docs/reconciliation.md)")
	var sf shiftFlags
	fs.StringVar(&sf.steps, "shift-steps", "", "traffic weights a shift-back walks through, e.g. 0.1,0.25,0.5,1 (MUSTER_SHIFT_STEPS; default 0.1,0.25,0.5,1)")
	fs.StringVar(&sf.dwell, "shift-dwell", "", "minimum time between two shift-back steps (MUSTER_SHIFT_DWELL; default 2m)")
	fs.StringVar(&sf.pendingAlarm, "shift-pending-alarm", "", "a manual shift-back pending confirmation longer than this raises shiftback_pending (MUSTER_SHIFT_PENDING_ALARM; default 10m)")
	df := addDNSFlags(fs, dev)
	applyProxyProtocol := proxyProtocolFlag(fs)
	applyRoutingControl := routingControlFlags(fs)
	applyNotify := notifyFlags(fs)
	ff := addFederationFlags(fs)
	var peers string
	fs.StringVar(&peers, "peers", "", "comma-separated base URLs of the region's other replicas (MUSTER_PEERS): when PostgreSQL cannot be reached at start, serve their views read-only until it can (docs/replicas.md)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := loadEnv(&cfg); err != nil {
		return err
	}
	if peers != "" {
		cfg.Peers = splitList(peers)
	}
	if err := applyProxyProtocol(&cfg); err != nil {
		return err
	}
	if err := applyRoutingControl(&cfg); err != nil {
		return err
	}
	if err := applyNotify(&cfg); err != nil {
		return err
	}
	var err error
	if cfg.DNS, err = df.config(fs, dev); err != nil {
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
	if err := ff.apply(&cfg); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	// A malformed source is refused before anything starts.
	if cfg.routingControl, err = routingControlConfig(cfg); err != nil {
		return err
	}
	if reconcileFile != "" {
		rc, err := reconcile.LoadConfig(reconcileFile)
		if err != nil {
			return err
		}
		cfg.Reconcile = &rc
	}
	if cfg.SPIFFEFile != "" {
		if cfg.TrustDomains, err = loadSPIFFE(cfg.SPIFFEFile); err != nil {
			return err
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	fs.Visit(func(f *flag.Flag) { cfg.xdsExplicit = cfg.xdsExplicit || f.Name == "xds-addr" }) // xds.go
	return serve(ctx, cfg, log, stdout)
}

// serve runs muster until ctx ends, then shuts down in order (app.App's
// Shutdown), closes the pools and stops the local cluster.
func serve(ctx context.Context, cfg Config, log *slog.Logger, stdout io.Writer) (err error) {
	dbURL, stopDB, err := openDatabase(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopDB()) }()
	target, err := newDBTarget(ctx, cfg, dbURL)
	if err != nil {
		return err
	}
	target.logRoots(log)
	pool, monPool, closePools, fromPeers, err := openPoolsOrPeers(ctx, cfg, target, log)
	if err != nil {
		return err
	}
	defer closePools()
	// The region's key, checked against the database's sealed rows before
	// anything listens (keys.go): a replica whose keys disagree with the
	// rows refuses to start, and the replicas running keep serving. One
	// started from its peers checks when the database answers.
	var (
		signer *audit.KeyFileSigner
		keys   audit.Keys
	)
	if fromPeers {
		if signer, keys, err = regionKey(cfg); err == nil && signer == nil {
			err = errors.New("PostgreSQL cannot be reached, and without the region's signing key this replica cannot take its peers' views (docs/keys.md)")
		}
	} else {
		signer, keys, err = startKeys(ctx, cfg, pool, log)
	}
	if err != nil {
		return err
	}
	ltls, err := setupTLS(cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	defer ln.Close()
	// Behind a load balancer, its PROXY header names the client
	// (proxy.go); it is read before anything else on the connection,
	// TLS included, so that wrapper goes on first.
	ln, proxyMetrics, err := proxyProtocol(cfg, ln, log)
	if err != nil {
		return err
	}
	ln = ltls.wrap(ln)
	base := ltls.scheme() + "://" + dialable(ln.Addr().(*net.TCPAddr))
	if cfg.AdvertiseURL != "" {
		base = strings.TrimSuffix(cfg.AdvertiseURL, "/")
	}
	if err := cfg.checkAdvertised("the listener's address", base); err != nil {
		return err
	}
	acfg, devIssuer, err := appConfig(cfg, base, pool, monPool, replicaName(cfg, ln), log)
	if err != nil {
		return err
	}
	acfg.PeerUpgrade, acfg.PeerAllowHTTP = cfg.PeerTrust == PeerTrustUpgrade, cfg.PeerAllowHTTP
	if err := withTLS(&acfg, ltls, cfg.TrustDomains); err != nil {
		return err
	}
	if proxyMetrics != nil {
		if err := acfg.Metrics.Register(proxyMetrics); err != nil {
			return fmt.Errorf("proxy protocol metrics: %w", err)
		}
	}
	// The region's key (audit.go) seals overrides and signs the audit
	// checkpoints, which stop after the HTTP server and the
	// refused-evidence summaries, so the last one covers them.
	sealOverrides(&acfg, signer, keys, log)
	acfg.KeyWatch = app.KeyWatchConfig{Every: cfg.Audit.KeyWatchEvery, Share: cfg.Audit.MismatchShare}
	checkpoints, err := newAuditCheckpoints(ctx, cfg, signer, keys, pool, log, acfg.Metrics)
	if err != nil {
		return err
	}
	if checkpoints != nil {
		acfg.Workers = append(acfg.Workers, app.NamedWorker{Name: "audit-checkpoints", Worker: checkpoints})
	}
	xln, xcfg, err := listenXDS(cfg, cfg.xdsExplicit, ltls, acfg.Metrics, log)
	if err != nil {
		return err
	}
	acfg.XDS = xcfg
	acfg.Peers = cfg.Peers
	a, err := app.New(acfg)
	if err != nil {
		return errors.Join(err, closeListener(xln))
	}
	start := func(ctx context.Context) error { return a.Start(ctx) }
	if fromPeers {
		start = a.StartFromPeers
	}
	if err := start(ctx); err != nil {
		return errors.Join(err, closeListener(xln))
	}
	// A replica started from its peers completes its start when the
	// database answers; if it cannot (its keys disagree with the rows),
	// it stops serving with that error.
	serveCtx, stopServing := context.WithCancelCause(ctx)
	defer stopServing(nil)
	var resumer sync.WaitGroup
	defer resumer.Wait()
	if fromPeers {
		resumer.Go(func() {
			if err := resumeWhenDatabaseAnswers(serveCtx, ctx, cfg, target, pool, a, log); err != nil {
				stopServing(err)
			}
		})
	}
	stopSide, err := serveBeside(cfg, a, xln, ltls, log)
	if err != nil {
		return errors.Join(err, a.Shutdown(ctx, nil))
	}
	defer stopSide()
	// The demo (muster dev --demo) is stopped after the shutdown, as it
	// always was.
	demoCtx, stopDemo := context.WithCancel(ctx)
	var demoRuns sync.WaitGroup
	defer func() { stopDemo(); demoRuns.Wait() }()
	err = a.Serve(serveCtx, ln, func() {
		log.Info("muster is serving", "url", base, "region", cfg.Region, "dev", cfg.Dev, "read_only", a.ReadOnly())
		announce(demoCtx, cfg, a, base, devIssuer, log, stdout, &demoRuns)
	})
	if cause := context.Cause(serveCtx); ctx.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = errors.Join(err, cause)
	}
	return err
}

// openPoolsOrPeers opens the pools (openPools). With peers configured it
// first probes PostgreSQL (a connection within 10 s): when that fails, it
// opens the pools without connecting instead and says so (fromPeers), and
// the replica starts from its peers. The probe comes first so that an
// unreachable host costs its connect timeout, not the migration's.
func openPoolsOrPeers(ctx context.Context, cfg Config, target dbTarget, log *slog.Logger) (pool, monPool *pgxpool.Pool, closeAll func(), fromPeers bool, err error) {
	if len(cfg.Peers) == 0 {
		pool, monPool, closeAll, err = openPools(ctx, cfg, target, log)
		return pool, monPool, closeAll, false, err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	probe, perr := target.open(pctx, db.PoolConfig{IOTimeout: cfg.DBIOTimeout, MaxConns: 1})
	cancel()
	if perr == nil {
		// PostgreSQL answers: the ordinary start (a migration that fails
		// now is a fault to report, not an outage to ride out).
		probe.Close()
		pool, monPool, closeAll, err = openPools(ctx, cfg, target, log)
		return pool, monPool, closeAll, false, err
	}
	log.Warn("PostgreSQL cannot be reached at start: serving the peers' views read-only until it answers", "err", perr, "peers", cfg.Peers)
	if pool, err = target.open(ctx, db.PoolConfig{IOTimeout: cfg.DBIOTimeout, Lazy: true}); err != nil {
		return nil, nil, nil, false, err
	}
	if monPool, err = target.open(ctx, db.PoolConfig{IOTimeout: cfg.DBIOTimeout, MaxConns: 1, Lazy: true}); err != nil {
		pool.Close()
		return nil, nil, nil, false, err
	}
	return pool, monPool, func() { monPool.Close(); pool.Close() }, true, nil
}

// resumeWhenDatabaseAnswers waits, every second until ctx ends, for
// PostgreSQL to answer a replica started from its peers, then migrates,
// checks the region's key against the rows (startKeys) and completes the
// start (App.Resume; workers start on startCtx, as App.Start's would).
// A key that disagrees with the rows is returned: the replica stops, as
// it would have refused to start.
func resumeWhenDatabaseAnswers(ctx, startCtx context.Context, cfg Config, target dbTarget, pool *pgxpool.Pool, a *app.App, log *slog.Logger) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := pool.Ping(pctx)
		cancel()
		if err != nil {
			continue
		}
		if err := target.prepareSchema(log); err != nil {
			log.Warn("PostgreSQL answers, but the schema is not ready (the migration failed, or with MUSTER_MIGRATE=skip the migrations Job has not finished); trying again", "err", err)
			continue
		}
		if _, _, err := startKeys(ctx, cfg, pool, log); err != nil {
			if errors.Is(err, seal.ErrKeyMismatch) {
				return err
			}
			log.Warn("PostgreSQL answers, but the region's keys could not be checked against it; trying again", "err", err)
			continue
		}
		return a.Resume(startCtx)
	}
}

// openPools migrates the database and opens the shared pool and the
// database monitor's own one-connection pool.
func openPools(ctx context.Context, cfg Config, target dbTarget, log *slog.Logger) (pool, monPool *pgxpool.Pool, closeAll func(), err error) {
	if err := target.prepareSchema(log); err != nil {
		return nil, nil, nil, err
	}
	if pool, err = target.open(ctx, db.PoolConfig{IOTimeout: cfg.DBIOTimeout}); err != nil {
		return nil, nil, nil, err
	}
	if monPool, err = target.open(ctx, db.PoolConfig{IOTimeout: cfg.DBIOTimeout, MaxConns: 1}); err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return pool, monPool, func() { monPool.Close(); pool.Close() }, nil
}

// serveBeside serves what runs beside the API on listeners of its own:
// xDS on xln (when set; it ends when Shutdown drains it), Go's profiles on
// --debug-addr and /metrics on --metrics-addr. stop closes them.
func serveBeside(cfg Config, a *app.App, xln net.Listener, ltls *listenerTLS, log *slog.Logger) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
	if xln != nil {
		stops = append(stops, func() { _ = xln.Close() })
		go func() {
			if err := a.ServeXDS(xln); err != nil {
				log.Error("xDS stopped serving", "err", err)
			}
		}()
		log.Info("serving xDS", "addr", xln.Addr().String(), "tls", cfg.XDSTLSCert != "" || ltls.on())
	}
	if cfg.DebugAddr != "" {
		stopDebug, err := serveDebug(cfg.DebugAddr, ltls.server(), log)
		if err != nil {
			stop()
			return nil, err
		}
		stops = append(stops, stopDebug)
	}
	if cfg.MetricsAddr != "" {
		_, stopMetrics, err := serveMetrics(cfg.MetricsAddr, a.Server.MetricsHandler(), ltls.server(), log)
		if err != nil {
			stop()
			return nil, err
		}
		stops = append(stops, stopMetrics)
	}
	return stop, nil
}

// closeListener closes ln when there is one.
func closeListener(ln net.Listener) error {
	if ln == nil {
		return nil
	}
	return ln.Close()
}

// appConfig turns the command's configuration into app's: the OIDC
// issuers (and, for dev, the built-in issuer and the UI's client), the
// component settings, the metrics registry.
func appConfig(cfg Config, base string, pool, monPool *pgxpool.Pool, replica string, log *slog.Logger) (app.Config, *devissuer.Issuer, error) {
	issuers := slices.Clone(cfg.Issuers)
	var rcfg reconcile.Config
	if cfg.Reconcile != nil {
		var platform []identity.IssuerConfig
		var err error
		if rcfg, platform, err = cfg.Reconcile.Build(time.Now); err != nil {
			return app.Config{}, nil, err
		}
		issuers = append(issuers, platform...)
	}
	var devIssuer *devissuer.Issuer
	if cfg.Dev {
		var err error
		if devIssuer, err = devissuer.LoadOrCreate(cfg.DataDir); err != nil {
			return app.Config{}, nil, err
		}
		if err := devIssuer.SetURL(base + devIssuerPath); err != nil {
			return app.Config{}, nil, err
		}
		// The dev issuer is the home issuer (principals named without
		// their issuer) unless issuers are configured: then the first of
		// those is, so that processes trusting the same configured issuer
		// name its principals alike, whatever their own dev issuer.
		// Every dev process on this data folder signs with its key under
		// its own address: they are one issuer, trusted by the key, so a
		// token one of them (or `muster token`) minted is good at all of
		// them, even once the one that minted it is gone.
		issuers = append(issuers, identity.IssuerConfig{URL: devIssuer.URL(), Audience: "muster",
			Keys: []crypto.PublicKey{devIssuer.PublicKey()}, LoopbackPath: devIssuerPath})
	}
	verifier, err := identity.NewVerifier(issuers, &http.Client{Timeout: 10 * time.Second})
	if err != nil {
		return app.Config{}, nil, err
	}
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ac := app.Config{
		Pool: pool, MonitorPool: monPool, Region: cfg.Region, Replica: replica, Address: base, Logger: log, Metrics: metrics,
		Registry:  registry.Config{LeaseTTL: cfg.LeaseTTL},
		Evaluator: evaluator.Config{MaxPendingWindows: cfg.MaxPendingWindows},
		Policy: policy.Config{OverrideLimit: cfg.OverrideLimit, WriteLimit: cfg.WriteLimit, MaxExpiry: cfg.MaxExpiry,
			CosignWindow: cfg.CosignWindow},
		Shifts:        shift.Config{Steps: cfg.ShiftSteps, Dwell: cfg.ShiftDwell, PendingAlarmAfter: cfg.ShiftPendingAlarm},
		Admission:     stream.AdmissionConfig{Floor: cfg.AdmissionFloor, Window: cfg.AdmissionWindow},
		Hub:           stream.Config{DrainSpread: cmp.Or(cfg.DrainSpread, -1)},
		ShutdownGrace: cfg.ShutdownGrace,
		// clock_skew above this (MUSTER_CLOCK_SKEW_ALARM).
		ClockSkewAlarm: cfg.ClockSkewAlarm,
		Server:         server.Config{Authenticator: verifier, DBTimeout: cfg.DBTimeout, Limits: cfg.Limits},
		DNS:            cfg.DNS,
		Reconcile:      rcfg,
		Federation:     cfg.Federation,
	}
	ac.RoutingControl = cfg.routingControl
	// Break-glass tokens are addressed as the issuers' are
	// (MUSTER_AUDIENCE), which is what muster breakglass writes.
	if len(cfg.Issuers) > 0 {
		ac.BreakGlass.Audience = cfg.Issuers[0].Audience
	}
	if cfg.notify != nil {
		nc := *cfg.notify
		nc.GeneratorURL = base + "/v1/alarms"
		ac.Notify = &nc
	}
	if devIssuer != nil {
		ac.Server.DevIssuer, ac.Server.DevIssuerPath = devIssuer.Handler(), devIssuerPath
	}
	uiOIDC := cfg.UI
	if cfg.Dev {
		if uiOIDC, err = devUIClient(devIssuer, base); err != nil {
			return app.Config{}, nil, err
		}
	}
	if uiOIDC.IssuerURL != "" {
		uiOIDC.HomeIssuer = verifier.Home()
		ac.UI = &webui.Config{OIDC: uiOIDC, BasePath: uiPath, InsecureCookie: cfg.UIInsecureCookie}
	}
	return ac, devIssuer, nil
}

// announce prints where muster dev serves and, when asked, runs the demo
// until ctx ends, in demoRuns.
func announce(ctx context.Context, cfg Config, a *app.App, base string, devIssuer *devissuer.Issuer, log *slog.Logger, stdout io.Writer, demoRuns *sync.WaitGroup) {
	if !cfg.Dev {
		return
	}
	fmt.Fprintf(stdout, "muster dev is serving on %s\n  web UI: %s%s/ (sign in as alice, oscar, otto or vera)\n  data:   %s\n  issuer: %s\n  token:  go run ./cmd/muster token --data %s --kind operator --subject alice --role admin\n",
		base, base, uiPath, cfg.DataDir, devIssuer.URL(), cfg.DataDir)
	if a.DNS != nil && a.DNS.Addr() != nil {
		host, port, _ := net.SplitHostPort(a.DNS.Addr().String())
		fmt.Fprintf(stdout, "  dns:    dig @%s -p %s SERVICE.%s (every service; `muster dev --dns-addr \"\"` for none)\n", host, port, a.DNS.Zone())
	}
	if !cfg.Demo {
		return
	}
	demoRuns.Go(func() {
		err := demo.Run(ctx, demo.Config{
			URL: base, Logger: log,
			Mint: func(req devissuer.TokenRequest) (string, error) { return devIssuer.Mint(req, time.Now()) },
		})
		if err != nil {
			log.Error("demo stopped", "err", err)
		}
	})
	fmt.Fprintf(stdout, "  demo:   a simulated estate of %d services is being set up and driven\n", len(demo.ServiceNames()))
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
// address: profiles are for the operator at the machine, not for callers
// (a bare :port listens on loopback; another host is warned about); over
// TLS when tc is set.
func serveDebug(addr string, tc *tls.Config, log *slog.Logger) (stop func(), err error) {
	ln, err := listenUnauthenticated("debug", addr, log)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return func() { _ = hs.Close() }, nil
}

// listenUnauthenticated listens for a listener that serves without
// authentication (the metrics, Go's profiles): a bare ":port" listens on
// loopback, and another host is the operator's explicit choice (a pod
// address behind a network policy), logged as a warning.
func listenUnauthenticated(what, addr string, log *slog.Logger) (net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%s address %q: %w", what, addr, err)
	}
	if host == "" {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s address %s: %w", what, addr, err)
	}
	if ip := net.ParseIP(host); host != "" && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		log.Warn("serving "+what+" without authentication on a non-loopback address", "addr", ln.Addr().String())
	} else {
		log.Info("serving "+what, "addr", ln.Addr().String())
	}
	return ln, nil
}

// serveMetrics serves the metrics without authentication on a listener of
// their own, for a scraper that can reach it and nobody else: a bare
// ":port" listens on loopback, and another host is the operator's explicit
// choice (a pod address behind a network policy), logged as such.
// It serves TLS when tc is set, and returns the address it listens on.
func serveMetrics(addr string, h http.Handler, tc *tls.Config, log *slog.Logger) (bound string, stop func(), err error) {
	ln, err := listenUnauthenticated("/metrics", addr, log)
	if err != nil {
		return "", nil, err
	}
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return ln.Addr().String(), func() { _ = hs.Close() }, nil
}
