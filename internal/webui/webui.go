// Package webui is muster's admin web UI: server-rendered pages (templ
// components in views/, assets in static/) behind an OIDC sign-in.
//
// # Sign-in
//
// Operators sign in with the authorization code flow and PKCE against the
// configured issuer (go-oidc and golang.org/x/oauth2); in `muster dev` that
// is the built-in issuer and its sign-in page for development users. Each
// attempt gets its own state, nonce and PKCE verifier, kept in the session
// and checked on the callback. The ID token's claims become an operator
// Principal by the same rules as bearer tokens (identity.NewOperator), the
// role read from a configurable claim.
//
// # Sessions
//
// Sessions are server-side (github.com/alexedwards/scs with its PostgreSQL
// store, table sessions), so replicas share them; the browser holds only an
// opaque token in a Secure, HttpOnly, SameSite=Lax cookie. A session ends
// after IdleTimeout without a request or Lifetime after sign-in, whichever
// comes first; both are checked against the injected clock, and scs's own
// timeouts expire the stored row as a backstop. The token is renewed at
// sign-in, and sign-out (a POST) destroys the session.
//
// # Forms
//
// Every state-changing request goes through http.CrossOriginProtection;
// refused cross-origin requests are audited (ui.cross_origin). Actions are
// registered with Action, which refuses and audits callers whose role is too
// low before the action runs; viewers see everything and act on nothing.
//
// # Shift-backs
//
// The shift-backs page (shiftspage.go) drains zones, steps traffic back and
// confirms manual shift-backs through Config.Shifts (shift.Service), the
// same audited calls the /v1/shifts API makes, with the session's operator
// as the actor. A refusal is shown on the page in plain words with its
// figures; an accepted action redirects back to the page (post, redirect,
// get) with what it did.
package webui

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/alexedwards/scs/postgresstore"
	"github.com/alexedwards/scs/v2"
	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/guardlog"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/lagstats"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/preview"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/zonehistory"
	"github.com/musterhq/muster/static"
)

// Eligibility is the evaluator state as the pages read it, each service's
// from the replica that owns it (ownerread.Reader; ownerread.Local for a
// replica alone).
type Eligibility interface {
	// Eligibility fails with an *ownerread.OwnerUnreachableError when
	// the service's owner did not answer.
	Eligibility(ctx context.Context, service string) (evaluator.ServiceEligibility, error)
	// Stats names the replicas that did not answer: their services have
	// no counts.
	Stats(ctx context.Context) (stats []eligibility.ServiceStats, at time.Time, unanswered []string, err error)
}

// OverrideCounts is the overrides in force (policy.InForce) as the
// overview counts them per service.
type OverrideCounts interface {
	Counts() map[string]policy.OverrideCount
}

// Publication is the publisher as the overview reads it: open alarms and
// each service's last published view.
type Publication interface {
	Alarms() []assembler.Alarm
	View(service string) (*assembler.View, bool)
}

// OIDCConfig names the issuer operators sign in with and the UI's client
// registration there.
type OIDCConfig struct {
	// IssuerURL is the issuer identifier; discovery is fetched from it on
	// the first sign-in.
	IssuerURL string
	// ClientID and ClientSecret are the UI's client credentials.
	ClientID, ClientSecret string
	// RedirectURL is the callback, e.g. https://muster.example/ui/auth/callback.
	RedirectURL string
	// RoleClaim names the ID-token claim holding the role (viewer,
	// operator, admin): "muster_role" when empty.
	RoleClaim string
	// TeamClaim names the claim holding the team: "muster_team" when empty.
	TeamClaim string
	// HomeIssuer is the API's home issuer (identity.Verifier.Home), whose
	// principals are named without it: IssuerURL when empty. Operators
	// signed in through it act under the same names as their bearer
	// tokens; through another issuer, under names that carry it.
	HomeIssuer string
}

