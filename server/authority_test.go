package server_test

import (
	"bufio"
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// nextDrain reads events until a drain, failing t if the stream ends
// first or none comes within 15 s.
func nextDrain(t *testing.T, sc *bufio.Scanner) event {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		ev := readEvents(t, sc, 1)[0]
		if ev.kind == "drain" {
			return ev
		}
	}
	t.Fatal("no drain event within 15 s")
	return event{}
}

// TestWatchEndsWhenTheTokenExpires: a stream opened with a token that
// expires ends with a drain event (reason token_expired) when it does.
func TestWatchEndsWhenTheTokenExpires(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 10)}})
	req := webReq
	req.TTL = 2 * time.Second
	tok, err := s.Issuer.Mint(req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	opened := time.Now()
	res, sc := openWatch(t, s, tok, "service=web")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("watch: %d", res.StatusCode)
	}
	ev := nextDrain(t, sc)
	if !strings.Contains(ev.data, `"reason":"token_expired"`) {
		t.Fatalf("drain %q, want reason token_expired", ev.data)
	}
	if took := time.Since(opened); took > 3*time.Second {
		t.Errorf("drained %s after opening with a 2 s token", took)
	}
	if sc.Scan() {
		t.Errorf("the stream went on after the drain: %q", sc.Text())
	}
}

// TestWatchEndsWhenTheGrantIsRevoked: a workload watching another
// service under a grant is drained (reason grant_revoked) when the grant
// is revoked, whether through this replica's API or by another replica
// (a sealed tombstone, seen on the copy's next reload); streams that keep
// their authority go on, and so does one whose grant row was deleted by
// hand (issue 25: a missing row is not a revocation).
func TestWatchEndsWhenTheGrantIsRevoked(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	oscar := s.Token(t, apptest.Operator)
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", oscar, `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Fatalf("grant: %d %s", r.Status, r.Body)
	}
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 10)}, {View: frame(stream.KindView, "api", 0, 10)}})
	api := s.Token(t, apiReq)
	_, granted := openWatch(t, s, api, "service=web&service=api")
	_, own := openWatch(t, s, api, "service=api")
	_, viewer := openWatch(t, s, s.Token(t, apptest.Viewer), "service=web")
	for _, sc := range []*bufio.Scanner{granted, own, viewer} {
		if evs := readEvents(t, sc, 1); evs[0].kind != "view" {
			t.Fatalf("first event %+v", evs)
		}
	}
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", oscar, `{"callers":[]}`); r.Status != http.StatusOK {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	if ev := nextDrain(t, granted); !strings.Contains(ev.data, `"reason":"grant_revoked"`) {
		t.Fatalf("drain %q, want reason grant_revoked", ev.data)
	}
	// The others still hold their authority: the next publication reaches them.
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 11), Delta: frame(stream.KindDelta, "web", 10, 11)},
		{View: frame(stream.KindView, "api", 0, 11), Delta: frame(stream.KindDelta, "api", 10, 11)}})
	for name, sc := range map[string]*bufio.Scanner{"api's own": own, "the viewer's": viewer} {
		for {
			ev := readEvents(t, sc, 1)[0]
			if ev.kind == "drain" {
				t.Fatalf("%s stream drained: %q", name, ev.data)
			}
			if ev.kind == "delta" {
				break
			}
		}
	}

	// Granted again, then its row deleted by hand: not a revocation (only
	// a sealed tombstone is), so the stream goes on, alarmed.
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", oscar, `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Fatalf("grant again: %d %s", r.Status, r.Body)
	}
	_, again := openWatch(t, s, api, "service=web")
	readEvents(t, again, 1)
	if _, err := s.Pool.Exec(t.Context(), `DELETE FROM service_grants WHERE service = 'web'`); err != nil {
		t.Fatal(err)
	}
	if err := s.Authz.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r := s.JSON(t, "GET", "/v1/alarms", oscar, ""); !strings.Contains(string(r.Body), `"kind":"authz_row_missing"`) {
		t.Fatalf("alarms after the grant row was deleted by hand: %s", r.Body)
	}
	if r := s.JSON(t, "GET", "/v1/services/web/grants", oscar, ""); !strings.Contains(string(r.Body), `"callers":["api"]`) {
		t.Fatalf("web's grants after the row was deleted by hand: %s", r.Body)
	}
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 12), Delta: frame(stream.KindDelta, "web", 11, 12)}})
	for {
		ev := readEvents(t, again, 1)[0]
		if ev.kind == "drain" {
			t.Fatalf("the grant's row deleted by hand drained the stream: %q", ev.data)
		}
		if ev.kind == "delta" {
			break
		}
	}

	// Granted again through this replica (the row is back), then revoked
	// by another replica (a sealed tombstone): this replica's reload
	// notices and drains the stream.
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", oscar, `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Fatalf("grant a third time: %d %s", r.Status, r.Body)
	}
	other := newStackOn(t, s.Pool)
	alice := identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
	if _, err := other.Registry.PutGrants(t.Context(), alice, "web", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Authz.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ev := nextDrain(t, again); !strings.Contains(ev.data, `"reason":"grant_revoked"`) {
		t.Fatalf("drain after another replica's revocation %q, want grant_revoked", ev.data)
	}
}

