package webui_test

import (
	"github.com/musterhq/muster/internal/ownerread"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/webui"
)

// auditEvents lists audit events matching f, newest first.
func auditEvents(t testing.TB, st *apptest.Stack, f audit.Filter) []audit.Event {
	t.Helper()
	f.Limit = 100
	evs, err := audit.List(t.Context(), db.New(st.Pool), f)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func TestSignInEachRole(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	st.Seed(t)
	for _, u := range devissuer.Users() {
		b := newBrowser(t, st)
		p := b.signIn(u.Subject)
		if !strings.Contains(p.body, `Signed in as <strong>`+u.Subject+`</strong>`) ||
			!strings.Contains(p.body, `<strong id="role">`+string(u.Role)+`</strong>`) {
			t.Errorf("%s: overview does not show who is signed in with role %s:\n%s", u.Subject, u.Role, p.body)
		}
		if !strings.Contains(p.body, `data-service="web"`) || !strings.Contains(p.body, `data-service="api"`) {
			t.Errorf("%s: overview does not list the seeded services", u.Subject)
		}
		evs := auditEvents(t, st, audit.Filter{Actor: "operator:" + u.Subject, Action: "ui.sign_in"})
		if len(evs) != 1 || evs[0].Outcome != audit.Accepted || evs[0].Reason != "role "+string(u.Role) {
			t.Errorf("%s: sign-in audit records %+v", u.Subject, evs)
		}
		// The session cookie is Secure, HttpOnly and SameSite=Lax.
		res := b.do("GET", "/ui/login", nil, nil) // signed in: back to the overview
		if res.status != http.StatusSeeOther || res.location != "/ui/" {
			t.Errorf("%s: /ui/login while signed in: %d %q", u.Subject, res.status, res.location)
		}
	}
}

func TestSessionCookieAttributes(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	b := newBrowser(t, st)
	res := b.get("/ui/login")
	var sc string
	for _, h := range res.header.Values("Set-Cookie") {
		if strings.HasPrefix(h, "muster_session=") {
			sc = h
		}
	}
	for _, want := range []string{"Secure", "HttpOnly", "SameSite=Lax", "Path=/ui"} {
		if !strings.Contains(sc, want) {
			t.Errorf("session cookie %q lacks %s", sc, want)
		}
	}
}

func TestCallbackRefusesWrongState(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	b := newBrowser(t, st)
	cb := b.atIssuer(b.startSignIn(), "alice")
	u, _ := url.Parse(cb)
	q := u.Query()
	q.Set("state", "forged-"+q.Get("state"))
	u.RawQuery = q.Encode()
	res := b.get(u.String())
	if res.status != http.StatusBadRequest || !strings.Contains(res.body, "state mismatch") {
		t.Fatalf("callback with a wrong state: %d\n%s", res.status, res.body)
	}
	if res := b.get("/ui/"); res.status != http.StatusSeeOther {
		t.Errorf("after a refused callback the overview answered %d, want a redirect to sign in", res.status)
	}
	evs := auditEvents(t, st, audit.Filter{Action: "ui.sign_in", Outcome: audit.Refused})
	if len(evs) != 1 || !strings.Contains(evs[0].Reason, "state mismatch") {
		t.Errorf("refused sign-in audit: %+v", evs)
	}
	// The attempt is spent: the genuine response no longer works either.
	if res := b.get(cb); res.status != http.StatusBadRequest {
		t.Errorf("replayed genuine callback after the attempt was spent: %d", res.status)
	}
}

func TestCallbackRefusesWrongNonce(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	b := newBrowser(t, st)
	authURL := b.startSignIn()
	// Same state and PKCE challenge, another nonce: the code exchange
	// succeeds but the ID token does not belong to this attempt.
	u, _ := url.Parse(authURL)
	q := u.Query()
	if q.Get("nonce") == "" || q.Get("code_challenge_method") != "S256" {
		t.Fatalf("authorization request lacks nonce or S256 PKCE: %s", authURL)
	}
	q.Set("nonce", "not-the-nonce-of-this-attempt")
	u.RawQuery = q.Encode()
	cb := b.atIssuer(u.String(), "oscar")
	res := b.get(cb)
	if res.status != http.StatusBadRequest || !strings.Contains(res.body, "nonce does not match") {
		t.Fatalf("callback with a wrong nonce: %d\n%s", res.status, res.body)
	}
	if res := b.get("/ui/"); res.status != http.StatusSeeOther {
		t.Errorf("after a refused callback the overview answered %d", res.status)
	}
	evs := auditEvents(t, st, audit.Filter{Action: "ui.sign_in", Outcome: audit.Refused})
	if len(evs) != 1 || !strings.Contains(evs[0].Reason, "nonce") {
		t.Errorf("refused sign-in audit: %+v", evs)
	}
}

func TestSessionIdleTimeout(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	b := newBrowser(t, st)
	b.signIn("vera")
	st.Clock.Advance(29 * time.Minute)
	if res := b.get("/ui/"); res.status != http.StatusOK {
		t.Fatalf("after 29 idle minutes: %d, want the page", res.status)
	}
	st.Clock.Advance(30*time.Minute + time.Second)
	res := b.get("/ui/audit")
	if res.status != http.StatusSeeOther || !strings.HasPrefix(res.location, "/ui/login") {
		t.Fatalf("after 30 idle minutes: %d %q, want a redirect to sign in", res.status, res.location)
	}
	// The session is gone, not just refused once.
	st.Clock.Advance(-30 * time.Minute)
	if res := b.get("/ui/"); res.status != http.StatusSeeOther {
		t.Errorf("the expired session came back: %d", res.status)
	}
}

func TestSessionAbsoluteTimeout(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	b := newBrowser(t, st)
	b.signIn("oscar")
	// Active every 25 minutes: never idle, but the lifetime is 12 h.
	for elapsed := 25 * time.Minute; elapsed <= 12*time.Hour; elapsed += 25 * time.Minute {
		st.Clock.Advance(25 * time.Minute)
		if res := b.get("/ui/"); res.status != http.StatusOK {
			t.Fatalf("after %s of activity: %d, want the page", elapsed, res.status)
		}
	}
	st.Clock.Advance(25 * time.Minute)
	if res := b.get("/ui/"); res.status != http.StatusSeeOther {
		t.Fatalf("past the 12 h lifetime: %d, want a redirect to sign in", res.status)
	}
}

func TestLogout(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	b := newBrowser(t, st)
	b.signIn("alice")
	old := b.cookies["muster_session"]
	res := b.do("POST", "/ui/logout", url.Values{}, sameOrigin)
	if res.status != http.StatusSeeOther || res.location != "/ui/signed-out" {
		t.Fatalf("logout: %d %q", res.status, res.location)
	}
	if p := b.get("/ui/signed-out"); !strings.Contains(p.body, "Signed out") {
		t.Errorf("signed-out page: %s", p.body)
	}
	if res := b.get("/ui/"); res.status != http.StatusSeeOther {
		t.Errorf("after logout the overview answered %d", res.status)
	}
	// The old session token is dead server-side, not only forgotten.
	b2 := newBrowser(t, st)
	b2.cookies["muster_session"] = old
	if res := b2.get("/ui/"); res.status != http.StatusSeeOther {
		t.Errorf("the logged-out session token still works: %d", res.status)
	}
	if evs := auditEvents(t, st, audit.Filter{Actor: "operator:alice", Action: "ui.sign_out"}); len(evs) != 1 {
		t.Errorf("sign-out audit: %+v", evs)
	}
	if res := b.get("/ui/logout"); res.status != http.StatusMethodNotAllowed {
		t.Errorf("GET /ui/logout: %d, want 405", res.status)
	}
}

func TestCrossSitePostRefused(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	b := newBrowser(t, st)
	b.signIn("alice")
	for _, h := range []map[string]string{
		{"Origin": "https://evil.example"},
		{"Sec-Fetch-Site": "cross-site"},
	} {
		res := b.do("POST", "/ui/logout", url.Values{}, h)
		if res.status != http.StatusForbidden {
			t.Errorf("cross-site POST %v: %d, want 403", h, res.status)
		}
	}
	// Still signed in: the forged sign-out did nothing.
	if res := b.get("/ui/"); res.status != http.StatusOK {
		t.Errorf("after refused cross-site POSTs the overview answered %d", res.status)
	}
	evs := auditEvents(t, st, audit.Filter{Action: "ui.cross_origin"})
	if len(evs) != 2 {
		t.Fatalf("cross-origin audit: %+v", evs)
	}
	for _, e := range evs {
		if e.Outcome != audit.Refused || e.Actor != "operator:alice" || e.Target != "/ui/logout" {
			t.Errorf("cross-origin audit record %+v", e)
		}
	}
	if evs := auditEvents(t, st, audit.Filter{Action: "ui.sign_out"}); len(evs) != 0 {
		t.Errorf("a refused POST signed out: %+v", evs)
	}
}

func TestViewerForgedActionRefusedAndAudited(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	var ran atomic.Int32
	st.UI.Action("/test/act", "test.act", identity.RoleOperator, func(w http.ResponseWriter, r *http.Request, p identity.Principal) {
		ran.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})

	vera := newBrowser(t, st)
	vera.signIn("vera")
	res := vera.do("POST", "/ui/test/act", url.Values{"x": {"1"}}, sameOrigin)
	if res.status != http.StatusForbidden || !strings.Contains(res.body, "may look but not act") {
		t.Fatalf("viewer POST: %d\n%s", res.status, res.body)
	}
	if ran.Load() != 0 {
		t.Fatal("the action ran for a viewer")
	}
	evs := auditEvents(t, st, audit.Filter{Action: "test.act"})
	if len(evs) != 1 || evs[0].Outcome != audit.Refused || evs[0].Actor != "operator:vera" || !strings.Contains(evs[0].Reason, "viewer") {
		t.Fatalf("viewer's refused action audit: %+v", evs)
	}

	// Without a session: refused, not run.
	anon := newBrowser(t, st)
	if res := anon.do("POST", "/ui/test/act", url.Values{}, sameOrigin); res.status != http.StatusUnauthorized {
		t.Errorf("anonymous POST: %d, want 401", res.status)
	}
	oscar := newBrowser(t, st)
	oscar.signIn("oscar")
	if res := oscar.do("POST", "/ui/test/act", url.Values{}, sameOrigin); res.status != http.StatusNoContent || ran.Load() != 1 {
		t.Errorf("operator POST: %d, ran %d times", res.status, ran.Load())
	}
}

func TestOverviewFilters(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	st.Seed(t)
	b := newBrowser(t, st)
	b.signIn("vera")
	p := b.get("/ui/?owner=payments")
	if p.status != http.StatusOK || !strings.Contains(p.body, `data-service="web"`) || strings.Contains(p.body, `data-service="api"`) {
		t.Errorf("owner=payments: %d, want web and not api", p.status)
	}
	p = b.get("/ui/?state=empty&sort=owner")
	if !strings.Contains(p.body, `data-service="web"`) || !strings.Contains(p.body, "no instances") {
		t.Errorf("state=empty: services without instances missing")
	}
	if p := b.get("/ui/?state=healthy"); strings.Contains(p.body, `data-service=`) {
		t.Errorf("state=healthy lists services that have no instances")
	}
	if p := b.get("/ui/?state=bogus"); p.status != http.StatusBadRequest {
		t.Errorf("state=bogus: %d, want 400", p.status)
	}
	if p := b.get("/ui/?owner=Not%20A%20Team"); p.status != http.StatusBadRequest {
		t.Errorf("bad owner: %d, want 400", p.status)
	}
	if p := b.get("/ui/"); !strings.Contains(p.body, "No open alarms") {
		t.Errorf("no alarm banner state shown")
	}
}

func TestAuditPage(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	st.Seed(t)
	// A refused attempt through the API, to find on the page.
	viewer := st.Token(t, apptest.Viewer)
	if r := st.JSON(t, "PUT", "/v1/services/web", viewer, `{"owner":"payments","capabilities":["probe"]}`); r.Status != http.StatusForbidden {
		t.Fatalf("viewer PUT: %d", r.Status)
	}
	b := newBrowser(t, st)
	b.signIn("vera")
	p := b.get("/ui/audit")
	if p.status != http.StatusOK || !strings.Contains(p.body, "chain verified") || !strings.Contains(p.body, "service.") {
		t.Fatalf("audit page: %d\n%s", p.status, p.body)
	}
	p = b.get("/ui/audit?outcome=refused")
	if !strings.Contains(p.body, "operator:vera") || strings.Contains(p.body, `"state accepted"`) {
		t.Errorf("outcome=refused: the viewer's refused attempt is missing or accepted events shown\n%s", p.body)
	}
	p = b.get("/ui/audit?actor=operator:alice")
	if !strings.Contains(p.body, "operator:alice") || strings.Contains(p.body, "<td>operator:vera</td>") {
		t.Errorf("actor filter does not filter")
	}
	if p := b.get("/ui/audit?outcome=maybe"); p.status != http.StatusBadRequest {
		t.Errorf("outcome=maybe: %d", p.status)
	}
	if p := b.get("/ui/audit?before=x"); p.status != http.StatusBadRequest {
		t.Errorf("before=x: %d", p.status)
	}
}

// TestAuditPageShowsBrokenChain: a row changed behind the log's back shows
// as a broken chain once the cached verification (30 s) is due again.
func TestAuditPageShowsBrokenChain(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	st.Seed(t)
	b := newBrowser(t, st)
	b.signIn("alice")
	if p := b.get("/ui/audit"); !strings.Contains(p.body, "chain verified") {
		t.Fatalf("fresh chain not verified:\n%s", p.body)
	}
	tx, err := st.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	for _, stmt := range []string{
		"ALTER TABLE audit_events DISABLE TRIGGER audit_events_append_only",
		"UPDATE audit_events SET reason = 'nothing happened here' WHERE seq = 1",
		"ALTER TABLE audit_events ENABLE TRIGGER audit_events_append_only",
	} {
		if _, err := tx.Exec(t.Context(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	if p := b.get("/ui/audit"); !strings.Contains(p.body, "chain verified") {
		t.Errorf("the verification was not reused within 30 s")
	}
	st.Clock.Advance(31 * time.Second)
	p := b.get("/ui/audit")
	if !strings.Contains(p.body, "chain broken") || !strings.Contains(p.body, "broken at seq 1") {
		t.Errorf("tampered chain not reported:\n%s", p.body)
	}
}

func TestInsecureCookieOnlyOnLoopback(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	cfg := webui.Config{Pool: st.Pool, Registry: st.Registry, Evaluator: ownerread.Local(st.Evaluator), Publisher: st.Publisher,
		Audit: audit.NewLog(st.Pool), InsecureCookie: true,
		OIDC: webui.OIDCConfig{IssuerURL: "https://id.example", ClientID: "ui", RedirectURL: "https://muster.example/ui/auth/callback"}}
	if _, err := webui.New(cfg); err == nil {
		t.Error("InsecureCookie accepted for an https host")
	}
	cfg.OIDC.RedirectURL = "http://127.0.0.1:8080/ui/auth/callback"
	ui, err := webui.New(cfg)
	if err != nil {
		t.Fatalf("InsecureCookie on loopback: %v", err)
	}
	ui.Close()
}
