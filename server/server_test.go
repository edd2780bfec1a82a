package server_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/server"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type stack = apptest.Stack

func newStack(t *testing.T) *stack { return apptest.New(t, apptest.Options{}) }

func newStackOn(t *testing.T, pool *pgxpool.Pool) *stack {
	return apptest.New(t, apptest.Options{Pool: pool, NoStart: true})
}

var (
	adminReq = apptest.Admin
	oscarReq = apptest.Operator
	veraReq  = apptest.Viewer
	webReq   = apptest.Web
	apiReq   = apptest.API
)

func TestAuthenticationIsRequired(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	other, err := devissuer.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := other.SetURL(s.Issuer.URL()); err != nil {
		t.Fatal(err)
	}
	forged, err := other.Mint(adminReq, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	expired, err := s.Issuer.Mint(adminReq, time.Now().Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, token string }{
		{"no token", ""},
		{"garbage", "not-a-jwt"},
		{"signed by another key", forged},
		{"expired", expired},
	} {
		for _, route := range []struct{ method, path string }{
			{"GET", "/v1/services"}, {"PUT", "/v1/services/web"}, {"POST", "/v1/services/web/instances"},
			{"PUT", "/v1/instances/01a2283a-b7ac-755e-9d2d-ba88e0e589c9/lease"}, {"GET", "/v1/audit"},
		} {
			r := s.JSON(t, route.method, route.path, tc.token, `{}`)
			if r.Status != http.StatusUnauthorized {
				t.Errorf("%s %s with %s: status %d, want 401", route.method, route.path, tc.name, r.Status)
				continue
			}
			p := r.Problem(t)
			if p.Type != server.ProblemBase+"unauthenticated" || r.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s: problem %+v", tc.name, p)
			}
			if tc.token != "" && strings.Contains(string(r.Body), tc.token) {
				t.Errorf("%s: the response echoes the token", tc.name)
			}
		}
	}
	if r := s.Do(t, "GET", "/v1/services", s.Token(t, veraReq), "", ""); r.Status != http.StatusOK {
		t.Fatalf("a valid viewer token: %d %s", r.Status, r.Body)
	}
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{MaxBodyBytes: 4096})
	s.Seed(t)
	web := s.Token(t, webReq)
	oscar := s.Token(t, oscarReq)
	for _, tc := range []struct {
		name, method, path, token, ctype, body string
		status                                 int
		slug                                   string
	}{
		{"malformed", "POST", "/v1/services/web/instances", web, "application/json", `{"address":"127.0.0.1",`, 400, "malformed-json"},
		{"not json", "POST", "/v1/services/web/instances", web, "application/json", `address=127.0.0.1`, 400, "malformed-json"},
		{"empty", "POST", "/v1/services/web/instances", web, "application/json", ``, 400, "malformed-json"},
		{"unknown field", "POST", "/v1/services/web/instances", web, "application/json", `{"address":"127.0.0.1","port":9000,"zone":"az1","colour":"red"}`, 400, "unknown-field"},
		{"wrong type", "POST", "/v1/services/web/instances", web, "application/json", `{"address":"127.0.0.1","port":"9000","zone":"az1"}`, 400, "malformed-json"},
		{"trailing data", "POST", "/v1/services/web/instances", web, "application/json", `{"address":"127.0.0.1","port":9000,"zone":"az1"} {}`, 400, "malformed-json"},
		{"array", "PUT", "/v1/services/web/contract", oscar, "application/json", `[1,2]`, 400, "malformed-json"},
		{"wrong content type", "POST", "/v1/services/web/instances", web, "text/plain", `{"address":"127.0.0.1","port":9000,"zone":"az1"}`, 415, "unsupported-media-type"},
		{"no content type", "PUT", "/v1/services/web/contract", oscar, "", `{}`, 415, "unsupported-media-type"},
		{"too large", "PUT", "/v1/services/web/contract", oscar, "application/json", `{"dependencies":[` + strings.Repeat(`{"name":"db","authority":"weight"},`, 200) + `]}`, 413, "body-too-large"},
		{"bad limit", "GET", "/v1/services?limit=0", oscar, "", "", 400, "bad-parameter"},
		{"bad cursor", "GET", "/v1/services?cursor=!!!", oscar, "", "", 400, "bad-parameter"},
		{"bad If-Match", "PUT", "/v1/services/web/contract", oscar, "application/json", `{}`, 0, ""},
		{"bad instance id", "PUT", "/v1/instances/not-a-uuid/lease", web, "", "", 404, "not-found"},
		{"unknown route", "GET", "/v1/nothing", web, "", "", 404, "not-found"},
		{"wrong method", "PATCH", "/v1/services/web", oscar, "application/json", `{}`, 405, "method-not-allowed"},
	} {
		if tc.status == 0 {
			continue
		}
		r := s.Do(t, tc.method, tc.path, tc.token, tc.ctype, tc.body)
		if r.Status != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.name, r.Status, tc.status, r.Body)
			continue
		}
		if p := r.Problem(t); p.Type != server.ProblemBase+tc.slug || p.Detail == "" {
			t.Errorf("%s: problem %+v, want type %s", tc.name, p, tc.slug)
		}
	}
	// Nothing was registered or changed by any of it.
	admin := s.Token(t, adminReq)
	insts := apptest.Decode[struct{ Items []registry.Instance }](t, s.Do(t, "GET", "/v1/services/web/instances?state=all", admin, "", ""))
	if len(insts.Items) != 0 {
		t.Fatalf("bad input registered %d instances", len(insts.Items))
	}
	c := apptest.Decode[registry.StoredContract](t, s.Do(t, "GET", "/v1/services/web/contract", admin, "", ""))
	if c.Version != 0 {
		t.Fatalf("bad input changed the contract to version %d", c.Version)
	}
}

