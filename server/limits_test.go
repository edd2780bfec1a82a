package server_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/server"
)

// registerWeb registers an instance of web from loopback and returns its id.
func registerWeb(t *testing.T, s *stack, port int) string {
	t.Helper()
	r := s.JSON(t, "POST", "/v1/services/web/instances", s.Token(t, webReq), fmt.Sprintf(`{"address":"127.0.0.1","port":%d,"zone":"az1"}`, port))
	if r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	return apptest.Decode[registry.Instance](t, r).ID.String()
}

func reportBody(instance, class string, n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = `{"instance_id":"` + instance + `","class":"` + class + `","outcome":"success"}`
	}
	return `{"reports":[` + strings.Join(items, ",") + `]}`
}

// wantRateLimited checks a 429 as every limiter answers it: a
// rate-limited problem with Retry-After and the RateLimit-* headers of
// lim.
func wantRateLimited(t *testing.T, r apptest.Response, lim policy.Limit) {
	t.Helper()
	if r.Status != http.StatusTooManyRequests || r.Problem(t).Type != server.ProblemBase+"rate-limited" {
		t.Fatalf("status %d %s, want a 429 rate-limited problem", r.Status, r.Body)
	}
	h := r.Header
	if h.Get("Retry-After") == "" || h.Get("Retry-After") == "0" || h.Get("RateLimit-Reset") == "" ||
		h.Get("RateLimit-Remaining") != "0" || h.Get("RateLimit-Limit") != fmt.Sprint(lim.Max) || h.Get("RateLimit-Policy") != lim.Policy() {
		t.Errorf("429 headers %v, want Retry-After and RateLimit-* of %s", h, lim.Policy())
	}
}

// TestReportFloodIsLimitedPerIdentity: one identity flooding POST
// /v1/reports is answered 429 once its items are spent, while another
// identity's batches, sent at the same time, are all accepted.
func TestReportFloodIsLimitedPerIdentity(t *testing.T) {
	t.Parallel()
	items := policy.Limit{Max: 50, Window: 10 * time.Second}
	s := apptest.New(t, apptest.Options{Limits: server.Limits{ReportItems: items}})
	s.Seed(t)
	admin := s.Token(t, apptest.Admin)
	if r := s.JSON(t, "PUT", "/v1/probers/p1/assignments", admin, `{"services":["web"]}`); r.Status != http.StatusOK {
		t.Fatalf("assign p1: %d %s", r.Status, r.Body)
	}
	id := registerWeb(t, s, 9000)
	if err := s.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	web, prober := s.Token(t, webReq), s.Token(t, devissuer.TokenRequest{Kind: identity.KindProber, Subject: "p1"})

	var (
		wg              sync.WaitGroup
		mu              sync.Mutex
		limited, passed int
		first429        *apptest.Response
	)
	for range 4 {
		wg.Go(func() {
			for range 25 {
				r := s.JSON(t, "POST", "/v1/reports", web, reportBody(id, "self", 10))
				mu.Lock()
				switch r.Status {
				case http.StatusTooManyRequests:
					limited++
					if first429 == nil {
						first429 = &r
					}
				case http.StatusOK:
					passed++
				default:
					t.Errorf("flood: %d %s", r.Status, r.Body)
				}
				mu.Unlock()
			}
		})
	}
	// The prober reports alongside, 4 items a batch, 40 in all: under its
	// own 50, whatever the flood does.
	for i := range 10 {
		r := s.JSON(t, "POST", "/v1/reports", prober, reportBody(id, "probe", 4))
		if r.Status != http.StatusOK {
			t.Fatalf("the prober's batch %d during the flood: %d %s", i, r.Status, r.Body)
		}
		if res := apptest.Decode[evaluator.Result](t, r); res.Accepted != 4 {
			t.Fatalf("the prober's batch %d during the flood: %+v, want 4 accepted", i, res)
		}
	}
	wg.Wait()
	if limited == 0 || first429 == nil {
		t.Fatalf("100 batches of 10 items from one identity, %d accepted and none refused; want 429s past 50 items", passed)
	}
	wantRateLimited(t, *first429, items)
	// 50 at once, 5 a second after that, and one batch of debt at most.
	if secs := 10; passed > (50+5*secs)/10+1 {
		t.Errorf("%d batches of 10 let through, want about 5 plus the refill", passed)
	}
	if m := s.Scrape(t); !strings.Contains(string(m), fmt.Sprintf(`muster_http_rate_limited_total{limit="report_items"} %d`, limited)) {
		t.Errorf("metrics do not count %d report refusals:\n%s", limited, grepMetric(m, "muster_http_rate_limited_total"))
	}
}

