package main

import (
	"cmp"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/federation"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/notify"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/proxied"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/routingcontrol"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/webui"
	"github.com/musterhq/muster/internal/xds"
	"github.com/musterhq/muster/server"
)

// Config is everything muster reads from its environment and flags, parsed
// once here and passed down explicitly.
type Config struct {
	Addr        string
	DebugAddr   string // pprof listener; empty: none
	DataDir     string // dev: cluster, issuer key; empty for serve
	DatabaseURL string
	Region      string
	Issuers     []identity.IssuerConfig
	// Reconcile is the file --reconcile-config names, parsed;
	// nil without one.
	Reconcile *reconcile.FileConfig
	LeaseTTL  time.Duration
	LogLevel  slog.Level
	Dev       bool
	// Demo (dev only): fill the database with a simulated estate and
	// drive it with simulated evidence (package demo).
	Demo bool
	// AdmissionFloor is the least number of watch (re)subscriptions
	// admitted per admission window (MUSTER_ADMISSION_FLOOR, 50).
	AdmissionFloor int
	// AdmissionWindow is the admission window, also the stream census's
	// reporting interval (MUSTER_ADMISSION_WINDOW, 10s).
	AdmissionWindow time.Duration
	// Replica names this replica in the stream census
	// (MUSTER_REPLICA; default host name and listening port). Keep it
	// stable across restarts.
	Replica string
	// ShiftSteps, ShiftDwell and ShiftPendingAlarm tune shift-backs
	// (MUSTER_SHIFT_STEPS "0.1,0.25,0.5,1", MUSTER_SHIFT_DWELL 2m,
	// MUSTER_SHIFT_PENDING_ALARM 10m; flags --shift-steps, --shift-dwell,
	// --shift-pending-alarm override them).
	ShiftSteps        []float64
	ShiftDwell        time.Duration
	ShiftPendingAlarm time.Duration
	// Policy limits: MUSTER_OVERRIDE_LIMIT ("5/10m": attempts per actor
	// per service), MUSTER_WRITE_LIMIT ("60/1m": policy writes per actor per
	// family), MUSTER_OVERRIDE_MAX_EXPIRY (24h), MUSTER_COSIGN_WINDOW (5m).
	OverrideLimit policy.Limit
	WriteLimit    policy.Limit
	MaxExpiry     time.Duration
	CosignWindow  time.Duration
	// UI configures the admin web UI's sign-in for `muster serve`
	// (MUSTER_UI_*); the UI is off when UI.IssuerURL is empty. `muster
	// dev` signs in through its built-in issuer instead.
	UI webui.OIDCConfig
	// DBTimeout is the database budget of an API request
	// (MUSTER_DB_TIMEOUT, 1.5s): a request's database work ends by then,
	// and one that has not is answered 503 database-unavailable.
	DBTimeout time.Duration
	// DBIOTimeout is the connections' backstop (MUSTER_DB_IO_TIMEOUT, 5s):
	// how long PostgreSQL may stay silent while a reply is owed before the
	// connection is given up (db.DefaultIOTimeout says why 5 s).
	DBIOTimeout time.Duration
	// DBIAM makes muster log in to PostgreSQL with IAM database
	// authentication tokens (Aurora, RDS) instead of DATABASE_URL's
	// password (MUSTER_DB_IAM=1, --db-iam; dbtarget.go), signed in
	// DBIAMRegion (MUSTER_DB_IAM_REGION; default: the region in the RDS
	// host name, else the AWS SDK's).
	DBIAM       bool
	DBIAMRegion string
	// Migrate is what a start does with the schema (MUSTER_MIGRATE):
	// MigrateUp (the default) applies the pending migrations; MigrateSkip
	// applies none and refuses to start on a schema behind this release
	// or dirty, for a deployment whose migrations Job runs them once per
	// rollout (dbtarget.go).
	Migrate string
	// MaxPendingWindows bounds the observed windows kept in memory while
	// PostgreSQL cannot take them (MUSTER_MAX_PENDING_WINDOWS, 2000000).
	MaxPendingWindows int
	// DNS configures the authoritative DNS zone (--dns-* flags,
	// MUSTER_DNS_*; dns.go); nil: no DNS.
	DNS *dnszone.Config
	// UIInsecureCookie drops the session cookie's Secure attribute
	// (MUSTER_UI_INSECURE_COOKIE=1), for plain-http development only.
	UIInsecureCookie bool
	// Limits are the per-identity and per-address limits of each replica
	// (server.Limits): MUSTER_REPORT_ITEMS_LIMIT (100000/2s),
	// MUSTER_REPORT_BATCH_LIMIT (10000/2s), MUSTER_REGISTRATION_LIMIT
	// (1200/1m), MUSTER_DEREGISTRATION_LIMIT (1200/1m),
	// MUSTER_LEASE_RENEWAL_LIMIT (6000/10s), MUSTER_UNAUTHENTICATED_LIMIT
	// (120/1m per source address) and MUSTER_WATCH_STREAMS_LIMIT (10000
	// open streams per identity).
	Limits server.Limits
	// MetricsAddr, when set, serves /metrics without authentication on a
	// listener of its own (--metrics-addr, MUSTER_METRICS_ADDR); a bare
	// ":port" listens on loopback. The API listener's /metrics needs an
	// operator or tool token.
	MetricsAddr string
	// Audit configures the audit checkpoints (audit.go).
	Audit AuditConfig
	// XDSAddr, when set, serves xDS there (--xds-addr, xds.go), with TLS
	// from XDSTLSCert and XDSTLSKey when they are set.
	XDSAddr, XDSTLSCert, XDSTLSKey string
	xdsExplicit                    bool // --xds-addr was given
	// XDSLimits bound what one principal can make a replica hold through
	// xDS (xds.Limits): MUSTER_XDS_MAX_NAMES (10000 resource names per
	// stream), MUSTER_XDS_MAX_STREAMS_PER_PRINCIPAL (10000),
	// MUSTER_XDS_MAX_STREAMS_PER_CONNECTION (100) and
	// MUSTER_XDS_MAX_NAME_BYTES (67108864 bytes of names per principal).
	XDSLimits xds.Limits
	// Peers are the base URLs of the region's other replicas (--peers,
	// MUSTER_PEERS, comma-separated): with them, a replica that cannot
	// reach PostgreSQL at start serves their views read-only until it
	// can (app.App.StartFromPeers; docs/replicas.md). Needs the region's
	// signing key.
	Peers []string
	// AdvertiseURL is the base URL this replica registers for its peers
	// (and, under muster dev, its issuer's), when the listener's own
	// address is not the one to reach it by: a stable DNS name (a
	// StatefulSet pod's), or a listener on every interface
	// (--advertise-url, MUSTER_ADVERTISE_URL). Empty: the listener's
	// address, loopback for an unspecified host.
	AdvertiseURL string
	// PeerTrust is how far this replica trusts its peers
	// (MUSTER_PEER_TRUST): "strict" (the default) believes only sealed
	// rows of table replicas and requests signed the new way; "upgrade",
	// for a rolling upgrade from the release before, also believes and
	// sends what that release writes (docs/replicas.md, "Rolling
	// upgrade"). PeerAllowHTTP (MUSTER_PEER_ALLOW_HTTP=true, a lab)
	// allows peers, and this replica's own advertised address, at plain
	// http off loopback.
	PeerTrust     string
	PeerAllowHTTP bool
	// DrainSpread is the window a shutting-down replica asks its watch
	// subscribers to spread their reconnections over
	// (MUSTER_DRAIN_SPREAD, 2s); ShutdownGrace bounds the shutdown after
	// SIGTERM (MUSTER_SHUTDOWN_GRACE, 25s): both docs/production.md's
	// rolling deploy.
	DrainSpread, ShutdownGrace time.Duration
	// ClockSkewAlarm is the skew between this replica's clock and
	// PostgreSQL's above which clock_skew is raised
	// (MUSTER_CLOCK_SKEW_ALARM, 2s).
	ClockSkewAlarm time.Duration
	// TLSCert and TLSKey, when set, make every listener serve TLS with
	// this pair, reloaded when the files change; TLSCA is the CA bundle
	// muster trusts for its calls to https peers (--tls-*, MUSTER_TLS_*;
	// tls.go).
	TLSCert, TLSKey, TLSCA string
	// ProxyProtocolFrom are the load balancers' networks whose
	// connections to the API listener must open with a PROXY protocol
	// header, whose source address is then the client's
	// (--proxy-protocol-from, MUSTER_PROXY_PROTOCOL_FROM; proxy.go,
	// internal/proxied). Empty: no PROXY protocol; a header is then an
	// HTTP request that does not parse (400).
	ProxyProtocolFrom []netip.Prefix
	// TLSClientCA, when set, makes the API listener (and xDS when it
	// shares the pair) ask for client certificates and verify those given
	// against this CA bundle, reloaded when the file changes; XDSTLSClientCA
	// does it for xDS's own pair (--tls-client-ca, MUSTER_TLS_CLIENT_CA,
	// --xds-tls-client-ca; tls.go).
	TLSClientCA, XDSTLSClientCA string
	// SPIFFEFile names the trust domains whose SPIFFE IDs map to
	// workloads (--spiffe, MUSTER_SPIFFE; spiffe.go); TrustDomains is
	// that file, parsed.
	SPIFFEFile   string
	TrustDomains *identity.TrustDomains
	// RoutingControl is where the out-of-band region routing controls are
	// read (--routing-control, MUSTER_ROUTING_CONTROL: file:/PATH,
	// https://…, dns:NAME[@HOST:PORT]; routingcontrol.go), with
	// RoutingControlCA the CA bundle of an https source
	// (--routing-control-ca, MUSTER_ROUTING_CONTROL_CA) and
	// RoutingControlInterval how often (MUSTER_ROUTING_CONTROL_INTERVAL,
	// 5s). Empty: none is read.
	RoutingControl, RoutingControlCA string
	RoutingControlInterval           time.Duration
	routingControl                   *routingcontrol.Config // the above, parsed
	// AlertTargets is the file naming where alarms are sent
	// (--alert-targets, MUSTER_ALERT_TARGETS; notify.go), with
	// MUSTER_ALERT_RESEND how often a firing alert is sent again (1m).
	// Empty: alarms are only listed (GET /v1/alarms), not sent.
	AlertTargets string
	notify       *notify.Config // the above, loaded
	// Federation are the peer regions followed (--peer, --peer-token,
	// --peer-ca, MUSTER_PEER_*; federation.go, docs/regions.md); no
	// Peers: none.
	Federation federation.Config
}

