package registry_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/testclock"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/migrations"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var (
	admin    = identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
	oscar    = identity.Principal{Kind: identity.KindOperator, Subject: "oscar", Team: "payments", Role: identity.RoleOperator}
	olga     = identity.Principal{Kind: identity.KindOperator, Subject: "olga", Team: "search", Role: identity.RoleOperator}
	vera     = identity.Principal{Kind: identity.KindOperator, Subject: "vera", Team: "payments", Role: identity.RoleViewer}
	webWL    = identity.Principal{Kind: identity.KindWorkload, Subject: "web-7f9", Service: "web"}
	apiWL    = identity.Principal{Kind: identity.KindWorkload, Subject: "api-1", Service: "api"}
	loopback = netip.MustParseAddr("127.0.0.1")
)

type env struct {
	reg   *registry.Registry
	pool  *pgxpool.Pool
	clock *testclock.Clock
	q     *db.Queries
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := dbtest.New(t)
	clk := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	reg, err := registry.New(registry.Config{Pool: pool, Region: "eu-west-1", Now: clk.Now, LeaseClock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{reg: reg, pool: pool, clock: clk, q: db.New(pool)}
	e.mustService(t, "web", "payments", registry.CapProbe, registry.CapSelf, registry.CapPassive)
	e.mustService(t, "api", "search", registry.CapPassive)
	return e
}

func (e *env) mustService(t *testing.T, name, owner string, caps ...registry.Capability) {
	t.Helper()
	if _, _, err := e.reg.PutService(context.Background(), admin, name, registry.ServiceSpec{Owner: owner, Capabilities: caps}); err != nil {
		t.Fatal(err)
	}
}

// events returns the audit log oldest first.
func (e *env) events(t *testing.T, f audit.Filter) []audit.Event {
	t.Helper()
	f.Limit = 1000
	evs, err := audit.List(context.Background(), e.q, f)
	if err != nil {
		t.Fatal(err)
	}
	for i, j := 0, len(evs)-1; i < j; i, j = i+1, j-1 {
		evs[i], evs[j] = evs[j], evs[i]
	}
	return evs
}

func wantKind(t *testing.T, err, kind error) *refusal.Error {
	t.Helper()
	var re *refusal.Error
	if !errors.As(err, &re) || !errors.Is(err, kind) {
		t.Fatalf("err = %v, want a *refusal.Error of kind %v", err, kind)
	}
	return re
}

func TestPutServiceAuthorisation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	for _, tc := range []struct {
		name  string
		actor identity.Principal
		svc   string
		spec  registry.ServiceSpec
		want  error
	}{
		{"team operator creates for own team", oscar, "checkout", registry.ServiceSpec{Owner: "payments"}, nil},
		{"operator creates for another team", olga, "ledger", registry.ServiceSpec{Owner: "payments"}, registry.ErrForbidden},
		{"viewer cannot create", vera, "ledger", registry.ServiceSpec{Owner: "payments"}, registry.ErrForbidden},
		{"workload cannot create", webWL, "ledger", registry.ServiceSpec{Owner: "payments"}, registry.ErrForbidden},
		{"other team cannot update", olga, "web", registry.ServiceSpec{Owner: "payments", Capabilities: []registry.Capability{"probe"}}, registry.ErrForbidden},
		{"owner cannot give the service away", oscar, "web", registry.ServiceSpec{Owner: "search", Capabilities: []registry.Capability{"probe", "self", "passive"}}, registry.ErrForbidden},
		{"admin moves it", admin, "web", registry.ServiceSpec{Owner: "search", Capabilities: []registry.Capability{"probe", "self", "passive"}}, nil},
		{"bad name", admin, "Web_1", registry.ServiceSpec{Owner: "payments"}, registry.ErrInvalid},
		{"unknown capability", admin, "x", registry.ServiceSpec{Owner: "payments", Capabilities: []registry.Capability{"telepathy"}}, registry.ErrInvalid},
	} {
		_, _, err := e.reg.PutService(ctx, tc.actor, tc.svc, tc.spec)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	refused := e.events(t, audit.Filter{Action: "service.put", Outcome: audit.Refused})
	if len(refused) != 7 {
		t.Fatalf("refused service.put audit events = %d, want 7: %+v", len(refused), refused)
	}
	if refused[0].Actor != "operator:olga" || refused[0].Target != "ledger" || !strings.Contains(refused[0].Reason, "payments") {
		t.Errorf("first refusal audited as %+v", refused[0])
	}
}

func TestServiceCapabilitiesCannotUndercutContract(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	if _, err := e.reg.PutContract(ctx, oscar, "web", registry.DefaultContract(), -1); err != nil {
		t.Fatal(err)
	}
	_, _, err := e.reg.PutService(ctx, oscar, "web", registry.ServiceSpec{Owner: "payments", Capabilities: []registry.Capability{"passive"}})
	re := wantKind(t, err, registry.ErrConflict)
	if len(re.Fields) == 0 || re.Fields[0].Field != "weights.probe" {
		t.Fatalf("fields = %+v, want weights.probe first", re.Fields)
	}
}

func TestContractValidation(t *testing.T) {
	t.Parallel()
	web := registry.Service{Name: "web", Capabilities: []registry.Capability{"passive", "probe", "self"}}
	ext := registry.Service{Name: "stripe", Capabilities: []registry.Capability{"passive"}}
	mod := func(f func(*registry.Contract)) registry.Contract {
		c := registry.DefaultContract()
		c.Weights = map[registry.Capability]float64{"probe": 1, "self": 1, "passive": 1}
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name   string
		svc    registry.Service
		c      registry.Contract
		fields []string
	}{
		{"defaults", web, mod(func(*registry.Contract) {}), nil},
		{"shared unready", web, mod(func(c *registry.Contract) {
			c.Dependencies = []registry.Dependency{{Name: "db", Shared: true, Authority: "unready"}}
		}), []string{"dependencies[0].authority"}},
		{"unshared unready is fine", web, mod(func(c *registry.Contract) {
			c.Dependencies = []registry.Dependency{{Name: "cache", Authority: "unready"}, {Name: "db", Shared: true, Authority: "weight"}}
		}), nil},
		{"reentry must be strictly below removal", web, mod(func(c *registry.Contract) { c.ReentryThreshold = c.RemovalThreshold }), []string{"reentry_threshold"}},
		{"evidence the service cannot supply", ext, mod(func(*registry.Contract) {}), []string{"weights.probe", "weights.self"}},
		{"readiness without the capability", ext, mod(func(c *registry.Contract) {
			c.Weights = map[registry.Capability]float64{"passive": 1}
			c.RequireReadiness = true
		}), []string{"require_readiness"}},
		{"no evidence weighted at all", web, mod(func(c *registry.Contract) { c.Weights = map[registry.Capability]float64{} }), []string{"weights"}},
		{"dependencies need self-reports", ext, mod(func(c *registry.Contract) {
			c.Weights = map[registry.Capability]float64{"passive": 1}
			c.Dependencies = []registry.Dependency{{Name: "db", Authority: "weight"}}
		}), []string{"dependencies"}},
		{"guard cannot be turned off", web, mod(func(c *registry.Contract) { c.MinHealthyFraction = 0 }), []string{"min_healthy_fraction"}},
		{"slow detection past the floor", web, mod(func(c *registry.Contract) { c.HalfLifeSeconds = 20; c.RemovalThreshold = 0.9 }), []string{"half_life_seconds"}},
		{"interval past the floor", web, mod(func(c *registry.Contract) { c.IntervalSeconds = 120 }), []string{"interval_seconds"}},
		{"duplicate and bad dependency names", web, mod(func(c *registry.Contract) {
			c.Dependencies = []registry.Dependency{{Name: "db", Authority: "weight"}, {Name: "db", Authority: "weight"}, {Name: "DB!", Authority: "loud"}}
		}), []string{"dependencies[1].name", "dependencies[2].name", "dependencies[2].authority"}},
		{"unknown class weight", web, mod(func(c *registry.Contract) { c.Weights["gossip"] = 1 }), []string{"weights.gossip"}},
		{"slow start zero allowed", web, mod(func(c *registry.Contract) { c.SlowStartSeconds = 0 }), nil},
	} {
		var got []string
		for _, fe := range registry.ValidateContract(tc.c, tc.svc) {
			got = append(got, fe.Field)
		}
		if diff := cmp.Diff(tc.fields, got); diff != "" {
			t.Errorf("%s: fields (-want +got):\n%s", tc.name, diff)
		}
	}
	if d := registry.DefaultContract(); d.SoftDetectionSeconds() > 5 {
		t.Errorf("platform defaults detect a soft failure after %.1f s; ADR-07 allows 5", d.SoftDetectionSeconds())
	}
}

func TestPutContract(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)

	got, err := e.reg.GetContract(ctx, vera, "web")
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 0 || got.Contract.Weights["probe"] != 1 || got.Contract.MinHealthyFraction != 0.5 {
		t.Fatalf("default contract = %+v", got)
	}

	bad := registry.DefaultContract()
	bad.Dependencies = []registry.Dependency{{Name: "db", Shared: true, Authority: registry.AuthorityUnready}}
	_, err = e.reg.PutContract(ctx, oscar, "web", bad, -1)
	re := wantKind(t, err, registry.ErrInvalid)
	if re.Fields[0].Field != "dependencies[0].authority" {
		t.Fatalf("fields = %+v", re.Fields)
	}

	_, err = e.reg.PutContract(ctx, olga, "web", registry.DefaultContract(), -1)
	wantKind(t, err, registry.ErrForbidden)
	_, err = e.reg.PutContract(ctx, vera, "web", registry.DefaultContract(), -1)
	wantKind(t, err, registry.ErrForbidden)
	_, err = e.reg.PutContract(ctx, oscar, "nope", registry.DefaultContract(), -1)
	wantKind(t, err, registry.ErrNotFound)

	good := registry.DefaultContract()
	good.MinHealthyFraction = 0.7
	good.Dependencies = []registry.Dependency{{Name: "db", Shared: true}}
	v1, err := e.reg.PutContract(ctx, oscar, "web", good, 0)
	if err != nil {
		t.Fatal(err)
	}
	if v1.Version != 1 || v1.Contract.Dependencies[0].Authority != registry.AuthorityWeight || v1.UpdatedBy != "operator:oscar" {
		t.Fatalf("stored = %+v", v1)
	}
	// A stale If-Match loses; the current one wins.
	_, err = e.reg.PutContract(ctx, oscar, "web", good, 0)
	wantKind(t, err, registry.ErrPrecondition)
	v2, err := e.reg.PutContract(ctx, admin, "web", good, 1)
	if err != nil || v2.Version != 2 {
		t.Fatalf("v2 = %+v, %v", v2, err)
	}

	// Nothing invalid was stored: the stored contract is the last good one.
	cur, err := e.reg.GetContract(ctx, oscar, "web")
	if err != nil || cur.Version != 2 || cur.Contract.MinHealthyFraction != 0.7 {
		t.Fatalf("current = %+v, %v", cur, err)
	}

	evs := e.events(t, audit.Filter{Action: "contract.put"})
	var outcomes []string
	for _, ev := range evs {
		outcomes = append(outcomes, string(ev.Outcome)+":"+ev.Actor)
	}
	want := []string{"refused:operator:oscar", "refused:operator:olga", "refused:operator:vera", "accepted:operator:oscar", "refused:operator:oscar", "accepted:operator:alice"}
	if diff := cmp.Diff(want, outcomes); diff != "" {
		t.Fatalf("contract audit trail (-want +got):\n%s", diff)
	}
	if !strings.Contains(evs[0].Reason, "dependencies[0].authority") {
		t.Errorf("validation refusal reason %q does not name the field", evs[0].Reason)
	}
	if evs[5].Before == nil || evs[5].After == nil {
		t.Errorf("accepted update lacks before/after: %+v", evs[5])
	}
}

func TestRegisterRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	reg := registry.Registration{Address: "10.0.0.7", Port: 8443, Zone: "az1"}
	other := netip.MustParseAddr("10.0.0.99")

	_, err := e.reg.Register(ctx, apiWL, netip.MustParseAddr("10.0.0.7"), "web", reg)
	re := wantKind(t, err, registry.ErrForbidden)
	if !strings.Contains(re.Detail, "may not register instances of web") {
		t.Errorf("detail %q", re.Detail)
	}
	_, err = e.reg.Register(ctx, webWL, other, "web", reg)
	re = wantKind(t, err, registry.ErrForbidden)
	if !strings.Contains(re.Detail, "not proved") || !strings.Contains(re.Detail, "10.0.0.99") {
		t.Errorf("detail %q", re.Detail)
	}
	_, err = e.reg.Register(ctx, webWL, other, "web", registry.Registration{Address: "nope", Port: 0, Zone: "AZ 1", Region: "us-east-1"})
	re = wantKind(t, err, registry.ErrInvalid)
	var fields []string
	for _, f := range re.Fields {
		fields = append(fields, f.Field)
	}
	if diff := cmp.Diff([]string{"address", "port", "zone", "region"}, fields); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
	_, err = e.reg.Register(ctx, webWL, other, "ghost", reg)
	wantKind(t, err, registry.ErrNotFound)

	// Proved by source address.
	a, err := e.reg.Register(ctx, webWL, netip.MustParseAddr("10.0.0.7"), "web", reg)
	if err != nil {
		t.Fatal(err)
	}
	if a.State != registry.StateActive || a.Region != "eu-west-1" || a.Source != "registered" ||
		!a.LeaseExpiresAt.Equal(e.clock.Now().Add(30*time.Second)) {
		t.Fatalf("registered %+v", a)
	}
	// Proved by the token's address claim; same endpoint: the old one is replaced.
	claimed := webWL
	claimed.Addresses = []netip.Addr{netip.MustParseAddr("10.0.0.7")}
	b, err := e.reg.Register(ctx, claimed, other, "web", reg)
	if err != nil {
		t.Fatal(err)
	}
	if b.ID == a.ID {
		t.Fatal("re-registration reused the id")
	}
	old, err := e.reg.GetInstance(ctx, admin, a.ID)
	if err != nil || old.State != registry.StateReplaced || old.EndedAt == nil {
		t.Fatalf("old instance = %+v, %v", old, err)
	}
	// The service's operator may declare an endpoint without address proof.
	if _, err := e.reg.Register(ctx, oscar, netip.Addr{}, "web", registry.Registration{Address: "192.0.2.10", Port: 443, Zone: "az2"}); err != nil {
		t.Fatal(err)
	}
	_, err = e.reg.Register(ctx, olga, netip.Addr{}, "web", registry.Registration{Address: "192.0.2.11", Port: 443, Zone: "az2"})
	wantKind(t, err, registry.ErrForbidden)

	refused := e.events(t, audit.Filter{Action: "instance.register", Outcome: audit.Refused})
	if len(refused) != 4 { // wrong service, unproved address, invalid, other team (not found is not audited)
		t.Fatalf("refused registrations audited = %d, want 4", len(refused))
	}
	if refused[0].Actor != "workload:api/api-1" || refused[0].Target != "web" {
		t.Errorf("refusal audited as %+v", refused[0])
	}
	if n := len(e.events(t, audit.Filter{Action: "instance.replace"})); n != 1 {
		t.Errorf("replace events = %d, want 1", n)
	}
}