// TestRegistrationsAreLimitedPerIdentity: registrations, like the other
// per-identity buckets, answer 429 past the limit and carry the
// RateLimit-* headers when accepted.
func TestRegistrationsAreLimitedPerIdentity(t *testing.T) {
	t.Parallel()
	lim := policy.Limit{Max: 2, Window: time.Minute}
	s := apptest.New(t, apptest.Options{Limits: server.Limits{Registrations: lim}})
	s.Seed(t)
	web := s.Token(t, webReq)
	for i := range 2 {
		r := s.JSON(t, "POST", "/v1/services/web/instances", web, fmt.Sprintf(`{"address":"127.0.0.1","port":%d,"zone":"az1"}`, 9000+i))
		if r.Status != http.StatusCreated || r.Header.Get("RateLimit-Remaining") != fmt.Sprint(1-i) {
			t.Fatalf("registration %d: %d %v %s", i, r.Status, r.Header, r.Body)
		}
	}
	wantRateLimited(t, s.JSON(t, "POST", "/v1/services/web/instances", web, `{"address":"127.0.0.1","port":9010,"zone":"az1"}`), lim)
	// Another identity has its own bucket.
	api := s.Token(t, apiReq)
	if r := s.JSON(t, "POST", "/v1/services/api/instances", api, `{"address":"127.0.0.1","port":9011,"zone":"az1"}`); r.Status != http.StatusCreated {
		t.Fatalf("another identity's registration: %d %s", r.Status, r.Body)
	}
}

// TestRenewalsAndDeregistrationsAreLimitedPerIdentity: lease renewals and
// the instance's own deregistrations each have a bucket per identity,
// answering 429 past it, and another identity is unaffected. The renewal
// bucket grows with the live leases the identity registered (one more at
// once for each), and a renewal it refuses is kept to be applied later.
func TestRenewalsAndDeregistrationsAreLimitedPerIdentity(t *testing.T) {
	t.Parallel()
	lim := policy.Limit{Max: 2, Window: time.Minute}
	s := apptest.New(t, apptest.Options{Limits: server.Limits{LeaseRenewals: lim, Deregistrations: lim}})
	s.Seed(t)
	web, api := s.Token(t, webReq), s.Token(t, apiReq)
	register := func(tok, service string, port int) string {
		t.Helper()
		r := s.JSON(t, "POST", "/v1/services/"+service+"/instances", tok, fmt.Sprintf(`{"address":"127.0.0.1","port":%d,"zone":"az1"}`, port))
		if r.Status != http.StatusCreated {
			t.Fatalf("register %s: %d %s", service, r.Status, r.Body)
		}
		return apptest.Decode[registry.Instance](t, r).ID.String()
	}
	var ids []string
	for i := range 3 {
		ids = append(ids, register(web, "web", 9000+i))
	}
	other := register(api, "api", 9100)
	// 2 of the limit and 3 for web's three leases; the bucket then
	// refills at 2 a minute and 4 a lease TTL (30 s) per lease: 5 in
	// 11.5 s.
	for i := range 5 {
		if r := s.Do(t, "PUT", "/v1/instances/"+ids[0]+"/lease", web, "", ""); r.Status != http.StatusOK {
			t.Fatalf("renewal %d: %d %s", i, r.Status, r.Body)
		}
	}
	wantRateLimited(t, s.Do(t, "PUT", "/v1/instances/"+ids[0]+"/lease", web, "", ""), policy.Limit{Max: 5, Window: 12 * time.Second})
	if n := s.Registry.RefusedRenewalsPending(); n != 1 {
		t.Fatalf("%d refused renewals kept, want the one refused", n)
	}
	if r := s.Do(t, "PUT", "/v1/instances/"+other+"/lease", api, "", ""); r.Status != http.StatusOK {
		t.Fatalf("another identity's renewal: %d %s", r.Status, r.Body)
	}
	// The instance deregistering itself (its address is the request's
	// source): immediate, but bounded per identity too.
	for i := range 2 {
		if r := s.DoWith(t, "DELETE", "/v1/instances/"+ids[i], web, "", "", s.AsInstance(ids[i])); r.Status != http.StatusNoContent {
			t.Fatalf("deregistration %d: %d %s", i, r.Status, r.Body)
		}
	}
	wantRateLimited(t, s.DoWith(t, "DELETE", "/v1/instances/"+ids[2], web, "", "", s.AsInstance(ids[2])), lim)
	if r := s.Do(t, "GET", "/v1/instances/"+ids[2], s.Token(t, adminReq), "", ""); r.Status != http.StatusOK ||
		apptest.Decode[registry.Instance](t, r).State != registry.StateActive {
		t.Fatalf("the instance whose deregistration was refused 429: %d %s, want it still active", r.Status, r.Body)
	}
	if r := s.DoWith(t, "DELETE", "/v1/instances/"+other, api, "", "", s.AsInstance(other)); r.Status != http.StatusNoContent {
		t.Fatalf("another identity's deregistration: %d %s", r.Status, r.Body)
	}
}