// TestResolverResubscribesWithAFreshToken: after a token_expired drain,
// the resolver client subscribes again with a token from Config.Token,
// and muster serves it.
func TestResolverResubscribesWithAFreshToken(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	// A real view, which the client checks.
	id := registerWeb(t, s, 9000)
	wait.For(t, 20*time.Second, "the evaluator's rebuild", s.Evaluator.Ready)
	s.Admit(t, id)
	s.Publisher.RunOnce()
	s.Clock.Advance(2 * time.Second) // past the additions' batching window
	s.Publisher.RunOnce()
	var (
		mu     sync.Mutex
		tokens []string
	)
	c, err := resolver.New(t.Context(), resolver.Config{
		URLs:     []string{s.URL},
		Services: []string{"web"},
		Token: func(context.Context) (string, error) {
			req := webReq
			req.TTL = 2 * time.Second
			tok, err := s.Issuer.Mint(req, time.Now())
			mu.Lock()
			tokens = append(tokens, tok)
			mu.Unlock()
			return tok, err
		},
		ReportInterval: -1,
		BaseBackoff:    10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wait.For(t, 20*time.Second, "a second subscription, synced", func() bool { return c.Stats().Syncs >= 2 })
	st := c.Stats()
	if st.LastError == nil || !strings.Contains(st.LastError.Error(), "drain") {
		t.Errorf("the first stream ended with %v, want the drain", st.LastError)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(tokens) < 2 || slices.Contains(tokens[1:], tokens[0]) {
		t.Fatalf("tokens per subscription: %d, the first reused: %v; want a fresh one for the second", len(tokens), len(tokens) >= 2 && tokens[0] == tokens[1])
	}
	if _, err := c.Resolve("web"); err != nil {
		t.Errorf("resolve after resubscribing: %v", err)
	}
}

// TestTwoIssuersSameSubjectAreTwoActors: alice at the home issuer and
// alice at a second issuer are two actors in the audit log, and two keys
// for the rate limiters.
func TestTwoIssuersSameSubjectAreTwoActors(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{SecondIssuer: true})
	alice := devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
	home, other := s.Token(t, alice), s.Token2(t, alice)
	if r := s.JSON(t, "PUT", "/v1/services/web", home, `{"owner":"payments","capabilities":["self"]}`); r.Status != http.StatusCreated {
		t.Fatalf("home alice: %d %s", r.Status, r.Body)
	}
	if r := s.JSON(t, "PUT", "/v1/services/api", other, `{"owner":"search","capabilities":["self"]}`); r.Status != http.StatusCreated {
		t.Fatalf("the other alice: %d %s", r.Status, r.Body)
	}
	evs := apptest.Decode[struct{ Items []audit.Event }](t, s.Do(t, "GET", "/v1/audit?action=service.put", home, "", "")).Items
	actors := map[string]string{}
	for _, e := range evs {
		actors[e.Target] = e.Actor
	}
	if actors["web"] != "operator:alice" || actors["api"] != s.Issuer2.URL()+"#operator:alice" {
		t.Fatalf("actors %v, want web by operator:alice and api by %s#operator:alice", actors, s.Issuer2.URL())
	}
	// A prober of the same subject at the second issuer does not inherit
	// the home one's assignments; it has its own, under its full name.
	if r := s.JSON(t, "PUT", "/v1/probers/p1/assignments", home, `{"services":["web"]}`); r.Status != http.StatusOK {
		t.Fatalf("assign p1: %d %s", r.Status, r.Body)
	}
	r := s.JSON(t, "POST", "/v1/services/web/instances", s.Token(t, webReq), `{"address":"127.0.0.1","port":9000,"zone":"az1"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	id := apptest.Decode[registry.Instance](t, r).ID.String()
	if err := s.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	p1 := devissuer.TokenRequest{Kind: identity.KindProber, Subject: "p1"}
	report := func(tok string) evaluator.Result {
		r := s.JSON(t, "POST", "/v1/reports", tok, reportBody(id, "probe", 1))
		if r.Status != http.StatusOK {
			t.Fatalf("report: %d %s", r.Status, r.Body)
		}
		return apptest.Decode[evaluator.Result](t, r)
	}
	if res := report(s.Token(t, p1)); res.Accepted != 1 {
		t.Fatalf("the home p1's probe: %+v, want accepted", res)
	}
	if res := report(s.Token2(t, p1)); res.Accepted != 0 {
		t.Fatalf("the other issuer's p1 took the home p1's assignment: %+v", res)
	}
	name := s.Issuer2.URL() + "#p1"
	if r := s.JSON(t, "PUT", "/v1/probers/"+url.PathEscape(name)+"/assignments", home, `{"services":["web"]}`); r.Status != http.StatusOK ||
		apptest.Decode[registry.ProberAssignments](t, r).Prober != name {
		t.Fatalf("assign %s: %d %s", name, r.Status, r.Body)
	}
	if err := s.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	if res := report(s.Token2(t, p1)); res.Accepted != 1 {
		t.Fatalf("the other issuer's p1, assigned under %s: %+v, want accepted", name, res)
	}

	// The audit filter tells the two alices apart too.
	mine := apptest.Decode[struct{ Items []audit.Event }](t, s.Do(t, "GET", "/v1/audit?actor=operator:alice", home, "", "")).Items
	for _, e := range mine {
		if e.Target == "api" {
			t.Errorf("the home alice's events include the other alice's %s", e.Action)
		}
	}
}