func TestContractOverREST(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	oscar := s.Token(t, oscarReq)

	r := s.JSON(t, "PUT", "/v1/services/web/contract", oscar, `{"dependencies":[{"name":"db","shared":true,"authority":"unready"}]}`)
	if r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("shared+unready: %d %s", r.Status, r.Body)
	}
	p := r.Problem(t)
	if p.Type != server.ProblemBase+"validation" || len(p.Errors) != 1 || p.Errors[0].Field != "dependencies[0].authority" {
		t.Fatalf("problem %+v", p)
	}

	r = s.JSON(t, "PUT", "/v1/services/api/contract", oscar, `{}`)
	if r.Status != http.StatusForbidden || r.Problem(t).Type != server.ProblemBase+"forbidden" {
		t.Fatalf("other team's contract: %d %s", r.Status, r.Body)
	}
	r = s.JSON(t, "PUT", "/v1/services/api/contract", s.Token(t, adminReq), `{"weights":{"probe":1}}`)
	if r.Status != http.StatusUnprocessableEntity || r.Problem(t).Errors[0].Field != "weights.probe" {
		t.Fatalf("probe weight on a passive-only service: %d %s", r.Status, r.Body)
	}

	r = s.JSON(t, "PUT", "/v1/services/web/contract", oscar, `{"min_healthy_fraction":0.6,"dependencies":[{"name":"db","shared":true}]}`)
	if r.Status != http.StatusOK || r.Header.Get("ETag") != `"1"` {
		t.Fatalf("good contract: %d %s %v", r.Status, r.Body, r.Header)
	}
	got := apptest.Decode[registry.StoredContract](t, r)
	if got.Contract.MinHealthyFraction != 0.6 || got.Contract.IntervalSeconds != registry.DefaultIntervalSeconds || got.Contract.Dependencies[0].Authority != "weight" {
		t.Fatalf("stored %+v", got)
	}

	req, _ := http.NewRequest("PUT", s.URL+"/v1/services/web/contract", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+oscar)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("If-Match", `"0"`)
	res, err := s.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusPreconditionFailed {
		t.Fatalf("stale If-Match: %d, want 412", res.StatusCode)
	}
}