// fromAddr returns a client whose connections come from the loopback
// address local, so a test can be two source addresses.
func fromAddr(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

func get(t *testing.T, c *http.Client, url, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res
}

// TestUnauthenticatedFloodPerAddress: once an address has had its share
// of 401s, it is answered 429 without its token being verified (a valid
// token never seen before too), while another address is served as
// usual, and so is a token the address presented successfully before the
// flood: a flood from an address real clients share does not lock them
// out.
func TestUnauthenticatedFloodPerAddress(t *testing.T) {
	t.Parallel()
	lim := policy.Limit{Max: 5, Window: time.Minute}
	s := apptest.New(t, apptest.Options{Limits: server.Limits{Unauthenticated: lim}})
	good := s.Token(t, apptest.Viewer)
	known := s.Token(t, apptest.Admin)
	a, b := fromAddr("127.0.0.1"), fromAddr("127.0.0.2")
	if res := get(t, a, s.URL+"/v1/services", known); res.StatusCode != http.StatusOK {
		t.Fatalf("a valid token before the flood: %d, want 200", res.StatusCode)
	}
	for i := range 5 {
		tok := ""
		if i%2 == 1 {
			tok = "not.a.token"
		}
		if res := get(t, a, s.URL+"/v1/services", tok); res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("refusal %d: %d, want 401", i, res.StatusCode)
		}
	}
	for _, tok := range []string{"", good} {
		res := get(t, a, s.URL+"/v1/services", tok)
		if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" ||
			res.Header.Get("RateLimit-Policy") != lim.Policy() {
			t.Fatalf("after 5 refusals from 127.0.0.1 (token %t): %d %v, want 429 with Retry-After", tok != "", res.StatusCode, res.Header)
		}
	}
	if res := get(t, b, s.URL+"/v1/services", good); res.StatusCode != http.StatusOK {
		t.Fatalf("a valid token from 127.0.0.2: %d, want 200", res.StatusCode)
	}
	if res := get(t, a, s.URL+"/v1/services", known); res.StatusCode != http.StatusOK {
		t.Fatalf("from the flooded 127.0.0.1, the token it used before the flood: %d, want 200", res.StatusCode)
	}
	// Scraped without a token: 127.0.0.1 is still refused.
	rec := httptest.NewRecorder()
	s.Server.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	m := rec.Body.String()
	for _, want := range []string{`muster_http_unauthenticated_total{response="401"} 5`, `muster_http_unauthenticated_total{response="429"} 2`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepMetric([]byte(m), "muster_http_unauthenticated_total"))
		}
	}
}