// shiftFlags holds the shift-back flags as given; empty means "not set".
type shiftFlags struct{ steps, dwell, pendingAlarm string }

// apply parses the shift-back settings: a flag wins over its environment
// variable, which wins over the default.
func (f shiftFlags) apply(c *Config) error {
	var err error
	steps := cmpOr(f.steps, os.Getenv("MUSTER_SHIFT_STEPS"))
	c.ShiftSteps = slices.Clone(shift.DefaultSteps)
	if steps != "" {
		if c.ShiftSteps, err = parseSteps(steps); err != nil {
			return fmt.Errorf("shift steps %q: %w", steps, err)
		}
	}
	c.ShiftDwell = shift.DefaultDwell
	if v := cmpOr(f.dwell, os.Getenv("MUSTER_SHIFT_DWELL")); v != "" {
		if c.ShiftDwell, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("shift dwell: %w", err)
		}
	}
	c.ShiftPendingAlarm = shift.DefaultPendingAlarm
	if v := cmpOr(f.pendingAlarm, os.Getenv("MUSTER_SHIFT_PENDING_ALARM")); v != "" {
		if c.ShiftPendingAlarm, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("shift pending alarm: %w", err)
		}
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// parseSteps reads comma-separated traffic weights, e.g. "0.1,0.25,0.5,1".
func parseSteps(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		w, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, shift.ValidSteps(out)
}

