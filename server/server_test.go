package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/audit"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/identity"
	"github.com/musterhq/muster/registry"
	"github.com/musterhq/muster/server"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// stack is muster's HTTP surface on real loopback HTTP, backed by a fresh
// PostgreSQL database and verifying tokens from its own dev issuer through
// the production OIDC path.
type stack struct {
	url    string
	reg    *registry.Registry
	issuer *identity.DevIssuer
	clock  *clock
	client *http.Client
}

func newStack(t *testing.T) *stack {
	t.Helper()
	return newStackOn(t, dbtest.New(t))
}

func newStackOn(t *testing.T, pool *pgxpool.Pool) *stack {
	t.Helper()
	clk := &clock{t: time.Now().UTC()}
	reg, err := registry.New(registry.Config{Pool: pool, Region: "local", Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(nil)
	base := "http://" + hs.Listener.Addr().String()
	iss, err := identity.LoadOrCreateDevIssuer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := iss.SetURL(base + "/dev/issuer"); err != nil {
		t.Fatal(err)
	}
	ver, err := identity.NewVerifier([]identity.IssuerConfig{{URL: iss.URL(), Audience: "muster"}}, &http.Client{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{
		Registry: reg, Audit: audit.NewLog(pool), Authenticator: ver, Metrics: prometheus.NewRegistry(),
		Ready:     func(ctx context.Context) error { return pool.Ping(ctx) },
		DevIssuer: iss.Handler(), DevIssuerPath: "/dev/issuer", MaxBodyBytes: 4096,
	})
	if err != nil {
		t.Fatal(err)
	}
	hs.Config.Handler = srv
	hs.Start()
	t.Cleanup(hs.Close)
	return &stack{url: base, reg: reg, issuer: iss, clock: clk, client: hs.Client()}
}

func (s *stack) token(t *testing.T, req identity.TokenRequest) string {
	t.Helper()
	tok, err := s.issuer.Mint(req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) problem(t *testing.T) server.Problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json; body %s", ct, r.body)
	}
	var p server.Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %s: %v", r.body, err)
	}
	if p.Status != r.status {
		t.Fatalf("problem status %d, response status %d", p.Status, r.status)
	}
	return p
}

func (s *stack) do(t *testing.T, method, path, token, contentType string, body string) resp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

func (s *stack) json(t *testing.T, method, path, token, body string) resp {
	t.Helper()
	return s.do(t, method, path, token, "application/json", body)
}

func decode[T any](t *testing.T, r resp) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
	return v
}