// TestUnknownKeyIDsCostOneKeySetFetch: tokens naming key IDs the issuer
// never published, sent through the API, cause at most one fetch of the
// issuer's key set per 10 s (counted at its JWKS handler).
func TestUnknownKeyIDsCostOneKeySetFetch(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	start := time.Now()
	if r := s.Do(t, "GET", "/v1/services", s.Token(t, apptest.Viewer), "", ""); r.Status != http.StatusOK {
		t.Fatalf("a valid token: %d %s", r.Status, r.Body)
	}
	if n := s.JWKSFetches(); n != 1 {
		t.Fatalf("%d key set fetches for the first token, want 1", n)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	const n = 30
	for i := range n {
		tok := forge(t, key, rand.Text(), s.Issuer.URL())
		if r := s.Do(t, "GET", "/v1/services", tok, "", ""); r.Status != http.StatusUnauthorized {
			t.Fatalf("forged token %d: %d %s, want 401", i, r.Status, r.Body)
		}
	}
	fetches := s.JWKSFetches() - 1
	if allowed := int64(time.Since(start) / (10 * time.Second)); fetches > allowed {
		t.Fatalf("%d tokens with unknown key IDs caused %d key set fetches within %s, want at most %d",
			n, fetches, time.Since(start).Round(time.Millisecond), allowed)
	}
}

// forge signs a viewer's claims for iss with key under key ID kid.
func forge(t *testing.T, key *rsa.PrivateKey, kid, iss string) string {
	t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tok, err := jwt.Signed(signer).Claims(jwt.Claims{
		Issuer: iss, Subject: "mallory", Audience: jwt.Audience{"muster"},
		IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Hour)),
	}).Claims(map[string]any{"muster_kind": "operator", "muster_role": "admin"}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestWatchStreamsPerIdentity: an identity holds at most Limits.WatchStreams
// streams; a closed one frees its place.
func TestWatchStreamsPerIdentity(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{Limits: server.Limits{WatchStreams: 2}, WatchHeartbeat: 50 * time.Millisecond})
	s.Seed(t)
	s.Hub.Publish(nil)
	web := s.Token(t, webReq)
	open := func(tok string) *http.Response {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/v1/watch?service=web", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := s.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { res.Body.Close() })
		return res
	}
	first, second := open(web), open(web)
	if first.StatusCode != http.StatusOK || second.StatusCode != http.StatusOK {
		t.Fatalf("two streams: %d %d", first.StatusCode, second.StatusCode)
	}
	if third := open(web); third.StatusCode != http.StatusTooManyRequests || third.Header.Get("Retry-After") == "" ||
		third.Header.Get("RateLimit-Limit") != "2" {
		t.Fatalf("a third stream: %d %v, want 429 with Retry-After", third.StatusCode, third.Header)
	}
	if other := open(s.Token(t, apptest.Viewer)); other.StatusCode != http.StatusOK {
		t.Fatalf("another identity's stream: %d", other.StatusCode)
	}
	first.Body.Close()
	// The stream ends at its next heartbeat, which finds the client gone.
	wait.For(t, 10*time.Second, "a closed stream frees its place", func() bool {
		res := open(web)
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
}

// TestShiftsAndLiftsCountAsPolicyWrites: shift operations and override
// lifts take from the per-actor policy write limit kept in PostgreSQL,
// each family on its own, refused with 429 and audited.
func TestShiftsAndLiftsCountAsPolicyWrites(t *testing.T) {
	t.Parallel()
	lim := policy.Limit{Max: 1, Window: time.Minute}
	s := apptest.New(t, apptest.Options{Policy: func(c *policy.Config) { c.WriteLimit = lim }})
	s.Seed(t)
	oscar := s.Token(t, apptest.Operator)
	drain := `{"scope":"zone","target":"az9","reason":"drill","manual":true}`
	if r := s.JSON(t, "POST", "/v1/shifts", oscar, drain); r.Status == http.StatusTooManyRequests || r.Header.Get("RateLimit-Remaining") != "0" {
		t.Fatalf("first shift operation: %d %v %s", r.Status, r.Header, r.Body)
	}
	wantRateLimited(t, s.JSON(t, "POST", "/v1/shifts", oscar, drain), lim)
	id := "01a2283a-b7ac-755e-9d2d-ba88e0e589c9"
	if r := s.Do(t, "DELETE", "/v1/overrides/"+id, oscar, "", ""); r.Status != http.StatusNotFound {
		t.Fatalf("first lift (of no override): %d %s, want 404", r.Status, r.Body)
	}
	wantRateLimited(t, s.Do(t, "DELETE", "/v1/overrides/"+id, oscar, "", ""), lim)
	evs := apptest.Decode[struct{ Items []audit.Event }](t, s.Do(t, "GET", "/v1/audit?outcome=refused", s.Token(t, apptest.Admin), "", "")).Items
	seen := map[string]bool{}
	for _, e := range evs {
		if strings.HasPrefix(e.Reason, "rate_limit") {
			seen[e.Action] = true
		}
	}
	if !seen["shift.start"] || !seen["override.lift"] {
		t.Errorf("rate-limit refusals audited for %v, want shift.start and override.lift", seen)
	}
}