// parseLimit reads "N/duration", e.g. "5/10m".
func parseLimit(name, v string) (policy.Limit, error) {
	n, d, ok := strings.Cut(v, "/")
	if !ok {
		return policy.Limit{}, fmt.Errorf("%s %q: want attempts/window, e.g. 5/10m", name, v)
	}
	max, err := strconv.Atoi(strings.TrimSpace(n))
	if err != nil {
		return policy.Limit{}, fmt.Errorf("%s: %w", name, err)
	}
	win, err := time.ParseDuration(strings.TrimSpace(d))
	if err != nil {
		return policy.Limit{}, fmt.Errorf("%s: %w", name, err)
	}
	l := policy.Limit{Max: max, Window: win}
	if err := l.Validate(); err != nil {
		return policy.Limit{}, fmt.Errorf("%s: %w", name, err)
	}
	return l, nil
}

// loadEnv fills what the environment says. Secrets may come from *_FILE.
func loadEnv(c *Config) error {
	var err error
	if c.DatabaseURL, err = secretEnv("DATABASE_URL"); err != nil {
		return err
	}
	c.Region = envOr("MUSTER_REGION", "local")
	c.Peers = splitList(os.Getenv("MUSTER_PEERS"))
	if v := os.Getenv("MUSTER_PROXY_PROTOCOL_FROM"); v != "" {
		if c.ProxyProtocolFrom, err = proxied.ParseNetworks(v); err != nil {
			return fmt.Errorf("MUSTER_PROXY_PROTOCOL_FROM: %w", err)
		}
	}
	aud := envOr("MUSTER_AUDIENCE", "muster")
	for _, u := range strings.Split(os.Getenv("MUSTER_ISSUERS"), ",") {
		if u = strings.TrimSpace(u); u != "" {
			c.Issuers = append(c.Issuers, identity.IssuerConfig{URL: u, Audience: aud})
		}
	}
	c.LeaseTTL = registry.DefaultLeaseTTL
	if v := os.Getenv("MUSTER_LEASE_TTL"); v != "" {
		if c.LeaseTTL, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("MUSTER_LEASE_TTL: %w", err)
		}
	}
	c.AdmissionFloor = 50
	if v := os.Getenv("MUSTER_ADMISSION_FLOOR"); v != "" {
		if c.AdmissionFloor, err = strconv.Atoi(v); err != nil {
			return fmt.Errorf("MUSTER_ADMISSION_FLOOR: %w", err)
		}
	}
	c.AdmissionWindow = 10 * time.Second
	if v := os.Getenv("MUSTER_ADMISSION_WINDOW"); v != "" {
		if c.AdmissionWindow, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("MUSTER_ADMISSION_WINDOW: %w", err)
		}
	}
	c.Replica = os.Getenv("MUSTER_REPLICA")
	if c.AdvertiseURL == "" {
		c.AdvertiseURL = os.Getenv("MUSTER_ADVERTISE_URL")
	}
	c.PeerTrust = envOr("MUSTER_PEER_TRUST", PeerTrustStrict)
	c.PeerAllowHTTP = false
	if v := os.Getenv("MUSTER_PEER_ALLOW_HTTP"); v != "" {
		if c.PeerAllowHTTP, err = strconv.ParseBool(v); err != nil {
			return fmt.Errorf("MUSTER_PEER_ALLOW_HTTP: %q is not true or false", v)
		}
	}
	c.OverrideLimit = policy.Limit{Max: policy.DefaultOverrideMax, Window: policy.DefaultOverrideWindow}
	if v := os.Getenv("MUSTER_OVERRIDE_LIMIT"); v != "" {
		if c.OverrideLimit, err = parseLimit("MUSTER_OVERRIDE_LIMIT", v); err != nil {
			return err
		}
	}
	c.WriteLimit = policy.Limit{Max: policy.DefaultWriteMax, Window: policy.DefaultWriteWindow}
	if v := os.Getenv("MUSTER_WRITE_LIMIT"); v != "" {
		if c.WriteLimit, err = parseLimit("MUSTER_WRITE_LIMIT", v); err != nil {
			return err
		}
	}
	c.MaxExpiry, c.CosignWindow = policy.DefaultMaxExpiry, policy.DefaultCosignWindow
	if v := os.Getenv("MUSTER_OVERRIDE_MAX_EXPIRY"); v != "" {
		if c.MaxExpiry, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("MUSTER_OVERRIDE_MAX_EXPIRY: %w", err)
		}
	}
	if v := os.Getenv("MUSTER_COSIGN_WINDOW"); v != "" {
		if c.CosignWindow, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("MUSTER_COSIGN_WINDOW: %w", err)
		}
	}
	c.UI = webui.OIDCConfig{
		IssuerURL:   os.Getenv("MUSTER_UI_ISSUER"),
		ClientID:    os.Getenv("MUSTER_UI_CLIENT_ID"),
		RedirectURL: os.Getenv("MUSTER_UI_REDIRECT_URL"),
		RoleClaim:   os.Getenv("MUSTER_UI_ROLE_CLAIM"),
		TeamClaim:   os.Getenv("MUSTER_UI_TEAM_CLAIM"),
	}
	if c.UI.ClientSecret, err = secretEnv("MUSTER_UI_CLIENT_SECRET"); err != nil {
		return err
	}
	c.UIInsecureCookie = os.Getenv("MUSTER_UI_INSECURE_COOKIE") == "1"
	c.DBTimeout, c.DBIOTimeout, c.MaxPendingWindows = server.DefaultDBTimeout, db.DefaultIOTimeout, 2_000_000
	if v := os.Getenv("MUSTER_DB_TIMEOUT"); v != "" {
		if c.DBTimeout, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("MUSTER_DB_TIMEOUT: %w", err)
		}
	}
	if v := os.Getenv("MUSTER_DB_IO_TIMEOUT"); v != "" {
		if c.DBIOTimeout, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("MUSTER_DB_IO_TIMEOUT: %w", err)
		}
	}
	c.DrainSpread, c.ShutdownGrace, c.ClockSkewAlarm = stream.DefaultDrainSpread, app.DefaultShutdownGrace, db.DefaultSkewAlarm
	for _, d := range []struct {
		name string
		to   *time.Duration
	}{{"MUSTER_DRAIN_SPREAD", &c.DrainSpread}, {"MUSTER_SHUTDOWN_GRACE", &c.ShutdownGrace}, {"MUSTER_CLOCK_SKEW_ALARM", &c.ClockSkewAlarm}} {
		if v := os.Getenv(d.name); v != "" {
			if *d.to, err = time.ParseDuration(v); err != nil {
				return fmt.Errorf("%s: %w", d.name, err)
			}
		}
	}
	switch v := os.Getenv("MUSTER_DB_IAM"); v {
	case "", "0":
	case "1":
		c.DBIAM = true
	default:
		return fmt.Errorf("MUSTER_DB_IAM %q: want 1 or 0", v)
	}
	c.DBIAMRegion = os.Getenv("MUSTER_DB_IAM_REGION")
	switch c.Migrate = envOr("MUSTER_MIGRATE", MigrateUp); c.Migrate {
	case MigrateUp, MigrateSkip:
	default:
		return fmt.Errorf("MUSTER_MIGRATE %q: want %s (a start applies the pending migrations, the default) or %s (a migrations Job applies them; a start refuses a schema behind this release or dirty)", c.Migrate, MigrateUp, MigrateSkip)
	}
	if v := os.Getenv("MUSTER_MAX_PENDING_WINDOWS"); v != "" {
		if c.MaxPendingWindows, err = strconv.Atoi(v); err != nil {
			return fmt.Errorf("MUSTER_MAX_PENDING_WINDOWS: %w", err)
		}
	}
	c.Limits = server.DefaultLimits()
	for _, l := range []struct {
		env string
		dst *policy.Limit
	}{
		{"MUSTER_REPORT_ITEMS_LIMIT", &c.Limits.ReportItems},
		{"MUSTER_REPORT_BATCH_LIMIT", &c.Limits.ReportRequests},
		{"MUSTER_REGISTRATION_LIMIT", &c.Limits.Registrations},
		{"MUSTER_DEREGISTRATION_LIMIT", &c.Limits.Deregistrations},
		{"MUSTER_LEASE_RENEWAL_LIMIT", &c.Limits.LeaseRenewals},
		{"MUSTER_UNAUTHENTICATED_LIMIT", &c.Limits.Unauthenticated},
	} {
		if v := os.Getenv(l.env); v != "" {
			if *l.dst, err = parseLimit(l.env, v); err != nil {
				return err
			}
		}
	}
	if v := os.Getenv("MUSTER_WATCH_STREAMS_LIMIT"); v != "" {
		if c.Limits.WatchStreams, err = strconv.Atoi(v); err != nil || c.Limits.WatchStreams <= 0 {
			return fmt.Errorf("MUSTER_WATCH_STREAMS_LIMIT %q: want a number of streams above 0", v)
		}
	}
	c.XDSLimits = xds.DefaultLimits()
	for _, l := range []struct {
		env string
		dst *int
	}{
		{xds.EnvMaxNames, &c.XDSLimits.NamesPerStream},
		{xds.EnvMaxStreamsPerPrincipal, &c.XDSLimits.StreamsPerPrincipal},
		{xds.EnvMaxStreamsPerConnection, &c.XDSLimits.StreamsPerConnection},
	} {
		if v := os.Getenv(l.env); v != "" {
			if *l.dst, err = strconv.Atoi(v); err != nil || *l.dst <= 0 {
				return fmt.Errorf("%s %q: want a number above 0", l.env, v)
			}
		}
	}
	if v := os.Getenv(xds.EnvMaxNameBytes); v != "" {
		if c.XDSLimits.NameBytesPerPrincipal, err = strconv.ParseInt(v, 10, 64); err != nil || c.XDSLimits.NameBytesPerPrincipal <= 0 {
			return fmt.Errorf("%s %q: want a number of bytes above 0", xds.EnvMaxNameBytes, v)
		}
	}
	if c.MetricsAddr == "" {
		c.MetricsAddr = os.Getenv("MUSTER_METRICS_ADDR")
	}
	loadTLSEnv(c)
	if err := loadAuditEnv(c); err != nil {
		return err
	}
	if v := os.Getenv("MUSTER_LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			return fmt.Errorf("MUSTER_LOG_LEVEL: %w", err)
		}
	}
	return nil
}

