package breakglass_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/breakglass"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/seal"
)

// issue records a grant on st's database, as muster breakglass does, at
// the stack's clock.
func issue(t *testing.T, st *apptest.Stack, signer seal.Signer, req breakglass.Request) (breakglass.Grant, string) {
	t.Helper()
	if req.IssuedBy == "" {
		req.IssuedBy = "root@muster-0"
	}
	if req.Reason == "" {
		req.Reason = "the identity provider is down"
	}
	g, tok, err := breakglass.Issue(context.Background(), st.Pool, signer, "local", req, st.Clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	return g, tok
}

// events lists the audit rows f selects.
func events(t *testing.T, st *apptest.Stack, f audit.Filter) []audit.Event {
	t.Helper()
	f.Limit = 100
	evs, err := audit.NewLog(st.Pool).List(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// counter reads a counter of st's registry by name and one label value.
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
			if label == "" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func kinds(alarms []assembler.Alarm) map[string]int {
	out := map[string]int{}
	for _, a := range alarms {
		out[a.Kind]++
	}
	return out
}

// refused checks that r is the 401 problem of a refused token saying want.
func refused(t *testing.T, what string, r apptest.Response, want string) {
	t.Helper()
	if r.Status != http.StatusUnauthorized {
		t.Fatalf("%s: %d %s, want 401", what, r.Status, r.Body)
	}
	p := r.Problem(t)
	if !strings.HasSuffix(p.Type, "unauthenticated") || !strings.Contains(p.Detail, want) {
		t.Errorf("%s: problem %s %q, want unauthenticated saying %q", what, p.Type, p.Detail, want)
	}
}

// TestBreakGlassTokenIsAnAdminUntilItExpires: a grant issued with the
// region's key gives a token that acts as an admin (a service created),
// audited under breakglass#operator:NAME, with the grant's issue and
// first use on the record and breakglass_active open; an hour later (the
// stack's clock) it is refused as expired, the refusal audited and
// counted, and the alarm closed.
func TestBreakGlassTokenIsAnAdminUntilItExpires(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := apptest.New(t, apptest.Options{})
	g, tok := issue(t, st, apptest.SealKey(), breakglass.Request{Operator: "alice", Reason: "first admin of the region", TTL: time.Hour})
	if g.Role != identity.RoleAdmin || !g.ExpiresAt.After(st.Clock.Now().Add(59*time.Minute)) || g.ExpiresAt.After(st.Clock.Now().Add(time.Hour)) {
		t.Fatalf("grant %+v", g)
	}

	if r := st.JSON(t, "PUT", "/v1/services/web", tok, `{"owner":"payments","capabilities":["probe"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create web with the break-glass token: %d %s", r.Status, r.Body)
	}
	// Every action is on the record under the break-glass name.
	acted := events(t, st, audit.Filter{Actor: "breakglass#operator:alice", Target: "web"})
	if len(acted) != 1 || acted[0].Outcome != audit.Accepted || acted[0].ActorKind != "operator" {
		t.Fatalf("the creation of web under breakglass#operator:alice: %+v", acted)
	}
	issued := events(t, st, audit.Filter{Action: "breakglass.issue", Target: g.ID.String()})
	if len(issued) != 1 || issued[0].Actor != "tool:breakglass:root@muster-0" || !strings.Contains(issued[0].Reason, "first admin of the region") {
		t.Fatalf("breakglass.issue rows: %+v", issued)
	}
	if used := events(t, st, audit.Filter{Action: "breakglass.use", Target: g.ID.String()}); len(used) != 1 {
		t.Fatalf("breakglass.use rows: %+v", used)
	}
	// A second request costs no query for the grant (the cache) and no
	// second use row.
	if r := st.Do(t, "GET", "/v1/alarms", tok, "", ""); r.Status != http.StatusOK {
		t.Fatalf("GET /v1/alarms: %d %s", r.Status, r.Body)
	}
	if n := st.RequestQueries("/v1/alarms"); n != 0 {
		t.Errorf("GET /v1/alarms with a grant read a moment ago ran %d queries, want 0", n)
	}
	if used := events(t, st, audit.Filter{Action: "breakglass.use"}); len(used) != 1 {
		t.Fatalf("breakglass.use rows after a second request: %d", len(used))
	}

	// The alarm, on the overview's list and the metric the alert reads.
	if err := st.App.BreakGlass.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	r := st.Do(t, "GET", "/v1/alarms", tok, "", "")
	list := apptest.Decode[struct{ Alarms []assembler.Alarm }](t, r)
	if k := kinds(list.Alarms); k[breakglass.AlarmActive] != 1 {
		t.Fatalf("alarms %+v, want one breakglass_active", list.Alarms)
	}
	for _, a := range list.Alarms {
		if a.Kind == breakglass.AlarmActive && (!strings.Contains(a.Detail, g.ID.String()) || !strings.Contains(a.Detail, "first admin of the region")) {
			t.Errorf("breakglass_active says %q", a.Detail)
		}
	}
	if open := gauge(t, st.Metrics, "muster_alarms_open", "kind", breakglass.AlarmActive); open != 1 {
		t.Errorf("muster_alarms_open{kind=breakglass_active} = %v, want 1", open)
	}

	// Still good just before its expiry (the row read again: the cache's
	// entry is old), refused after it and the leeway.
	st.Clock.Advance(g.ExpiresAt.Sub(st.Clock.Now()) - time.Second)
	before := st.RequestQueries("/v1/alarms")
	if r := st.Do(t, "GET", "/v1/alarms", tok, "", ""); r.Status != http.StatusOK {
		t.Fatalf("a second before expiry: %d %s", r.Status, r.Body)
	}
	if n := st.RequestQueries("/v1/alarms") - before; n != 1 {
		t.Errorf("a request with a grant read %s ago ran %d queries, want 1 (the grant read again)", breakglass.DefaultCacheFor, n)
	}
	st.Clock.Advance(time.Second + breakglass.Leeway)
	refused(t, "after expiry", st.Do(t, "GET", "/v1/alarms", tok, "", ""), "token expired")
	if rows := events(t, st, audit.Filter{Action: "breakglass.refuse", Target: g.ID.String()}); len(rows) != 1 ||
		rows[0].Outcome != audit.Refused || rows[0].Actor != "breakglass#operator:alice" || !strings.Contains(rows[0].Reason, "expired") {
		t.Fatalf("breakglass.refuse rows: %+v", rows)
	}
	if n := counter(t, st.Metrics, "muster_breakglass_refusals_total", "reason", identity.FailureExpired); n != 1 {
		t.Errorf("muster_breakglass_refusals_total{reason=expired} = %v, want 1", n)
	}
	if a := st.App.BreakGlass.Alarms(); len(a) != 0 {
		t.Errorf("alarms after expiry: %+v", a)
	}
	if err := st.App.BreakGlass.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if a := st.App.BreakGlass.Alarms(); len(a) != 0 {
		t.Errorf("alarms after expiry and a new list: %+v", a)
	}
}

// gauge reads a gauge of reg by name and one label value.
func gauge(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// TestBreakGlassRefusals: a token is refused once its grant is revoked
// (within the cache's bound, and not before it), once its row is deleted
// or edited by hand (a role widened, an expiry extended: the seal no
// longer verifies), when it is signed by a key the region does not trust,
// and when its claims are changed (a later exp). Each refusal is a 401
// problem, counted by reason; those of a real grant's token are audited
// under its id, the others in the per-source summary. A hand-edited row
// raises breakglass_unsealed.
func TestBreakGlassRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := apptest.New(t, apptest.Options{})
	key := apptest.SealKey()
	revoked, revokedTok := issue(t, st, key, breakglass.Request{Operator: "rita"})
	deleted, deletedTok := issue(t, st, key, breakglass.Request{Operator: "dora"})
	edited, editedTok := issue(t, st, key, breakglass.Request{Operator: "eve", Role: identity.RoleViewer, TTL: 30 * time.Minute})
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, strangerTok := issue(t, st, audit.NewKeySigner(priv), breakglass.Request{Operator: "mallory"})
	_, goodTok := issue(t, st, key, breakglass.Request{Operator: "gina"})

	// A viewer's grant reads but cannot create a service.
	if r := st.JSON(t, "PUT", "/v1/services/api", editedTok, `{"owner":"search","capabilities":["probe"]}`); r.Status != http.StatusForbidden {
		t.Fatalf("a viewer grant creating a service: %d %s", r.Status, r.Body)
	}
	for _, tok := range []string{revokedTok, deletedTok, editedTok, goodTok} {
		if r := st.Do(t, "GET", "/v1/alarms", tok, "", ""); r.Status != http.StatusOK {
			t.Fatalf("GET /v1/alarms: %d %s", r.Status, r.Body)
		}
	}

	// Later claims on a real signature: the signature no longer verifies.
	parts := strings.Split(goodTok, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(payload, &c); err != nil {
		t.Fatal(err)
	}
	c["exp"] = c["exp"].(float64) + 86400
	c["muster_role"] = "admin"
	b, _ := json.Marshal(c)
	extended := parts[0] + "." + base64.RawURLEncoding.EncodeToString(b) + "." + parts[2]
	refused(t, "a token with a later exp", st.Do(t, "GET", "/v1/alarms", extended, "", ""), "bad signature")
	refused(t, "another key's token", st.Do(t, "GET", "/v1/alarms", strangerTok, "", ""), "not trust")

	// Revoked: honoured within the cache's bound, not sooner.
	if _, err := breakglass.Revoke(ctx, st.Pool, revoked.ID, "root@muster-0", st.Clock.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := breakglass.Revoke(ctx, st.Pool, revoked.ID, "root@muster-0", st.Clock.Now()); !errors.Is(err, breakglass.ErrRevoked) {
		t.Fatalf("a second revoke: %v, want ErrRevoked", err)
	}
	if r := st.Do(t, "GET", "/v1/alarms", revokedTok, "", ""); r.Status != http.StatusOK {
		t.Fatalf("a token revoked less than the cache's bound ago: %d %s", r.Status, r.Body)
	}
	// A database administrator deletes one row and widens another.
	if _, err := st.Pool.Exec(ctx, `DELETE FROM breakglass_grants WHERE id = $1`, deleted.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool.Exec(ctx, `UPDATE breakglass_grants SET role = 'admin', expires_at = expires_at + interval '3 hours' WHERE id = $1`, edited.ID); err != nil {
		t.Fatal(err)
	}
	st.Clock.Advance(breakglass.DefaultCacheFor)

	refused(t, "revoked", st.Do(t, "GET", "/v1/alarms", revokedTok, "", ""), "revoked")
	refused(t, "row deleted", st.Do(t, "GET", "/v1/alarms", deletedTok, "", ""), "does not exist")
	refused(t, "row edited", st.Do(t, "GET", "/v1/alarms", editedTok, "", ""), "not as muster wrote it")
	if r := st.JSON(t, "PUT", "/v1/services/api", editedTok, `{"owner":"search","capabilities":["probe"]}`); r.Status != http.StatusUnauthorized {
		t.Fatalf("the widened grant creating a service: %d %s", r.Status, r.Body)
	}
	if r := st.Do(t, "GET", "/v1/alarms", goodTok, "", ""); r.Status != http.StatusOK {
		t.Fatalf("an untouched grant beside them: %d %s", r.Status, r.Body)
	}

	for reason, want := range map[string]float64{
		breakglass.FailureRevoked: 1, breakglass.FailureNoGrant: 1, breakglass.FailureUnsealed: 2, identity.FailureBadSignature: 2,
	} {
		if n := counter(t, st.Metrics, "muster_breakglass_refusals_total", "reason", reason); n != want {
			t.Errorf("muster_breakglass_refusals_total{reason=%s} = %v, want %v", reason, n, want)
		}
	}
	// A real grant's refusals, on the record under its id (the two of
	// the edited one in the same minute: once).
	for _, g := range []breakglass.Grant{revoked, deleted, edited} {
		rows := events(t, st, audit.Filter{Action: "breakglass.refuse", Target: g.ID.String()})
		if len(rows) != 1 || rows[0].Outcome != audit.Refused || rows[0].Actor != "breakglass#operator:"+g.Operator {
			t.Errorf("breakglass.refuse rows of %s's grant: %+v", g.Operator, rows)
		}
	}
	if rows := events(t, st, audit.Filter{Action: "breakglass.revoke", Target: revoked.ID.String()}); len(rows) != 1 {
		t.Errorf("breakglass.revoke rows: %+v", rows)
	}
	// The forgeries, in the per-source summary like any bad token.
	st.AuthFailures.RunOnce(ctx, false)
	sums := events(t, st, audit.Filter{Action: audit.ActionAuthRefuse})
	var byReason map[string]int
	for _, e := range sums {
		var a struct {
			ByReason map[string]int `json:"by_reason"`
		}
		if err := json.Unmarshal(e.After, &a); err != nil {
			t.Fatal(err)
		}
		byReason = a.ByReason
	}
	if byReason[identity.FailureBadSignature] != 2 || byReason[breakglass.FailureRevoked] != 1 || byReason[breakglass.FailureNoGrant] != 1 {
		t.Errorf("auth.refuse summary by reason %v", byReason)
	}
	for _, e := range sums {
		for _, tok := range []string{revokedTok, strangerTok, extended} {
			if strings.Contains(string(e.After)+e.Reason, tok[strings.LastIndexByte(tok, '.')+1:]) {
				t.Fatal("a token's signature is on the audit record")
			}
		}
	}

	// The hand-edited row (live by its edited expiry) is alarmed; the
	// live ones stay active, the revoked one is not.
	if err := st.App.BreakGlass.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	k := kinds(st.App.BreakGlass.Alarms())
	if k[breakglass.AlarmUnsealed] != 2 || k[breakglass.AlarmActive] != 1 {
		t.Errorf("alarms by kind %v, want breakglass_unsealed for eve's row and mallory's (sealed by a key the region does not trust) and breakglass_active for gina's", k)
	}
}

// TestBreakGlassRequestsAreChecked: a grant without a reason, past the
// TTL cap, for a bad name or an unknown role, or without a key, is
// refused with a reason and writes nothing.
func TestBreakGlassRequestsAreChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := db.OpenPool(ctx, db.PoolConfig{URL: dbtest.URL(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ok := breakglass.Request{Operator: "alice", Reason: "bootstrap", IssuedBy: "root@muster-0"}
	for _, tc := range []struct {
		name string
		edit func(*breakglass.Request)
		want string
	}{
		{"no reason", func(r *breakglass.Request) { r.Reason = "  " }, "--reason is required"},
		{"ttl over the cap", func(r *breakglass.Request) { r.TTL = 5 * time.Hour }, "--ttl 5h0m0s"},
		{"bad operator", func(r *breakglass.Request) { r.Operator = "alice; drop" }, "--operator"},
		{"unknown role", func(r *breakglass.Request) { r.Role = "root" }, "--role"},
		{"multi-line reason", func(r *breakglass.Request) { r.Reason = "a\nforged: line" }, "one line"},
	} {
		req := ok
		tc.edit(&req)
		_, _, err := breakglass.Issue(ctx, pool, apptest.SealKey(), "local", req, time.Now())
		if !errors.Is(err, breakglass.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", tc.name, err, tc.want)
		}
	}
	if _, _, err := breakglass.Issue(ctx, pool, nil, "local", ok, time.Now()); !errors.Is(err, breakglass.ErrNoKey) {
		t.Errorf("without a key: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM breakglass_grants`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d grants written by refused requests (%v)", n, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit_events WHERE action LIKE 'breakglass.%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d audit rows written by refused requests (%v)", n, err)
	}
}

// TestBreakGlassWhileTheDatabaseIsAway: a grant read less than the
// cache's bound ago is still honoured when PostgreSQL cannot be reached;
// one that must be read answers ErrIssuerUnavailable (the server's 503),
// not a refusal, and nothing is counted as refused for the token's sake.
func TestBreakGlassWhileTheDatabaseIsAway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	pool, err := db.OpenPool(ctx, db.PoolConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	away, err := db.OpenPool(ctx, db.PoolConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	clock := func() time.Time { return now }
	key := apptest.SealKey()
	req := breakglass.Request{Operator: "alice", Reason: "idp down", IssuedBy: "root@muster-0"}
	_, first, err := breakglass.Issue(ctx, pool, key, "local", req, now)
	if err != nil {
		t.Fatal(err)
	}
	_, second, err := breakglass.Issue(ctx, pool, key, "local", req, now)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := breakglass.New(breakglass.Config{Pool: away, Region: "local", Keys: seal.Keys{}.With(key), Now: clock, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := s.Verify(ctx, first); err != nil || p.String() != "breakglass#operator:alice" || p.Role != identity.RoleAdmin {
		t.Fatalf("with the database: %v %v", p, err)
	}
	away.Close()
	now = now.Add(breakglass.DefaultCacheFor - time.Second)
	if _, err := s.Verify(ctx, first); err != nil {
		t.Fatalf("a grant read %s ago, the database away: %v", breakglass.DefaultCacheFor-time.Second, err)
	}
	_, err = s.Verify(ctx, second)
	if !errors.Is(err, identity.ErrIssuerUnavailable) || errors.Is(err, identity.ErrInvalidToken) {
		t.Fatalf("a grant not read yet, the database away: %v, want ErrIssuerUnavailable", err)
	}
	now = now.Add(time.Second)
	if _, err := s.Verify(ctx, first); !errors.Is(err, identity.ErrIssuerUnavailable) {
		t.Fatalf("a grant read %s ago, the database away: %v, want ErrIssuerUnavailable", breakglass.DefaultCacheFor, err)
	}
	for _, reason := range []string{breakglass.FailureNoGrant, breakglass.FailureRevoked, breakglass.FailureUnsealed} {
		if n := counter(t, reg, "muster_breakglass_refusals_total", "reason", reason); n != 0 {
			t.Errorf("muster_breakglass_refusals_total{reason=%s} = %v while the database was away", reason, n)
		}
	}
}