func TestRegisterRenewExpire(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	web, api := s.Token(t, webReq), s.Token(t, apiReq)
	body := `{"address":"127.0.0.1","port":9000,"zone":"az1"}`

	r := s.JSON(t, "POST", "/v1/services/web/instances", api, body)
	if r.Status != http.StatusForbidden || !strings.Contains(r.Problem(t).Detail, "may not register instances of web") {
		t.Fatalf("api registering into web: %d %s", r.Status, r.Body)
	}
	// The request comes from 127.0.0.1; 10.9.9.9 is not proved.
	r = s.JSON(t, "POST", "/v1/services/web/instances", web, `{"address":"10.9.9.9","port":9000,"zone":"az1"}`)
	if r.Status != http.StatusForbidden || !strings.Contains(r.Problem(t).Detail, "not proved") {
		t.Fatalf("unproved address: %d %s", r.Status, r.Body)
	}
	// Unless the token vouches for it.
	vouched := webReq
	vouched.Addresses = []string{"10.9.9.9"}
	vouchedTok := s.Token(t, vouched)
	r = s.JSON(t, "POST", "/v1/services/web/instances", vouchedTok, `{"address":"10.9.9.9","port":9000,"zone":"az1"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("vouched address: %d %s", r.Status, r.Body)
	}
	// The instance itself deregisters with the same proof of address and
	// its credential.
	vid := apptest.Decode[registry.Instance](t, r).ID.String()
	if r := s.DoWith(t, "DELETE", "/v1/instances/"+vid, vouchedTok, "", "", s.AsInstance(vid)); r.Status != http.StatusNoContent {
		t.Fatalf("deregister: %d %s", r.Status, r.Body)
	}

	r = s.JSON(t, "POST", "/v1/services/web/instances", web, body)
	if r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	inst := apptest.Decode[registry.Instance](t, r)
	if r.Header.Get("Location") != "/v1/instances/"+inst.ID.String() || inst.LeaseExpiresAt == nil {
		t.Fatalf("register response %v %+v", r.Header, inst)
	}
	lease := "/v1/instances/" + inst.ID.String() + "/lease"

	s.Clock.Advance(25 * time.Second)
	if r := s.Do(t, "PUT", lease, api, "", ""); r.Status != http.StatusNotFound {
		t.Fatalf("renewal by another service: %d, want 404 (it may not learn the instance exists)", r.Status)
	}
	r = s.Do(t, "PUT", lease, web, "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("renew: %d %s", r.Status, r.Body)
	}
	renewedAt := s.Clock.Now()
	if got := apptest.Decode[registry.Instance](t, r); !got.LeaseExpiresAt.Equal(renewedAt.Add(30 * time.Second).Truncate(time.Microsecond)) {
		t.Fatalf("renewed lease %s, want %s", got.LeaseExpiresAt, renewedAt.Add(30*time.Second))
	}

	ctx := context.Background()
	reaper, err := registry.NewReaper(registry.ReaperConfig{Registry: s.Registry})
	if err != nil {
		t.Fatal(err)
	}
	s.Clock.Advance(29 * time.Second)
	if n, err := reaper.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("29 s after renewal: expired %d, %v", n, err)
	}
	// Lapsed at 30 s, ended once the expiry delay (TTL/3) has passed.
	s.Clock.Advance(11 * time.Second)
	if n, err := reaper.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("30 s + delay after renewal: expired %d, %v", n, err)
	}
	got := apptest.Decode[registry.Instance](t, s.Do(t, "GET", "/v1/instances/"+inst.ID.String(), web, "", ""))
	if got.State != registry.StateExpired {
		t.Fatalf("state %s", got.State)
	}
	r = s.Do(t, "PUT", lease, web, "", "")
	if r.Status != http.StatusGone || r.Problem(t).Type != server.ProblemBase+"gone" {
		t.Fatalf("renewing an expired lease: %d %s", r.Status, r.Body)
	}

	// Re-registration is a new id; deregistration is 204 and idempotent.
	again := apptest.Decode[registry.Instance](t, s.JSON(t, "POST", "/v1/services/web/instances", web, body))
	if again.ID == inst.ID {
		t.Fatal("id reused")
	}
	for range 2 {
		if r := s.DoWith(t, "DELETE", "/v1/instances/"+again.ID.String(), web, "", "", s.AsInstance(again.ID.String())); r.Status != http.StatusNoContent {
			t.Fatalf("deregister: %d %s", r.Status, r.Body)
		}
	}

	// The audit log shows the refusals and the changes, with reasons.
	admin := s.Token(t, adminReq)
	refused := apptest.Decode[struct{ Items []audit.Event }](t, s.Do(t, "GET", "/v1/audit?outcome=refused&action=instance.register", admin, "", ""))
	if len(refused.Items) != 2 || refused.Items[1].Actor != "workload:api/api" || !strings.Contains(refused.Items[0].Reason, "not proved") {
		t.Fatalf("refused registrations: %+v", refused.Items)
	}
	expiredEv := apptest.Decode[struct{ Items []audit.Event }](t, s.Do(t, "GET", "/v1/audit?action=lease.expire&target="+inst.ID.String(), admin, "", ""))
	if len(expiredEv.Items) != 1 || expiredEv.Items[0].Actor != "system:lease-reaper" {
		t.Fatalf("lease expiry audit: %+v", expiredEv.Items)
	}
	// The service filter: web's own events and its instances', no other's.
	ofWeb := apptest.Decode[struct{ Items []audit.Event }](t, s.Do(t, "GET", "/v1/audit?service=web&limit=100", admin, "", ""))
	seen := map[string]bool{}
	for _, e := range ofWeb.Items {
		seen[e.Action+" "+e.Target] = true
		switch e.TargetKind {
		case "service":
			if e.Target != "web" {
				t.Errorf("service=web lists %s on service %s", e.Action, e.Target)
			}
		case "instance":
			if in := apptest.Decode[registry.Instance](t, s.Do(t, "GET", "/v1/instances/"+e.Target, admin, "", "")); in.Service != "web" {
				t.Errorf("service=web lists %s on an instance of %q", e.Action, in.Service)
			}
		default:
			t.Errorf("service=web lists %s on %s %s", e.Action, e.TargetKind, e.Target)
		}
	}
	if !seen["lease.expire "+inst.ID.String()] || !seen["instance.deregister "+again.ID.String()] || !seen["instance.register web"] {
		t.Errorf("service=web misses web's events: %v", seen)
	}
	if r := s.Do(t, "GET", "/v1/audit", s.Token(t, webReq), "", ""); r.Status != http.StatusForbidden {
		t.Fatalf("a workload reading the audit log: %d", r.Status)
	}
}

func TestPagination(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	admin := s.Token(t, adminReq)
	for _, n := range []string{"s1", "s2", "s3", "s4", "s5"} {
		if r := s.JSON(t, "PUT", "/v1/services/"+n, admin, `{"owner":"core","capabilities":[]}`); r.Status != http.StatusCreated {
			t.Fatalf("%d %s", r.Status, r.Body)
		}
	}
	var names []string
	path := "/v1/services?limit=2"
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
		page := apptest.Decode[struct {
			Items      []registry.Service
			NextCursor string `json:"next_cursor"`
		}](t, s.Do(t, "GET", path, admin, "", ""))
		for _, it := range page.Items {
			names = append(names, it.Name)
		}
		if page.NextCursor == "" {
			break
		}
		path = "/v1/services?limit=2&cursor=" + page.NextCursor
	}
	if strings.Join(names, ",") != "s1,s2,s3,s4,s5" {
		t.Fatalf("paged: %v", names)
	}
	// The audit log pages newest first with its own cursor.
	var seqs []int64
	path = "/v1/audit?limit=2"
	for path != "" {
		page := apptest.Decode[struct {
			Items      []audit.Event
			NextCursor string `json:"next_cursor"`
		}](t, s.Do(t, "GET", path, admin, "", ""))
		for _, it := range page.Items {
			seqs = append(seqs, it.Seq)
		}
		path = ""
		if page.NextCursor != "" {
			path = "/v1/audit?limit=2&cursor=" + page.NextCursor
		}
	}
	if len(seqs) != 5 || seqs[0] != 5 || seqs[4] != 1 {
		t.Fatalf("audit pages: %v", seqs)
	}
}

func TestOperationalEndpoints(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	// Ready once the evaluator has rebuilt (an empty registry needs no view).
	wait.For(t, 20*time.Second, "/readyz", func() bool { return s.Do(t, "GET", "/readyz", "", "", "").Status == http.StatusOK })
	for _, path := range []string{"/healthz", "/readyz", "/openapi.yaml"} {
		if r := s.Do(t, "GET", path, "", "", ""); r.Status != http.StatusOK {
			t.Errorf("%s: %d", path, r.Status)
		}
	}
	s.Do(t, "GET", "/v1/services", "", "", "")
	m := s.Scrape(t)
	for _, want := range []string{
		`muster_http_requests_total{code="401",method="GET",route="/v1/services"} 1`,
		`muster_auth_failures_total{reason="missing"} 1`,
		`muster_http_unauthenticated_total{response="401"} 1`,
	} {
		if !bytes.Contains(m, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestMetricsArePrivate: /metrics describes the whole estate, so it needs
// an operator or tool token on the API listener (401 without one, 403
// for workloads and probers), and MetricsHandler serves the same without
// one for a listener of its own.
func TestMetricsArePrivate(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	r := s.Do(t, "GET", "/metrics", "", "", "")
	if r.Status != http.StatusUnauthorized || r.Problem(t).Type != server.ProblemBase+"unauthenticated" ||
		bytes.Contains(r.Body, []byte("muster_")) {
		t.Fatalf("/metrics without a token: %d %s, want a 401 problem", r.Status, r.Body)
	}
	for _, req := range []devissuer.TokenRequest{apptest.Web, {Kind: identity.KindProber, Subject: "p1"}} {
		r := s.Do(t, "GET", "/metrics", s.Token(t, req), "", "")
		if r.Status != http.StatusForbidden || r.Problem(t).Type != server.ProblemBase+"forbidden" {
			t.Errorf("/metrics as a %s: %d %s, want a 403 problem", req.Kind, r.Status, r.Body)
		}
	}
	for _, req := range []devissuer.TokenRequest{apptest.Prometheus, apptest.Viewer} {
		r := s.Do(t, "GET", "/metrics", s.Token(t, req), "", "")
		if r.Status != http.StatusOK || !bytes.Contains(r.Body, []byte("muster_http_requests_total")) {
			t.Errorf("/metrics as a %s: %d, want the metrics", req.Kind, r.Status)
		}
	}
	rec := httptest.NewRecorder()
	s.Server.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK || !bytes.Contains(rec.Body.Bytes(), []byte(`muster_http_requests_total{code="401",method="GET",route="/metrics"} 1`)) {
		t.Errorf("MetricsHandler: %d, want the metrics (with the refused scrape counted)", rec.Code)
	}
}

// TestReadyWhenViewsArePublished: /readyz says whether the replica can
// serve views: with services registered it waits for the first
// publication after the rebuild.
func TestReadyWhenViewsArePublished(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	wait.For(t, 20*time.Second, "the evaluator's rebuild", s.Evaluator.Ready)
	if err := s.Evaluator.SyncNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := s.Do(t, "GET", "/readyz", "", "", "")
	if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") != "1" || !strings.Contains(r.Problem(t).Detail, "no view") {
		t.Fatalf("/readyz with services and no view: %d %s", r.Status, r.Body)
	}
	s.Evaluator.EvaluateNow()
	s.Publisher.RunOnce()
	s.Clock.Advance(2 * time.Second)
	s.Publisher.RunOnce()
	if r := s.Do(t, "GET", "/readyz", "", "", ""); r.Status != http.StatusOK {
		t.Fatalf("/readyz once views are published: %d %s", r.Status, r.Body)
	}
}

// TestDatabaseDownAnswers503 points muster at a database that is not there:
// writes and reads answer 503 database-unavailable with Retry-After,
// authentication (which needs no database) still works, and /readyz says
// not ready, since a replica that never reached its database has never
// rebuilt and has no view to serve. (A database that goes away after
// start leaves /readyz at 200: TestStoppedDatabase, TestFrozenDatabase.)
func TestDatabaseDownAnswers503(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres:///muster?host="+t.TempDir()+"&user=postgres&sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStackOn(t, pool)
	admin := s.Token(t, adminReq)
	for _, c := range []struct{ method, path, body string }{
		{"PUT", "/v1/services/web", `{"owner":"payments","capabilities":["probe"]}`},
		{"POST", "/v1/services/web/instances", `{"address":"127.0.0.1","port":9000,"zone":"az1"}`},
		{"GET", "/v1/services", ""},
		{"GET", "/v1/audit", ""},
	} {
		start := time.Now()
		r := s.JSON(t, c.method, c.path, admin, c.body)
		if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
			t.Errorf("%s %s: %d (Retry-After %q) %s", c.method, c.path, r.Status, r.Header.Get("Retry-After"), r.Body)
			continue
		}
		if p := r.Problem(t); p.Type != server.ProblemBase+"database-unavailable" {
			t.Errorf("%s %s: problem %+v", c.method, c.path, p)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s %s: answered after %s", c.method, c.path, took)
		}
	}
	// Watch and resolve have no copy of the grants to authorise from yet.
	if r := s.Do(t, "GET", "/v1/resolve/web", s.Token(t, webReq), "", ""); r.Status != http.StatusServiceUnavailable || r.Problem(t).Type != server.ProblemBase+"not-ready" {
		t.Errorf("resolve before any copy of the grants: %d %s", r.Status, r.Body)
	}
	if r := s.Do(t, "GET", "/readyz", "", "", ""); r.Status != http.StatusServiceUnavailable {
		t.Errorf("/readyz without ever reaching the database: %d", r.Status)
	}
	if r := s.Do(t, "GET", "/v1/services", "", "", ""); r.Status != http.StatusUnauthorized {
		t.Errorf("no token with the database down: %d, want 401", r.Status)
	}
}

func TestGrantsOverHTTP(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	oscar := s.Token(t, oscarReq)
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", s.Token(t, apiReq), `{"callers":["api"]}`); r.Status != http.StatusForbidden {
		t.Fatalf("a workload granting itself: %d %s", r.Status, r.Body)
	}
	r := s.JSON(t, "PUT", "/v1/services/web/grants", oscar, `{"callers":["api","nope"]}`)
	if r.Status != http.StatusUnprocessableEntity || r.Problem(t).Errors[0].Field != "callers[1]" {
		t.Fatalf("unknown caller: %d %s", r.Status, r.Body)
	}
	r = s.JSON(t, "PUT", "/v1/services/web/grants", oscar, `{"callers":["api"]}`)
	if r.Status != http.StatusOK {
		t.Fatalf("grant: %d %s", r.Status, r.Body)
	}
	g := apptest.Decode[registry.Grants](t, s.Do(t, "GET", "/v1/services/web/grants", s.Token(t, veraReq), "", ""))
	if len(g.Callers) != 1 || g.Callers[0] != "api" {
		t.Fatalf("grants %+v", g)
	}
}

func TestMethodNotAllowedSaysWhatIs(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	r := s.JSON(t, "PATCH", "/v1/services/web", s.Token(t, adminReq), `{}`)
	if r.Status != http.StatusMethodNotAllowed || r.Header.Get("Allow") != "GET, PUT" {
		t.Fatalf("PATCH a service: %d, Allow %q", r.Status, r.Header.Get("Allow"))
	}
}