// Validate checks the configuration for the command it will run.
func (c *Config) Validate() error {
	if c.Addr == "" {
		return errors.New("an address to listen on is required (--addr)")
	}
	if !registry.ValidName(c.Region) {
		return fmt.Errorf("MUSTER_REGION %q must be a DNS label", c.Region)
	}
	if c.AdmissionFloor <= 0 {
		return fmt.Errorf("MUSTER_ADMISSION_FLOOR %d must be above 0", c.AdmissionFloor)
	}
	if c.AdmissionWindow < time.Second {
		return fmt.Errorf("MUSTER_ADMISSION_WINDOW %s is below 1s (Retry-After counts whole seconds)", c.AdmissionWindow)
	}
	if err := shift.ValidSteps(c.ShiftSteps); err != nil {
		return err
	}
	if c.ShiftDwell < 0 || c.ShiftPendingAlarm <= 0 {
		return fmt.Errorf("the shift dwell (%s) must not be negative and the pending alarm time (%s) must be above 0", c.ShiftDwell, c.ShiftPendingAlarm)
	}
	if c.DBTimeout <= 0 || c.DBIOTimeout <= 0 {
		return fmt.Errorf("MUSTER_DB_TIMEOUT (%s) and MUSTER_DB_IO_TIMEOUT (%s) must be above 0", c.DBTimeout, c.DBIOTimeout)
	}
	if c.MaxPendingWindows <= 0 {
		return fmt.Errorf("MUSTER_MAX_PENDING_WINDOWS %d must be above 0", c.MaxPendingWindows)
	}
	if c.ClockSkewAlarm < 0 {
		return fmt.Errorf("MUSTER_CLOCK_SKEW_ALARM (%s) must not be negative", c.ClockSkewAlarm)
	}
	if grace := cmp.Or(c.ShutdownGrace, app.DefaultShutdownGrace); c.DrainSpread < 0 || grace < time.Second || c.DrainSpread >= grace {
		return fmt.Errorf("MUSTER_DRAIN_SPREAD (%s) must be at least 0 and below MUSTER_SHUTDOWN_GRACE (%s), which must be at least 1s", c.DrainSpread, c.ShutdownGrace)
	}
	if err := c.validateAdvertise(); err != nil {
		return err
	}
	if err := c.validateTLS(); err != nil {
		return err
	}
	if err := c.validateIAM(); err != nil {
		return err
	}
	if err := c.Audit.Validate(); err != nil {
		return err
	}
	for _, p := range c.Peers {
		if u, err := url.Parse(p); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("MUSTER_PEERS: %q is not a replica's base URL (http://host:port)", p)
		}
		if !c.PeerAllowHTTP && ownership.InsecureURL(p) {
			return fmt.Errorf("MUSTER_PEERS: %q is plain http off loopback: views and evidence would travel between replicas in clear; give the replicas TLS (https://), or set MUSTER_PEER_ALLOW_HTTP=true in a lab", p)
		}
	}
	if c.PeerTrust == "" {
		c.PeerTrust = PeerTrustStrict
	}
	if c.PeerTrust != PeerTrustStrict && c.PeerTrust != PeerTrustUpgrade {
		return fmt.Errorf("MUSTER_PEER_TRUST %q: want %s (the default) or %s (during a rolling upgrade from the release before)", c.PeerTrust, PeerTrustStrict, PeerTrustUpgrade)
	}
	if c.LeaseTTL < time.Second {
		return fmt.Errorf("MUSTER_LEASE_TTL %s is below 1s", c.LeaseTTL)
	}
	if !c.Dev {
		if c.DatabaseURL == "" {
			return errors.New("muster serve needs DATABASE_URL (or DATABASE_URL_FILE); for a local database run `muster dev`")
		}
		if c.UI.IssuerURL != "" && (c.UI.ClientID == "" || c.UI.RedirectURL == "") {
			return errors.New("the web UI (MUSTER_UI_ISSUER) needs MUSTER_UI_CLIENT_ID and MUSTER_UI_REDIRECT_URL too")
		}
		if len(c.Issuers) == 0 {
			return errors.New("muster serve needs MUSTER_ISSUERS, the comma-separated OIDC issuer URLs whose tokens it accepts")
		}
	}
	return nil
}