var (
	adminReq = identity.TokenRequest{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
	oscarReq = identity.TokenRequest{Kind: identity.KindOperator, Subject: "oscar", Team: "payments", Role: identity.RoleOperator}
	veraReq  = identity.TokenRequest{Kind: identity.KindOperator, Subject: "vera", Team: "payments", Role: identity.RoleViewer}
	webReq   = identity.TokenRequest{Kind: identity.KindWorkload, Service: "web"}
	apiReq   = identity.TokenRequest{Kind: identity.KindWorkload, Service: "api"}
)

func (s *stack) seed(t *testing.T) {
	t.Helper()
	admin := s.token(t, adminReq)
	for _, b := range []struct{ name, body string }{
		{"web", `{"owner":"payments","capabilities":["probe","self","passive"]}`},
		{"api", `{"owner":"search","capabilities":["passive"]}`},
	} {
		if r := s.json(t, "PUT", "/v1/services/"+b.name, admin, b.body); r.status != http.StatusCreated {
			t.Fatalf("create %s: %d %s", b.name, r.status, r.body)
		}
	}
}

func TestAuthenticationIsRequired(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	other, err := identity.LoadOrCreateDevIssuer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := other.SetURL(s.issuer.URL()); err != nil {
		t.Fatal(err)
	}
	forged, err := other.Mint(adminReq, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	expired, err := s.issuer.Mint(adminReq, time.Now().Add(-2*time.Hour))
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
			r := s.json(t, route.method, route.path, tc.token, `{}`)
			if r.status != http.StatusUnauthorized {
				t.Errorf("%s %s with %s: status %d, want 401", route.method, route.path, tc.name, r.status)
				continue
			}
			p := r.problem(t)
			if p.Type != server.ProblemBase+"unauthenticated" || r.header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s: problem %+v", tc.name, p)
			}
			if tc.token != "" && strings.Contains(string(r.body), tc.token) {
				t.Errorf("%s: the response echoes the token", tc.name)
			}
		}
	}
	if r := s.do(t, "GET", "/v1/services", s.token(t, veraReq), "", ""); r.status != http.StatusOK {
		t.Fatalf("a valid viewer token: %d %s", r.status, r.body)
	}
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.seed(t)
	web := s.token(t, webReq)
	oscar := s.token(t, oscarReq)
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
		r := s.do(t, tc.method, tc.path, tc.token, tc.ctype, tc.body)
		if r.status != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.name, r.status, tc.status, r.body)
			continue
		}
		if p := r.problem(t); p.Type != server.ProblemBase+tc.slug || p.Detail == "" {
			t.Errorf("%s: problem %+v, want type %s", tc.name, p, tc.slug)
		}
	}
	// Nothing was registered or changed by any of it.
	admin := s.token(t, adminReq)
	insts := decode[struct{ Items []registry.Instance }](t, s.do(t, "GET", "/v1/services/web/instances?state=all", admin, "", ""))
	if len(insts.Items) != 0 {
		t.Fatalf("bad input registered %d instances", len(insts.Items))
	}
	c := decode[registry.StoredContract](t, s.do(t, "GET", "/v1/services/web/contract", admin, "", ""))
	if c.Version != 0 {
		t.Fatalf("bad input changed the contract to version %d", c.Version)
	}
}