// reaper returns a reaper over e's registry that has been hearing renewals
// for a long time (no start-up grace), as a long-running process has.
func (e *env) reaper(t *testing.T, cfg registry.ReaperConfig) *registry.Reaper {
	t.Helper()
	cfg.Registry = e.reg
	rp, err := registry.NewReaper(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rp
}

func (e *env) reap(t *testing.T, rp *registry.Reaper) int {
	t.Helper()
	n, err := rp.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestLeaseLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	rp := e.reaper(t, registry.ReaperConfig{})
	inst, err := e.reg.Register(ctx, webWL, loopback, "web", registry.Registration{Address: "127.0.0.1", Port: 9000, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	expire := func() int { t.Helper(); return e.reap(t, rp) }

	e.clock.Advance(20 * time.Second)
	renewed, err := e.reg.Renew(ctx, webWL, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !renewed.LeaseExpiresAt.Equal(e.clock.Now().Add(30 * time.Second)) {
		t.Fatalf("renewed lease expires %s", renewed.LeaseExpiresAt)
	}
	// Another service's workload is told the instance does not exist (it
	// may not learn what runs where), and the attempt is audited.
	_, err = e.reg.Renew(ctx, apiWL, inst.ID)
	wantKind(t, err, registry.ErrNotFound)
	if evs := e.events(t, audit.Filter{Action: "lease.renew", Outcome: audit.Refused}); len(evs) != 1 || evs[0].Actor != "workload:api/api-1" {
		t.Fatalf("hidden refusal audit: %+v", evs)
	}
	// A viewer of the service sees it but may not renew it.
	_, err = e.reg.Renew(ctx, vera, inst.ID)
	wantKind(t, err, registry.ErrForbidden)

	// 29.9 s after the last renewal: still alive.
	e.clock.Advance(29900 * time.Millisecond)
	if n := expire(); n != 0 {
		t.Fatalf("expired %d instances 29.9 s after renewal", n)
	}
	// Lapsed but not ended (the expiry delay, TTL/3 = 10 s, lets leases
	// that stopped together be counted together): a late renewal keeps
	// the instance and its id.
	e.clock.Advance(5 * time.Second)
	if n := expire(); n != 0 {
		t.Fatalf("expired %d instances 5 s into the expiry delay", n)
	}
	late, err := e.reg.Renew(ctx, webWL, inst.ID)
	if err != nil || late.ID != inst.ID || late.State != registry.StateActive {
		t.Fatalf("late renewal: %+v, %v", late, err)
	}
	// Not renewed again: lapsed at +30 s, ended once the delay has passed.
	e.clock.Advance(30 * time.Second)
	if n := expire(); n != 0 {
		t.Fatalf("expired %d at the moment the lease lapsed", n)
	}
	e.clock.Advance(10 * time.Second)
	if n := expire(); n != 1 {
		t.Fatalf("expired %d instances TTL + delay after renewal, want 1", n)
	}
	if n := expire(); n != 0 {
		t.Fatalf("expired again: %d", n)
	}
	got, _ := e.reg.GetInstance(ctx, admin, inst.ID)
	if got.State != registry.StateExpired {
		t.Fatalf("state = %s", got.State)
	}
	evs := e.events(t, audit.Filter{Action: "lease.expire"})
	if len(evs) != 1 || evs[0].Actor != "system:lease-reaper" || evs[0].Target != inst.ID.String() {
		t.Fatalf("lease.expire events: %+v", evs)
	}

	// An expired instance cannot be renewed; re-registering gives a new id.
	_, err = e.reg.Renew(ctx, webWL, inst.ID)
	wantKind(t, err, registry.ErrGone)
	again, err := e.reg.Register(ctx, webWL, loopback, "web", registry.Registration{Address: "127.0.0.1", Port: 9000, Zone: "az1"})
	if err != nil || again.ID == inst.ID {
		t.Fatalf("re-registration: %+v, %v", again, err)
	}

	// Deregistration ends it; doing it twice changes nothing. (A second
	// after its registration: the windows below tell the two apart.)
	e.clock.Advance(time.Second)
	if _, err := e.reg.Deregister(ctx, webWL, again.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.reg.Deregister(ctx, webWL, again.ID); err != nil {
		t.Fatal(err)
	}
	if n := len(e.events(t, audit.Filter{Action: "instance.deregister", Outcome: audit.Accepted})); n != 1 {
		t.Fatalf("deregister events = %d, want 1", n)
	}
	live, err := e.reg.ListInstances(ctx, admin, "web", registry.InstanceFilter{}, registry.Page{})
	if err != nil || len(live) != 0 {
		t.Fatalf("live instances = %+v, %v", live, err)
	}
	all, _ := e.reg.ListInstances(ctx, admin, "web", registry.InstanceFilter{IncludeEnded: true}, registry.Page{})
	if len(all) != 2 {
		t.Fatalf("all instances = %d, want 2", len(all))
	}

	// The timeline's rows: the instances registered at some time in a
	// window, by their registration and their end.
	first, _ := e.reg.GetInstance(ctx, admin, inst.ID)
	second, _ := e.reg.GetInstance(ctx, admin, again.ID)
	during := func(since, until time.Time) []uuid.UUID {
		t.Helper()
		got, err := e.reg.InstancesDuring(ctx, admin, "web", since, until, registry.Page{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []uuid.UUID
		for _, in := range got {
			ids = append(ids, in.ID)
		}
		return ids
	}
	for _, tc := range []struct {
		name         string
		since, until time.Time
		want         []uuid.UUID
	}{
		{"before the first registration", first.CreatedAt.Add(-time.Hour), first.CreatedAt, nil},
		{"the first one's life", first.CreatedAt, *first.EndedAt, []uuid.UUID{inst.ID}},
		{"after the first one ended", *first.EndedAt, second.EndedAt.Add(time.Second), []uuid.UUID{again.ID}},
		{"after both ended", second.EndedAt.Add(time.Second), second.EndedAt.Add(time.Hour), nil},
		{"across both", first.CreatedAt.Add(-time.Hour), second.EndedAt.Add(time.Hour), sortedIDs(inst.ID, again.ID)},
	} {
		if got := during(tc.since, tc.until); !slices.Equal(got, tc.want) {
			t.Errorf("instances during %s: %v, want %v", tc.name, got, tc.want)
		}
	}
	_, err = e.reg.InstancesDuring(ctx, admin, "web", first.CreatedAt, *second.EndedAt, registry.Page{After: "not-an-id"})
	wantKind(t, err, registry.ErrInvalid)
	rep, err := audit.Verify(ctx, e.q)
	if err != nil {
		t.Fatalf("audit chain after the lifecycle: %v", err)
	}
	if rep.Rows < 6 {
		t.Fatalf("audit rows = %d", rep.Rows)
	}
}

// register registers n instances of service from an operator of its team,
// in zone az1, on ports from base.
func (e *env) register(t *testing.T, service string, n, base int) []registry.Instance {
	t.Helper()
	actor := oscar
	if service != "web" {
		actor = admin
	}
	out := make([]registry.Instance, n)
	for i := range n {
		in, err := e.reg.Register(context.Background(), actor, netip.Addr{}, service, registry.Registration{Address: "10.1.0.1", Port: base + i, Zone: "az1"})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = in
	}
	return out
}

func (e *env) renew(t *testing.T, ins []registry.Instance) {
	t.Helper()
	for _, in := range ins {
		if _, err := e.reg.Renew(context.Background(), admin, in.ID); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *env) states(t *testing.T, ins []registry.Instance) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, in := range ins {
		got, err := e.reg.GetInstance(context.Background(), admin, in.ID)
		if err != nil {
			t.Fatal(err)
		}
		out[got.State]++
	}
	return out
}

// TestLeaseGraceAfterRestart: a reaper that has just started (muster was
// down longer than a lease) expires nothing for one TTL, the lapsed leases
// are renewed under their ids, and one that really stopped renewing
// expires within TTL + delay of the restart.
func TestLeaseGraceAfterRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ins := e.register(t, "web", 40, 1000)
	// muster is away for 2 min: every lease lapses.
	e.clock.Advance(2 * time.Minute)
	rp := e.reaper(t, registry.ReaperConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := rp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rp.Stop() // only the start time matters here; sweeps are stepped by hand
	for range 29 {
		if n := e.reap(t, rp); n != 0 {
			t.Fatalf("expired %d leases inside the grace after a restart", n)
		}
		if !rp.InGrace() {
			t.Fatal("InGrace is false inside the grace")
		}
		e.clock.Advance(time.Second)
	}
	e.renew(t, ins[1:]) // every workload but one renews, under its old id
	e.clock.Advance(2 * time.Second)
	if n := e.reap(t, rp); n != 1 {
		t.Fatalf("after the grace: expired %d, want the one that stopped", n)
	}
	if got := e.states(t, ins); got[registry.StateActive] != 39 || got[registry.StateExpired] != 1 {
		t.Fatalf("states %v", got)
	}
}

// TestLeaseGraceCountsFromReadiness (issue 26): a replica that listens but
// is not ready yet (rebuilding its evaluation state for longer than a
// lease) expires nothing while it is not, and the grace runs a full TTL
// from readiness, not from the start.
func TestLeaseGraceCountsFromReadiness(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ins := e.register(t, "web", 40, 1000)
	e.clock.Advance(2 * time.Minute) // muster was away: every lease lapsed
	var ready atomic.Bool
	rp := e.reaper(t, registry.ReaperConfig{Ready: ready.Load})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := rp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rp.Stop() // sweeps are stepped by hand
	// The rebuild takes 90 s, three leases long. Most workloads get their
	// renewals through (to another replica, say); two do not, too few to
	// be held as a mass expiry: only readiness keeps them.
	for i := range 90 {
		if i%10 == 0 {
			e.renew(t, ins[2:])
		}
		if n := e.reap(t, rp); n != 0 {
			t.Fatalf("expired %d leases %d s into the start, before the replica was ready", n, i)
		}
		e.clock.Advance(time.Second)
	}
	ready.Store(true)
	e.renew(t, ins[2:])
	e.reap(t, rp) // the first sweep ready: the grace begins
	for range 29 {
		e.clock.Advance(time.Second)
		if n := e.reap(t, rp); n != 0 {
			t.Fatalf("expired %d leases inside the grace after readiness", n)
		}
	}
	e.renew(t, ins[1:]) // one of the two renews once it can
	e.clock.Advance(2 * time.Second)
	if n := e.reap(t, rp); n != 1 {
		t.Fatalf("after the grace: expired %d, want the one that stopped", n)
	}
}

// TestLeaseGraceAfterDatabaseOutage: leases that lapsed while the database
// was away get a full TTL from its return (UpSince).
func TestLeaseGraceAfterDatabaseOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ins := e.register(t, "web", 10, 1000)
	var upSince time.Time // a database that has been up forever
	rp := e.reaper(t, registry.ReaperConfig{UpSince: func() time.Time { return upSince }})
	e.clock.Advance(2 * time.Minute) // the database was down: nobody could renew
	upSince = e.clock.Now()
	if n := e.reap(t, rp); n != 0 || !rp.InGrace() {
		t.Fatalf("right after the database returned: expired %d, grace %v", n, rp.InGrace())
	}
	e.clock.Advance(20 * time.Second)
	e.renew(t, ins)
	e.clock.Advance(15 * time.Second)
	if n := e.reap(t, rp); n != 0 {
		t.Fatalf("expired %d renewed leases", n)
	}
}

// TestLeaseDisbelief: 20% of the region's leases stop renewing at once.
// Expiry is suppressed with an alarm that gives the numbers; renewals
// recovering lift it; an operator's confirmation (audited) releases it.
var (
	region   = disbelief.Scope{Kind: disbelief.Region}
	webScope = disbelief.Scope{Kind: disbelief.Service, Name: "web"}
)

func TestLeaseDisbelief(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	for i := range 5 {
		e.mustService(t, fmt.Sprintf("svc%d", i), "payments")
	}
	var all []registry.Instance
	for i := range 5 {
		all = append(all, e.register(t, fmt.Sprintf("svc%d", i), 20, 2000)...)
	}
	rp := e.reaper(t, registry.ReaperConfig{})
	// One instance of each service stops; so do svc0's first 15 (20 of
	// 100 in the region, 16 of 20 in svc0).
	stopped := map[uuid.UUID]bool{}
	for i, in := range all {
		if i < 15 || i%20 == 19 {
			stopped[in.ID] = true
		}
	}
	var alive []registry.Instance
	for _, in := range all {
		if !stopped[in.ID] {
			alive = append(alive, in)
		}
	}
	if len(stopped) != 20 {
		t.Fatalf("stopped %d", len(stopped))
	}
	// Renewals every 10 s for a minute: the stopped leases lapse.
	for range 6 {
		e.clock.Advance(10 * time.Second)
		e.renew(t, alive)
		if n := e.reap(t, rp); n != 0 {
			t.Fatalf("expired %d of 20 leases that stopped together", n)
		}
	}
	sups := rp.Holds()
	if len(sups) != 1 || sups[0].Scope != region || sups[0].Lacking != 20 || sups[0].Had != 100 || sups[0].Held != 20 || sups[0].Gate != registry.GateLeaseExpiry {
		t.Fatalf("holds %+v, want the region's 20 of 100 held", sups)
	}
	if !strings.Contains(sups[0].Detail, "20 of 100 leases in region") || !strings.Contains(sups[0].Detail, "15%") || !strings.Contains(sups[0].Detail, "no timer") {
		t.Errorf("alarm detail %q", sups[0].Detail)
	}

	// A viewer, a workload and an operator of the team may not release
	// the region; each attempt is audited.
	for _, p := range []identity.Principal{vera, webWL, oscar} {
		_, err := e.reg.ConfirmLeaseExpiry(ctx, p, region, "they are gone")
		wantKind(t, err, registry.ErrForbidden)
	}
	_, err := e.reg.ConfirmLeaseExpiry(ctx, admin, region, "  ")
	wantKind(t, err, registry.ErrInvalid)
	if n := len(e.events(t, audit.Filter{Action: "lease.expiry.confirm", Outcome: audit.Refused})); n != 4 {
		t.Fatalf("refused confirmations audited = %d, want 4", n)
	}

	// svc4's stopped instance comes back: one renewal, one fewer held.
	e.renew(t, all[99:])
	if e.reap(t, rp) != 0 || rp.Holds()[0].Held != 19 {
		t.Fatalf("after one renewal: %+v", rp.Holds())
	}

	c, err := e.reg.ConfirmLeaseExpiry(ctx, admin, region, "az1 rack 7 lost power at 12:00; the instances are gone")
	if err != nil {
		t.Fatal(err)
	}
	if c.Released != 19 {
		t.Fatalf("confirmation released %d, want 19", c.Released)
	}
	if n := e.reap(t, rp); n != 19 {
		t.Fatalf("after the confirmation: expired %d, want 19", n)
	}
	if len(rp.Holds()) != 0 {
		t.Fatalf("holds after the release: %+v", rp.Holds())
	}
	if evs := e.events(t, audit.Filter{Action: "lease.expiry.confirm", Outcome: audit.Accepted}); len(evs) != 1 || evs[0].Actor != admin.String() {
		t.Fatalf("accepted confirmation audit: %+v", evs)
	}
	if got := e.states(t, alive); got[registry.StateActive] != len(alive) {
		t.Fatalf("renewing instances: %v", got)
	}
	if _, err := audit.Verify(ctx, e.q); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseDisbeliefPerServiceAndCorroboration: more than half of one
// service stops renewing. The uncorroborated expiries are held (service
// scope); one whose health evidence says it is gone expires anyway; a
// lone stopped instance of a two-instance service expires (too small a
// scope for the service threshold).
func TestLeaseDisbeliefPerServiceAndCorroboration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.mustService(t, "big", "payments")
	e.mustService(t, "pair", "payments")
	e.mustService(t, "small", "payments")
	big := e.register(t, "big", 100, 1000)
	web := e.register(t, "web", 10, 3000)
	pair := e.register(t, "pair", 2, 4000)
	_ = e.register(t, "small", 1, 5000)
	dead := web[0].ID
	rp := e.reaper(t, registry.ReaperConfig{Evidence: func(ids []uuid.UUID) registry.ExpiryEvidence {
		out := map[uuid.UUID]string{}
		if slices.Contains(ids, dead) {
			out[dead] = "silent on every evidence class while its siblings are heard"
		}
		return registry.ExpiryEvidence{Corroborated: out}
	}})
	keep := append(append(big, web[6:]...), pair[1])
	for range 6 {
		e.clock.Advance(10 * time.Second)
		e.renew(t, keep)
		e.reap(t, rp)
	}
	// web: 6 of 10 stopped (> 50%): five held, the corroborated one gone
	// at once (and out of the count a TTL later: 5 of 9). pair: 1 of 2
	// stopped, and small: its only instance; too few to be a mass event
	// (MinMassExpiry), so they expire (the guard and the last_instance
	// alarm are the backstop there). The region: 8 of 113 (7%).
	got := e.states(t, web)
	if got[registry.StateExpired] != 1 || got[registry.StateActive] != 9 {
		t.Fatalf("web states %v", got)
	}
	if got := e.states(t, pair); got[registry.StateExpired] != 1 {
		t.Fatalf("pair states %v", got)
	}
	sups := rp.Holds()
	if len(sups) != 1 || sups[0].Scope != (disbelief.Scope{Kind: disbelief.Service, Name: "web"}) || sups[0].Held != 5 || sups[0].Lacking != 5 || sups[0].Had != 9 {
		t.Fatalf("holds %+v", sups)
	}
	evs := e.events(t, audit.Filter{Action: "lease.expire"})
	var corroborated bool
	for _, ev := range evs {
		if ev.Target == dead.String() && strings.Contains(ev.Reason, "siblings are heard") {
			corroborated = true
		}
	}
	if !corroborated {
		t.Errorf("the corroborated expiry's audit does not say why: %+v", evs)
	}
	// The team's operator may release their own service.
	if _, err := e.reg.ConfirmLeaseExpiry(ctx, olga, webScope, "not theirs"); !errors.Is(err, registry.ErrForbidden) {
		t.Fatalf("another team's operator: %v", err)
	}
	if c, err := e.reg.ConfirmLeaseExpiry(ctx, oscar, webScope, "deploy 4411 killed them"); err != nil || c.Released != 5 {
		t.Fatalf("confirm: %+v, %v", c, err)
	}
	if n := e.reap(t, rp); n != 5 {
		t.Fatalf("expired %d after the service confirmation, want 5", n)
	}
}

func TestConcurrentReapersExpireOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	for i := range 20 {
		if _, err := e.reg.Register(ctx, oscar, netip.Addr{}, "web", registry.Registration{Address: "10.1.0.1", Port: 1000 + i, Zone: "az1"}); err != nil {
			t.Fatal(err)
		}
	}
	// One instance each of 20 busy services would be the realistic
	// shape; here the thresholds are opened so every lease may go.
	e.clock.Advance(41 * time.Second)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
	)
	for range 4 {
		rp := e.reaper(t, registry.ReaperConfig{RegionThreshold: 1, ZoneThreshold: 1, ServiceThreshold: 1})
		wg.Go(func() {
			n, err := rp.RunOnce(ctx)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	if total != 20 {
		t.Fatalf("expired %d, want 20", total)
	}
	if n := len(e.events(t, audit.Filter{Action: "lease.expire"})); n != 20 {
		t.Fatalf("lease.expire events = %d, want 20", n)
	}
}

func TestReadAuthorisationAndPaging(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	for _, n := range []string{"a1", "a2", "a3"} {
		e.mustService(t, n, "search")
	}
	_, err := e.reg.ListServices(ctx, webWL, registry.ServiceFilter{}, registry.Page{})
	wantKind(t, err, registry.ErrForbidden)
	_, err = e.reg.GetService(ctx, webWL, "api")
	wantKind(t, err, registry.ErrForbidden)
	if _, err := e.reg.GetService(ctx, webWL, "web"); err != nil {
		t.Fatalf("a workload reads its own service: %v", err)
	}
	var names []string
	after := ""
	for {
		page, err := e.reg.ListServices(ctx, vera, registry.ServiceFilter{}, registry.Page{After: after, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page {
			names = append(names, s.Name)
		}
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].Name
	}
	if diff := cmp.Diff([]string{"a1", "a2", "a3", "api", "web"}, names); diff != "" {
		t.Fatalf("paged names (-want +got):\n%s", diff)
	}
	owned, _ := e.reg.ListServices(ctx, vera, registry.ServiceFilter{Owner: "payments"}, registry.Page{})
	if len(owned) != 1 || owned[0].Name != "web" {
		t.Fatalf("owner filter: %+v", owned)
	}
}

func TestReaperWorkerStopsCleanly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rp, err := registry.NewReaper(registry.ReaperConfig{Registry: e.reg, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rp.Stop() // before Start: no-op
	inst, err := e.reg.Register(context.Background(), webWL, loopback, "web", registry.Registration{Address: "127.0.0.1", Port: 9000, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rp.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// After the start-up grace and the expiry delay.
	e.clock.Advance(time.Minute)
	wait.For(t, 10*time.Second, "the reaper expiring the instance", func() bool {
		got, _ := e.reg.GetInstance(context.Background(), admin, inst.ID)
		return got.State == registry.StateExpired
	})
	rp.Stop()
	rp.Stop()
}

func TestProberAssignments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	inst, err := e.reg.Register(ctx, webWL, loopback, "web", registry.Registration{Address: "127.0.0.1", Port: 9000, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.reg.PutProberAssignments(ctx, oscar, "prober-az1", registry.ProberAssignments{Services: []string{"web"}})
	wantKind(t, err, registry.ErrForbidden)
	_, err = e.reg.PutProberAssignments(ctx, admin, "prober-az1", registry.ProberAssignments{Services: []string{"web", "ghost"}})
	re := wantKind(t, err, registry.ErrInvalid)
	if len(re.Fields) != 1 || re.Fields[0].Field != "services[0]" { // sorted: ghost, web
		t.Fatalf("fields %+v", re.Fields)
	}
	got, err := e.reg.PutProberAssignments(ctx, admin, "prober-az1", registry.ProberAssignments{Services: []string{"web", "web"}, Instances: []uuid.UUID{inst.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(registry.ProberAssignments{Prober: "prober-az1", Services: []string{"web"}, Instances: []uuid.UUID{inst.ID}}, got); diff != "" {
		t.Fatalf("assignments (-want +got):\n%s", diff)
	}
	self := identity.Principal{Kind: identity.KindProber, Subject: "prober-az1"}
	if read, err := e.reg.GetProberAssignments(ctx, self, "prober-az1"); err != nil || len(read.Services) != 1 {
		t.Fatalf("prober reads its own: %+v %v", read, err)
	}
	_, err = e.reg.GetProberAssignments(ctx, self, "prober-az2")
	wantKind(t, err, registry.ErrForbidden)
	// Replacing clears what is not listed any more.
	if _, err := e.reg.PutProberAssignments(ctx, admin, "prober-az1", registry.ProberAssignments{Services: []string{"api"}}); err != nil {
		t.Fatal(err)
	}
	all, err := e.reg.AllProberAssignments(ctx)
	if err != nil || len(all) != 1 || len(all[0].Instances) != 0 || all[0].Services[0] != "api" {
		t.Fatalf("all = %+v, %v", all, err)
	}
	evs := e.events(t, audit.Filter{Action: "prober.assign"})
	if len(evs) != 4 || evs[0].Outcome != audit.Refused || evs[1].Outcome != audit.Refused || evs[3].Outcome != audit.Accepted {
		t.Fatalf("prober.assign audit: %+v", evs)
	}
}

func TestGrantsAndResolution(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.mustService(t, "checkout", "payments")
	checkoutWL := identity.Principal{Kind: identity.KindWorkload, Subject: "c-1", Service: "checkout"}
	prober := identity.Principal{Kind: identity.KindProber, Subject: "prober-az1", Service: "web"}

	for _, p := range []identity.Principal{apiWL, checkoutWL, prober} {
		err := e.reg.MayResolve(ctx, p, "web")
		if re := wantKind(t, err, registry.ErrForbidden); !strings.Contains(re.Detail, "not granted") {
			t.Errorf("%s: detail %q", p, re.Detail)
		}
	}
	for _, p := range []identity.Principal{webWL, vera, admin} {
		if err := e.reg.MayResolve(ctx, p, "web"); err != nil {
			t.Errorf("%s resolving web: %v", p, err)
		}
	}
	// An ungranted caller cannot tell a missing service from a refused one.
	err := e.reg.MayResolve(ctx, apiWL, "no-such-service")
	wantKind(t, err, registry.ErrForbidden)

	_, err = e.reg.PutGrants(ctx, olga, "web", []string{"api"})
	wantKind(t, err, registry.ErrForbidden)
	_, err = e.reg.PutGrants(ctx, oscar, "web", []string{"api", "ghost", "Bad!"})
	re := wantKind(t, err, registry.ErrInvalid)
	if len(re.Fields) != 2 {
		t.Fatalf("fields %+v", re.Fields)
	}
	g, err := e.reg.PutGrants(ctx, oscar, "web", []string{"checkout", "api", "api"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"api", "checkout"}, g.Callers); diff != "" {
		t.Fatalf("callers (-want +got):\n%s", diff)
	}
	for _, p := range []identity.Principal{apiWL, checkoutWL} {
		if err := e.reg.MayResolve(ctx, p, "web"); err != nil {
			t.Errorf("%s after the grant: %v", p, err)
		}
	}
	// Revoking by replacing the list.
	if _, err := e.reg.PutGrants(ctx, oscar, "web", nil); err != nil {
		t.Fatal(err)
	}
	wantKind(t, e.reg.MayResolve(ctx, apiWL, "web"), registry.ErrForbidden)
	evs := e.events(t, audit.Filter{Action: "grants.put"})
	if len(evs) != 4 || evs[0].Outcome != audit.Refused || evs[2].Outcome != audit.Accepted {
		t.Fatalf("grants audit: %+v", evs)
	}
}

// recordingFollower remembers the registrations it was told of.
type recordingFollower struct{ told [][]registry.Instance }

func (f *recordingFollower) InstancesRegistered(_ context.Context, ins []registry.Instance) {
	f.told = append(f.told, ins)
}
func (f *recordingFollower) ProberAssigned(registry.ProberAssignments) {}

// TestRegisteredIsToldOfEachRegistration: the registry's follower sees what each
// committed registration changed (the instances it replaced, then the new
// one) and nothing of refused registrations; InstancesByID and
// ServiceContractsNamed answer for the ids and names they are given.
func TestRegisteredIsToldOfEachRegistration(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	reg, err := registry.New(registry.Config{Pool: e.pool, Region: "eu-west-1", Now: e.clock.Now, LeaseClock: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	f := &recordingFollower{}
	reg.Follow(f)
	ctx := context.Background()
	at := registry.Registration{Address: "127.0.0.1", Port: 9000, Zone: "az1"}
	first, err := reg.Register(ctx, webWL, loopback, "web", at)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Register(ctx, apiWL, loopback, "web", at); err == nil {
		t.Fatal("api registered into web")
	}
	e.clock.Advance(time.Second)
	second, err := reg.Register(ctx, webWL, loopback, "web", at)
	if err != nil {
		t.Fatal(err)
	}
	ended := first
	ended.State, ended.UpdatedAt, ended.EndedAt = registry.StateReplaced, second.CreatedAt, &second.CreatedAt
	want := [][]registry.Instance{{first}, {ended, second}}
	if d := cmp.Diff(want, f.told, cmpopts.IgnoreUnexported(registry.Instance{})); d != "" {
		t.Fatalf("told (-want +got):\n%s", d)
	}

	// Through a registry without the hook (another replica, say) nothing
	// is told, and the lookups read what it wrote.
	third, err := e.reg.Register(ctx, admin, netip.Addr{}, "api", registry.Registration{Address: "10.0.0.3", Port: 80, Zone: "az2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.told) != 2 {
		t.Fatalf("told of a registration through another registry: %+v", f.told[2:])
	}
	got, err := reg.InstancesByID(ctx, []uuid.UUID{first.ID, third.ID, uuid.New()})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b registry.Instance) int { return strings.Compare(a.ID.String(), b.ID.String()) })
	if d := cmp.Diff([]registry.Instance{ended, third}, got, cmpopts.IgnoreUnexported(registry.Instance{})); d != "" {
		t.Fatalf("InstancesByID (-want +got):\n%s", d)
	}
	scs, err := reg.ServiceContractsNamed(ctx, []string{"api", "nope"})
	if err != nil {
		t.Fatal(err)
	}
	if len(scs) != 1 || scs[0].Service.Name != "api" || !scs[0].Service.Has(registry.CapPassive) || scs[0].Contract.Weights[registry.CapPassive] != 1 {
		t.Fatalf("ServiceContractsNamed: %+v", scs)
	}
}

// TestTwoReplicasReconcileOneSource: every replica reconciles every
// source, so two apply the same pass at once. They apply one at a time
// (an advisory lock per source): both succeed, each instance is created
// and audited once, and neither pass fails on the other's rows. Without
// the lock both read "absent" and the second insert failed its pass.
func TestTwoReplicasReconcileOneSource(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	other, err := registry.New(registry.Config{Pool: e.pool, Region: "eu-west-1", Now: e.clock.Now, LeaseClock: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	const source, rounds, per = "snapshot/fleet", 10, 20
	ctx := context.Background()
	created := 0
	for round := range rounds {
		var ch registry.ReconcileChange
		for i := range per {
			key := fmt.Sprintf("i-%d-%d", round, i)
			ch.Create = append(ch.Create, registry.Instance{ID: registry.ReconciledID(source, "web", key), Service: "web",
				Address: fmt.Sprintf("10.9.%d.%d", round, i+1), Port: 8080, Zone: "az1"})
		}
		start := make(chan struct{})
		results := make(chan registry.ReconcileResult, 2)
		errs := make(chan error, 2)
		for _, r := range []*registry.Registry{e.reg, other} {
			go func() {
				<-start
				res, err := r.ApplyReconcile(ctx, source, ch)
				results <- res
				errs <- err
			}()
		}
		close(start)
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: a replica's pass failed: %v", round, err)
			}
			created += len((<-results).Created)
		}
	}
	if created != rounds*per {
		t.Fatalf("created %d across both replicas, want each of %d once", created, rounds*per)
	}
	ins, err := e.reg.ReconciledInstances(ctx, source)
	if err != nil || len(ins) != rounds*per {
		t.Fatalf("%d reconciled instances (%v), want %d", len(ins), err, rounds*per)
	}
	if n := len(e.events(t, audit.Filter{Action: "instance.reconcile.add"})); n != rounds*per {
		t.Fatalf("%d instance.reconcile.add audit events, want %d", n, rounds*per)
	}
}

// TestSealedIdentityKeepsARepointedRow (issue 25): the identity muster
// sealed is kept beside an instance row, so a row re-pointed by hand is
// known where muster put it; the migration fills it for live rows from
// before it, and what it fills verifies. Re-pointed together with the
// kept identity, the row verifies nowhere.
func TestSealedIdentityKeepsARepointedRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.New(registry.Config{Pool: e.pool, Region: "eu-west-1", Now: e.clock.Now, LeaseClock: e.clock.Now, Sealer: audit.NewKeySigner(priv)})
	if err != nil {
		t.Fatal(err)
	}
	in, err := reg.Register(ctx, admin, netip.Addr{}, "web", registry.Registration{Address: "10.0.0.1", Port: 8080, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	read := func() registry.Instance {
		t.Helper()
		list, err := reg.ListInstances(ctx, admin, "web", registry.InstanceFilter{}, registry.Page{})
		if err != nil || len(list) != 1 {
			t.Fatalf("list: %+v %v", list, err)
		}
		return list[0]
	}
	// As a row from before the migration: no kept identity; the
	// migration's fill gives it one.
	up, err := fs.ReadFile(migrations.FS, "000019_sealed_identity.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	fill := string(up)[strings.Index(string(up), "UPDATE instances"):]
	if _, err := e.pool.Exec(ctx, `UPDATE instances SET sealed_identity = NULL`); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.SealedIdentity(read()); err == nil {
		t.Fatal("a row without a kept identity was recovered")
	}
	if _, err := e.pool.Exec(ctx, fill); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE instances SET address = '203.0.113.7', zone = 'az9' WHERE id = $1`, in.ID); err != nil {
		t.Fatal(err)
	}
	row := read()
	if err := reg.VerifyIdentity(row); err == nil {
		t.Fatal("a re-pointed row verifies")
	}
	got, err := reg.SealedIdentity(row)
	if err != nil || got.Address != "10.0.0.1" || got.Zone != "az1" || got.Port != 8080 || got.Service != "web" || !got.CreatedAt.Equal(in.CreatedAt) {
		t.Fatalf("the identity muster sealed: %+v %v", got, err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE instances SET sealed_identity = jsonb_set(sealed_identity, '{address}', '"203.0.113.7"') WHERE id = $1`, in.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.SealedIdentity(read()); err == nil {
		t.Fatal("a kept identity re-pointed by hand verifies")
	}
}

// TestOnlyTheOwnerExpires (issue 27): a lapsed lease is decided by its
// service's owner alone. A reaper that does not own web neither expires
// nor holds web's lapsed leases (its owner, hearing other evidence, may
// decide otherwise); it expires those of the services it owns.
func TestOnlyTheOwnerExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustService(t, "big", "payments")
	web := e.register(t, "web", 2, 3000)
	big := e.register(t, "big", 2, 4000)
	// Thresholds opened: the test is about who decides, not how many.
	rp := e.reaper(t, registry.ReaperConfig{RegionThreshold: 1, ZoneThreshold: 1, ServiceThreshold: 1,
		Fence: newFence(t, &fakeTenures{owns: func(service string) bool { return service == "big" }})})
	e.clock.Advance(time.Minute)
	if n := e.reap(t, rp); n != 2 {
		t.Fatalf("expired %d, want big's 2", n)
	}
	if got := e.states(t, web); got[registry.StateActive] != 2 {
		t.Fatalf("web, owned elsewhere: %v; want both active", got)
	}
	if got := e.states(t, big); got[registry.StateExpired] != 2 {
		t.Fatalf("big: %v; want both expired", got)
	}
	if h := rp.Holds(); len(h) != 0 {
		t.Fatalf("holds %+v: a non-owner holds nothing either", h)
	}
}

// fakeTenures stands in for the ownership manager: owns says what this
// replica believes it owns, deposed whether the database still agrees.
type fakeTenures struct {
	owns    func(key string) bool
	deposed atomic.Bool
	checked atomic.Int64
}

func (f *fakeTenures) Owns(key string) (uint64, bool) { return 7, f.owns(key) }
func (f *fakeTenures) OwnedElsewhere(key string) bool { return !f.owns(key) }
func (f *fakeTenures) Shards() int                    { return 64 }
func (f *fakeTenures) Fence(_ context.Context, _ *db.Queries, shard int, epoch uint64) error {
	f.checked.Add(1)
	if f.deposed.Load() {
		return fmt.Errorf("fence shard %d at epoch %d: %w", shard, epoch, fence.ErrNotOwner)
	}
	return nil
}

func newFence(t *testing.T, o fence.Ownership) *fence.Fence {
	t.Helper()
	f, err := fence.New(o, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestADeposedOwnerExpiresNothing: the reaper decides as web's owner,
// but by the time the expiry reaches the database the tenure it decided
// under has ended (a pause outlived it). Nothing is expired, no audit row
// is written, and the sweep does not fail (it is not the database being
// away): the new owner decides. Once the tenure holds again, the same
// leases expire.
func TestADeposedOwnerExpiresNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	web := e.register(t, "web", 2, 3000)
	tenures := &fakeTenures{owns: func(string) bool { return true }}
	tenures.deposed.Store(true)
	rp := e.reaper(t, registry.ReaperConfig{RegionThreshold: 1, ZoneThreshold: 1, ServiceThreshold: 1, Fence: newFence(t, tenures)})
	e.clock.Advance(time.Minute)
	if n := e.reap(t, rp); n != 0 {
		t.Fatalf("a deposed owner expired %d leases", n)
	}
	if tenures.checked.Load() != 2 {
		t.Fatalf("fence checked %d times, want once per expiry (2)", tenures.checked.Load())
	}
	if got := e.states(t, web); got[registry.StateActive] != 2 {
		t.Fatalf("web after a deposed owner's sweep: %v; want both active", got)
	}
	if evs := e.events(t, audit.Filter{Action: "lease.expire"}); len(evs) != 0 {
		t.Fatalf("a deposed owner audited %d expiries", len(evs))
	}
	tenures.deposed.Store(false)
	if n := e.reap(t, rp); n != 2 {
		t.Fatalf("the owner expired %d, want 2", n)
	}
	if evs := e.events(t, audit.Filter{Action: "lease.expire"}); len(evs) != 2 {
		t.Fatalf("%d expiries audited, want 2", len(evs))
	}
}

// sortedIDs returns ids in the order the registry lists them.
func sortedIDs(ids ...uuid.UUID) []uuid.UUID {
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })
	return ids
}