// validateIAM checks DATABASE_URL for IAM database authentication: a
// token is a password good for 15 minutes, signed for the URL's user. It
// goes only to a server that proves it is the database: sslmode=require
// and verify-ca encrypt but check no host name (require checks nothing at
// all without a root certificate), so whoever answers on the writer's
// address, a spoofed DNS answer or a man in the middle, would be handed a
// token that logs in to the real database. verify-full is the only mode
// that rules that out. The server is verified against the sslrootcert the
// URL names, read now so a missing or wrong file stops the start instead
// of every connection, or without one against the RDS CA bundle built
// into muster (dbtarget.go, rdsRoots).
func (c *Config) validateIAM() error {
	if !c.DBIAM {
		return nil
	}
	if c.DatabaseURL == "" {
		return errors.New("MUSTER_DB_IAM needs DATABASE_URL (the local dev cluster takes no IAM tokens)")
	}
	u, err := url.Parse(c.DatabaseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return errors.New("MUSTER_DB_IAM needs DATABASE_URL as a postgres:// URL")
	}
	if u.User.Username() == "" && u.Query().Get("user") == "" {
		return errors.New("MUSTER_DB_IAM: DATABASE_URL names no user to sign tokens for")
	}
	// pgx takes a setting from the URL, else from the PG* environment.
	q := u.Query()
	mode := cmpOr(q.Get("sslmode"), os.Getenv("PGSSLMODE"))
	if mode != "verify-full" {
		return fmt.Errorf("MUSTER_DB_IAM: DATABASE_URL's sslmode is %q; an IAM token is a password, so muster sends it only to a server whose certificate and host name it has verified: "+
			"add sslmode=verify-full to DATABASE_URL (the server is verified against the RDS CA bundle built into muster, or the sslrootcert you name)", mode)
	}
	root := cmpOr(q.Get("sslrootcert"), os.Getenv("PGSSLROOTCERT"))
	switch root {
	case "":
		return nil // the built-in RDS CA bundle
	case "system":
		return errors.New("MUSTER_DB_IAM: DATABASE_URL's sslrootcert is \"system\", but the RDS CAs are not among the system roots; leave sslrootcert out to use the RDS CA bundle built into muster, or give a bundle's file (sslrootcert=/path/to/global-bundle.pem)")
	}
	if err := checkCABundle(root); err != nil {
		return fmt.Errorf("MUSTER_DB_IAM: DATABASE_URL's sslrootcert: %w; give the RDS CA bundle (https://truststore.pki.rds.amazonaws.com/global/global-bundle.pem), or leave sslrootcert out to use the one built into muster", err)
	}
	return nil
}