func TestContractOverREST(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.seed(t)
	oscar := s.token(t, oscarReq)

	r := s.json(t, "PUT", "/v1/services/web/contract", oscar, `{"dependencies":[{"name":"db","shared":true,"authority":"unready"}]}`)
	if r.status != http.StatusUnprocessableEntity {
		t.Fatalf("shared+unready: %d %s", r.status, r.body)
	}
	p := r.problem(t)
	if p.Type != server.ProblemBase+"validation" || len(p.Errors) != 1 || p.Errors[0].Field != "dependencies[0].authority" {
		t.Fatalf("problem %+v", p)
	}

	r = s.json(t, "PUT", "/v1/services/api/contract", oscar, `{}`)
	if r.status != http.StatusForbidden || r.problem(t).Type != server.ProblemBase+"forbidden" {
		t.Fatalf("other team's contract: %d %s", r.status, r.body)
	}
	r = s.json(t, "PUT", "/v1/services/api/contract", s.token(t, adminReq), `{"weights":{"probe":1}}`)
	if r.status != http.StatusUnprocessableEntity || r.problem(t).Errors[0].Field != "weights.probe" {
		t.Fatalf("probe weight on a passive-only service: %d %s", r.status, r.body)
	}

	r = s.json(t, "PUT", "/v1/services/web/contract", oscar, `{"min_healthy_fraction":0.6,"dependencies":[{"name":"db","shared":true}]}`)
	if r.status != http.StatusOK || r.header.Get("ETag") != `"1"` {
		t.Fatalf("good contract: %d %s %v", r.status, r.body, r.header)
	}
	got := decode[registry.StoredContract](t, r)
	if got.Contract.MinHealthyFraction != 0.6 || got.Contract.IntervalSeconds != registry.DefaultIntervalSeconds || got.Contract.Dependencies[0].Authority != "weight" {
		t.Fatalf("stored %+v", got)
	}

	req, _ := http.NewRequest("PUT", s.url+"/v1/services/web/contract", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+oscar)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("If-Match", `"0"`)
	res, err := s.client.Do(req)
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
	s.seed(t)
	web, api := s.token(t, webReq), s.token(t, apiReq)
	body := `{"address":"127.0.0.1","port":9000,"zone":"az1"}`

	r := s.json(t, "POST", "/v1/services/web/instances", api, body)
	if r.status != http.StatusForbidden || !strings.Contains(r.problem(t).Detail, "may not register instances of web") {
		t.Fatalf("api registering into web: %d %s", r.status, r.body)
	}
	// The request comes from 127.0.0.1; 10.9.9.9 is not proved.
	r = s.json(t, "POST", "/v1/services/web/instances", web, `{"address":"10.9.9.9","port":9000,"zone":"az1"}`)
	if r.status != http.StatusForbidden || !strings.Contains(r.problem(t).Detail, "not proved") {
		t.Fatalf("unproved address: %d %s", r.status, r.body)
	}
	// Unless the token vouches for it.
	vouched := webReq
	vouched.Addresses = []string{"10.9.9.9"}
	r = s.json(t, "POST", "/v1/services/web/instances", s.token(t, vouched), `{"address":"10.9.9.9","port":9000,"zone":"az1"}`)
	if r.status != http.StatusCreated {
		t.Fatalf("vouched address: %d %s", r.status, r.body)
	}
	if r := s.do(t, "DELETE", "/v1/instances/"+decode[registry.Instance](t, r).ID.String(), web, "", ""); r.status != http.StatusNoContent {
		t.Fatalf("deregister: %d %s", r.status, r.body)
	}

	r = s.json(t, "POST", "/v1/services/web/instances", web, body)
	if r.status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.status, r.body)
	}
	inst := decode[registry.Instance](t, r)
	if r.header.Get("Location") != "/v1/instances/"+inst.ID.String() || inst.LeaseExpiresAt == nil {
		t.Fatalf("register response %v %+v", r.header, inst)
	}
	lease := "/v1/instances/" + inst.ID.String() + "/lease"

	s.clock.Advance(25 * time.Second)
	if r := s.do(t, "PUT", lease, api, "", ""); r.status != http.StatusNotFound {
		t.Fatalf("renewal by another service: %d, want 404 (it may not learn the instance exists)", r.status)
	}
	r = s.do(t, "PUT", lease, web, "", "")
	if r.status != http.StatusOK {
		t.Fatalf("renew: %d %s", r.status, r.body)
	}
	renewedAt := s.clock.Now()
	if got := decode[registry.Instance](t, r); !got.LeaseExpiresAt.Equal(renewedAt.Add(30 * time.Second).Truncate(time.Microsecond)) {
		t.Fatalf("renewed lease %s, want %s", got.LeaseExpiresAt, renewedAt.Add(30*time.Second))
	}

	ctx := context.Background()
	s.clock.Advance(29 * time.Second)
	if n, err := s.reg.ExpireLeases(ctx, 100); err != nil || n != 0 {
		t.Fatalf("29 s after renewal: expired %d, %v", n, err)
	}
	s.clock.Advance(time.Second)
	if n, err := s.reg.ExpireLeases(ctx, 100); err != nil || n != 1 {
		t.Fatalf("30 s after renewal: expired %d, %v", n, err)
	}
	got := decode[registry.Instance](t, s.do(t, "GET", "/v1/instances/"+inst.ID.String(), web, "", ""))
	if got.State != registry.StateExpired {
		t.Fatalf("state %s", got.State)
	}
	r = s.do(t, "PUT", lease, web, "", "")
	if r.status != http.StatusGone || r.problem(t).Type != server.ProblemBase+"gone" {
		t.Fatalf("renewing an expired lease: %d %s", r.status, r.body)
	}

	// Re-registration is a new id; deregistration is 204 and idempotent.
	again := decode[registry.Instance](t, s.json(t, "POST", "/v1/services/web/instances", web, body))
	if again.ID == inst.ID {
		t.Fatal("id reused")
	}
	for range 2 {
		if r := s.do(t, "DELETE", "/v1/instances/"+again.ID.String(), web, "", ""); r.status != http.StatusNoContent {
			t.Fatalf("deregister: %d %s", r.status, r.body)
		}
	}

	// The audit log shows the refusals and the changes, with reasons.
	admin := s.token(t, adminReq)
	refused := decode[struct{ Items []audit.Event }](t, s.do(t, "GET", "/v1/audit?outcome=refused&action=instance.register", admin, "", ""))
	if len(refused.Items) != 2 || refused.Items[1].Actor != "workload:api/api" || !strings.Contains(refused.Items[0].Reason, "not proved") {
		t.Fatalf("refused registrations: %+v", refused.Items)
	}
	expiredEv := decode[struct{ Items []audit.Event }](t, s.do(t, "GET", "/v1/audit?action=lease.expire&target="+inst.ID.String(), admin, "", ""))
	if len(expiredEv.Items) != 1 || expiredEv.Items[0].Actor != "system:lease-reaper" {
		t.Fatalf("lease expiry audit: %+v", expiredEv.Items)
	}
	if r := s.do(t, "GET", "/v1/audit", s.token(t, webReq), "", ""); r.status != http.StatusForbidden {
		t.Fatalf("a workload reading the audit log: %d", r.status)
	}
}