// Config configures the UI.
type Config struct {
	Logger    *slog.Logger
	Pool      *pgxpool.Pool // sessions and audit records
	Registry  *registry.Registry
	Evaluator Eligibility
	Publisher Publication
	Audit     *audit.Log
	// Overrides, when set, offers the override forms (mark ineligible or
	// eligible, co-sign, lift) through the same policy path as the API.
	Overrides *policy.Service
	// InForce, when set, counts the overrides in force per service for
	// the overview.
	InForce OverrideCounts
	// Guards, when set, is the guard-trip history the service page shows.
	Guards *guardlog.Log
	// Shifts, when set, enables the shift-backs page and its actions.
	Shifts ShiftBacks
	// Reconcile, when set, is what the reconciliation page shows; without
	// it the page says no sources are reconciled.
	Reconcile Reconciliation
	// Removals, when set, enables the removal holds page and its
	// confirmations.
	Removals *Removals
	// ContractPreview, when set, offers Preview on the contract page: it
	// authorises, validates and audits the attempt as a contract write
	// does, and replays the service's evidence under the proposed
	// contract and the one in force (registry.PreviewContract, then
	// Evaluator.PreviewContract), changing nothing.
	ContractPreview func(ctx context.Context, actor identity.Principal, service string, c registry.Contract) (preview.Result, error)
	// ZoneHistory, when set, is the per-zone record the overview draws
	// its sparklines from (zonehistory.History), sampled every
	// ZoneHistoryEvery.
	ZoneHistory interface {
		Since(context.Context, time.Time) []zonehistory.Series
	}
	ZoneHistoryEvery time.Duration
	// ProberHistory, when set, is every prober's reach over time
	// (targets reported on, of those assigned), sampled likewise.
	ProberHistory interface {
		Since(context.Context, time.Time) []zonehistory.Series
	}
	// Hub, when set, gives pages live updates: they reload their content
	// when a view they show changes (GET /events, refresh.js).
	Hub *stream.Hub
	// Lags, when set, is each service's withdrawal and delivery lags, the
	// service's lag page draws (lagstats.Recorder).
	Lags interface {
		Of(service string) []lagstats.Histogram
	}
	// Ownership, when set, is the region's shard ownership the replicas
	// page shows.
	Ownership interface{ Region() ownership.RegionStatus }
	// Relay, when set, is the relay from peer replicas the replicas page
	// shows per peer (connected, lag, updates).
	Relay interface{ Status() []relay.PeerStatus }
	// EpochsLeft, when set, is the region's version epochs left, on the
	// replicas page.
	EpochsLeft func() uint64
	// Region is this muster's region, on the regions page.
	Region string
	// PeerRegions, when set, are the peer regions followed,
	// PeerStaleAfter their staleness threshold; RoutingControls, when
	// set, the routing controls read. The regions page shows them.
	PeerRegions     PeerRegions
	PeerStaleAfter  time.Duration
	RoutingControls RoutingControls
	// Alarms, when set, lists every open alarm for the overview's banner
	// (the server's Alarms: guard, shift-backs, leases, database,
	// probers); otherwise the banner shows the publisher's and the
	// shift-backs' alarms.
	Alarms func() []assembler.Alarm
	OIDC   OIDCConfig
	// HTTPClient is used for discovery, keys and the code exchange; one
	// with a 10 s timeout when nil.
	HTTPClient *http.Client
	// BasePath is where the UI is mounted: "/ui" when empty.
	BasePath string
	// InsecureCookie drops the cookie's Secure attribute, for plain-http
	// development on a browser that refuses Secure cookies on loopback.
	InsecureCookie bool
	// HSTS sends Strict-Transport-Security on every page: set when muster
	// serves over TLS, so a browser never falls back to plain http.
	HSTS bool
	// IdleTimeout ends a session after this long without a request: 30 min.
	IdleTimeout time.Duration
	// Lifetime ends a session this long after sign-in: 12 h.
	Lifetime time.Duration
	// Now is the clock (time.Now by default).
	Now func() time.Time
	// SessionCleanup is how often expired sessions are deleted: 5 min; a
	// negative value turns the cleanup off.
	SessionCleanup time.Duration
}