// checkCABundle reads a PEM CA bundle: at least one block, every block a
// certificate that parses (text between blocks, such as comments, is
// skipped). A missing file, a DER file or a key is refused at start, by
// name, rather than failing every connection later.
func checkCABundle(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	n := 0
	for rest := b; ; n++ {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return fmt.Errorf("%s: block %d is a %s, want only CERTIFICATE blocks", file, n+1, blk.Type)
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return fmt.Errorf("%s: certificate %d does not parse: %w", file, n+1, err)
		}
	}
	if n == 0 {
		return fmt.Errorf("%s holds no PEM certificate", file)
	}
	return nil
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// secretEnv reads K, or the file named by K_FILE.
func secretEnv(k string) (string, error) {
	if f := os.Getenv(k + "_FILE"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("%s_FILE: %w", k, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return os.Getenv(k), nil
}

// validateAdvertise checks AdvertiseURL: a base URL, http or https as
// the listener serves (https with --tls-cert), naming a host and port
// and nothing else.
func (c *Config) validateAdvertise() error {
	if c.AdvertiseURL == "" {
		return nil
	}
	u, err := url.Parse(c.AdvertiseURL)
	if err != nil {
		return fmt.Errorf("MUSTER_ADVERTISE_URL %q: %w", c.AdvertiseURL, err)
	}
	want := "http"
	if c.TLSCert != "" {
		want = "https"
	}
	switch {
	case u.Scheme != want:
		return fmt.Errorf("MUSTER_ADVERTISE_URL %q: the API listener serves %s", c.AdvertiseURL, want)
	case u.Hostname() == "" || u.Port() == "":
		return fmt.Errorf("MUSTER_ADVERTISE_URL %q: want %s://HOST:PORT", c.AdvertiseURL, want)
	case u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return fmt.Errorf("MUSTER_ADVERTISE_URL %q: a base URL has no user, path, query or fragment", c.AdvertiseURL)
	}
	return c.checkAdvertised("MUSTER_ADVERTISE_URL", c.AdvertiseURL)
}

// The values of MUSTER_PEER_TRUST.
const (
	PeerTrustStrict  = "strict"
	PeerTrustUpgrade = "upgrade"
)

// checkAdvertised refuses to advertise base to the peers when it is plain
// http off loopback, unless PeerAllowHTTP: the peers would follow this
// replica's views and send it evidence in clear.
func (c *Config) checkAdvertised(what, base string) error {
	if c.PeerAllowHTTP || !ownership.InsecureURL(base) {
		return nil
	}
	return fmt.Errorf("%s %q: this replica would advertise plain http on an address off loopback, and its peers would follow its views and send it evidence in clear; serve TLS (--tls-cert, https://), or set MUSTER_PEER_ALLOW_HTTP=true in a lab", what, base)
}