func TestPagination(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	admin := s.token(t, adminReq)
	for _, n := range []string{"s1", "s2", "s3", "s4", "s5"} {
		if r := s.json(t, "PUT", "/v1/services/"+n, admin, `{"owner":"core","capabilities":[]}`); r.status != http.StatusCreated {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	var names []string
	path := "/v1/services?limit=2"
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
		page := decode[struct {
			Items      []registry.Service
			NextCursor string `json:"next_cursor"`
		}](t, s.do(t, "GET", path, admin, "", ""))
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
		page := decode[struct {
			Items      []audit.Event
			NextCursor string `json:"next_cursor"`
		}](t, s.do(t, "GET", path, admin, "", ""))
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
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/openapi.yaml"} {
		if r := s.do(t, "GET", path, "", "", ""); r.status != http.StatusOK {
			t.Errorf("%s: %d", path, r.status)
		}
	}
	s.do(t, "GET", "/v1/services", "", "", "")
	m := s.do(t, "GET", "/metrics", "", "", "")
	for _, want := range []string{
		`muster_http_requests_total{code="401",method="GET",route="/v1/services"} 1`,
		`muster_auth_failures_total{reason="missing"} 1`,
	} {
		if !bytes.Contains(m.body, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestDatabaseDownAnswers503 points muster at a database that is not there:
// writes and reads answer 503 with Retry-After, and /readyz says not ready,
// while authentication (which needs no database) still works.
func TestDatabaseDownAnswers503(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres:///muster?host="+t.TempDir()+"&user=postgres&sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStackOn(t, pool)
	admin := s.token(t, adminReq)
	for _, c := range []struct{ method, path, body string }{
		{"PUT", "/v1/services/web", `{"owner":"payments","capabilities":["probe"]}`},
		{"POST", "/v1/services/web/instances", `{"address":"127.0.0.1","port":9000,"zone":"az1"}`},
		{"GET", "/v1/services", ""},
		{"GET", "/v1/audit", ""},
	} {
		r := s.json(t, c.method, c.path, admin, c.body)
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
			t.Errorf("%s %s: %d (Retry-After %q) %s", c.method, c.path, r.status, r.header.Get("Retry-After"), r.body)
			continue
		}
		if p := r.problem(t); p.Type != server.ProblemBase+"unavailable" {
			t.Errorf("%s %s: problem %+v", c.method, c.path, p)
		}
	}
	if r := s.do(t, "GET", "/readyz", "", "", ""); r.status != http.StatusServiceUnavailable {
		t.Errorf("/readyz with the database down: %d", r.status)
	}
	if r := s.do(t, "GET", "/v1/services", "", "", ""); r.status != http.StatusUnauthorized {
		t.Errorf("no token with the database down: %d, want 401", r.status)
	}
}