func (c *Config) validate() error {
	switch {
	case c.Pool == nil || c.Registry == nil || c.Evaluator == nil || c.Publisher == nil || c.Audit == nil:
		return errors.New("webui: Pool, Registry, Evaluator, Publisher and Audit are required")
	case c.OIDC.IssuerURL == "" || c.OIDC.ClientID == "" || c.OIDC.RedirectURL == "":
		return errors.New("webui: OIDC IssuerURL, ClientID and RedirectURL are required")
	}
	if c.InsecureCookie && c.HSTS {
		return errors.New("webui: InsecureCookie is for plain http; with TLS (HSTS) the session cookie is Secure")
	}
	if c.InsecureCookie {
		// Without Secure the cookie would also travel over plain http to
		// a real host; allow that only for development on loopback.
		ru, err := url.Parse(c.OIDC.RedirectURL)
		if err != nil || ru.Scheme != "http" || !isLoopback(ru.Hostname()) {
			return errors.New("webui: InsecureCookie is only for plain-http development on a loopback address")
		}
	}
	if c.OIDC.HomeIssuer == "" {
		c.OIDC.HomeIssuer = c.OIDC.IssuerURL
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if c.BasePath == "" {
		c.BasePath = "/ui"
	}
	c.BasePath = "/" + strings.Trim(c.BasePath, "/")
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 30 * time.Minute
	}
	if c.Lifetime <= 0 {
		c.Lifetime = 12 * time.Hour
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.SessionCleanup == 0 {
		c.SessionCleanup = 5 * time.Minute
	}
	if c.OIDC.RoleClaim == "" {
		c.OIDC.RoleClaim = "muster_role"
	}
	if c.OIDC.TeamClaim == "" {
		c.OIDC.TeamClaim = "muster_team"
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// UI is the admin web UI's HTTP handler. Close it to stop the session
// cleanup.
type UI struct {
	cfg      Config
	log      *slog.Logger
	sessions *scs.SessionManager
	store    *postgresstore.PostgresStore
	sqlDB    *sql.DB
	mux      *http.ServeMux
	handler  http.Handler

	mu       sync.Mutex
	provider *oidc.Provider // nil until the first successful discovery

	chainMu sync.Mutex
	chain   *chainCheck // the last audit chain verification

	streams viewerStreams // open live-update streams per viewer (events.go)
}

// New returns the UI. No network call is made until the first sign-in.
func New(cfg Config) (*UI, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	u := &UI{cfg: cfg, log: cfg.Logger.With("component", "webui"), mux: http.NewServeMux()}
	u.sqlDB = stdlib.OpenDBFromPool(cfg.Pool)
	cleanup := cfg.SessionCleanup
	if cleanup < 0 {
		cleanup = 0
	}
	u.store = postgresstore.NewWithCleanupInterval(u.sqlDB, cleanup)

	sm := scs.New()
	sm.Store = u.store
	// scs expires sessions by the wall clock; the UI's own checks against
	// cfg.Now come first (session.go).
	sm.IdleTimeout = cfg.IdleTimeout
	sm.Lifetime = cfg.Lifetime
	sm.Cookie.Name = "muster_session"
	sm.Cookie.Path = cfg.BasePath
	sm.Cookie.HttpOnly = true
	sm.Cookie.Secure = !cfg.InsecureCookie
	sm.Cookie.SameSite = http.SameSiteLaxMode
	sm.Cookie.Persist = false
	sm.ErrorFunc = func(w http.ResponseWriter, r *http.Request, err error) {
		u.log.Error("session store", "err", err)
		u.message(w, r, http.StatusServiceUnavailable, "Sessions unavailable", "muster cannot reach its session store right now; try again in a moment.")
	}
	u.sessions = sm

	u.routes()
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(u.crossOriginRefused))
	u.handler = cop.Handler(sm.LoadAndSave(securityHeaders(u.mux, cfg.HSTS)))
	return u, nil
}

// Close stops the session store's cleanup and releases its connection.
func (u *UI) Close() error {
	u.store.StopCleanup()
	return u.sqlDB.Close()
}

// BasePath is where the UI expects to be mounted.
func (u *UI) BasePath() string { return u.cfg.BasePath }

// ServeHTTP implements http.Handler; paths include the base path.
func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) { u.handler.ServeHTTP(w, r) }

func (u *UI) routes() {
	b := u.cfg.BasePath
	u.mux.Handle("GET "+b+"/static/", http.StripPrefix(b+"/static/", staticHandler()))
	u.mux.HandleFunc("GET "+b+"/login", u.login)
	u.mux.HandleFunc("GET "+b+"/auth/callback", u.callback)
	u.mux.HandleFunc("POST "+b+"/logout", u.logout)
	u.mux.HandleFunc(b+"/logout", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodPost)
		u.message(w, r, http.StatusMethodNotAllowed, "Use the sign-out button", "Signing out is a form submission (POST), so another site cannot sign you out with a link.")
	})
	u.mux.HandleFunc("GET "+b+"/signed-out", u.signedOut)
	u.mux.Handle("GET "+b+"/{$}", u.page(u.overview))
	u.mux.Handle("GET "+b+"/audit", u.page(u.auditPage))
	u.mux.Handle("GET "+b+"/reconcile", u.page(u.reconcilePage))
	u.mux.Handle("GET "+b+"/services/{name}", u.page(u.servicePage))
	u.contractRoutes()
	u.mux.Handle("GET "+b+"/services/{name}/lag", u.page(u.lagPage))
	u.mux.HandleFunc("GET "+b+"/events", u.events)
	u.mux.Handle("GET "+b+"/services/{name}/timeline", u.page(u.serviceTimeline))
	if u.cfg.Overrides != nil {
		u.overrideRoutes()
	}
	u.shiftRoutes()
	u.holdRoutes()
	u.mux.Handle("GET "+b+"/replicas", u.page(u.replicasPage))
	u.mux.Handle("GET "+b+"/regions", u.page(u.regionsPage))
	u.mux.HandleFunc(b+"/", func(w http.ResponseWriter, r *http.Request) {
		u.message(w, r, http.StatusNotFound, "Not found", "There is no page at "+r.URL.Path+".")
	})
}

func staticHandler() http.Handler {
	fs := http.FileServerFS(static.FS)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		fs.ServeHTTP(w, r)
	})
}

// securityHeaders keeps pages out of frames and caches and allows only the
// UI's own scripts and styles; with hsts (muster serves over TLS) it
// tells browsers to use https only, for a year.
func securityHeaders(next http.Handler, hsts bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		if hsts {
			h.Set("Strict-Transport-Security", "max-age=31536000")
		}
		if h.Get("Cache-Control") == "" {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// oidcProvider discovers the issuer once; a failed discovery is retried on
// the next sign-in.
func (u *UI) oidcProvider(ctx context.Context) (*oidc.Provider, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.provider != nil {
		return u.provider, nil
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, u.cfg.HTTPClient), 10*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(ctx, u.cfg.OIDC.IssuerURL)
	if err != nil {
		return nil, fmt.Errorf("discover issuer %s: %w", u.cfg.OIDC.IssuerURL, err)
	}
	u.provider = p
	return p, nil
}
