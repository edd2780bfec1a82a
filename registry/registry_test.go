package registry_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/audit"
	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/identity"
	"github.com/musterhq/muster/registry"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// clock is a settable clock for lease tests.
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
	clock *clock
	q     *db.Queries
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := dbtest.New(t)
	clk := &clock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	reg, err := registry.New(registry.Config{Pool: pool, Region: "eu-west-1", Now: clk.Now})
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

func wantKind(t *testing.T, err, kind error) *registry.Error {
	t.Helper()
	var re *registry.Error
	if !errors.As(err, &re) || !errors.Is(err, kind) {
		t.Fatalf("err = %v, want a *registry.Error of kind %v", err, kind)
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

func TestLeaseLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	inst, err := e.reg.Register(ctx, webWL, loopback, "web", registry.Registration{Address: "127.0.0.1", Port: 9000, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	expire := func() int {
		t.Helper()
		n, err := e.reg.ExpireLeases(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

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
	// At 30 s the lease is over even before the reaper runs: a late
	// renewal cannot resurrect it.
	lateClock := &clock{t: e.clock.Now().Add(100 * time.Millisecond)}
	late, err := registry.New(registry.Config{Pool: e.pool, Region: "eu-west-1", Now: lateClock.Now})
	if err != nil {
		t.Fatal(err)
	}
	_, err = late.Renew(ctx, webWL, inst.ID)
	wantKind(t, err, registry.ErrGone)
	// 30 s after: expired, exactly once, and audited.
	e.clock.Advance(100 * time.Millisecond)
	if n := expire(); n != 1 {
		t.Fatalf("expired %d instances 30 s after renewal, want 1", n)
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

	// Deregistration ends it; doing it twice changes nothing.
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
	rep, err := audit.Verify(ctx, e.q)
	if err != nil {
		t.Fatalf("audit chain after the lifecycle: %v", err)
	}
	if rep.Rows < 6 {
		t.Fatalf("audit rows = %d", rep.Rows)
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
	e.clock.Advance(31 * time.Second)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
	)
	for range 4 {
		wg.Go(func() {
			for {
				n, err := e.reg.ExpireLeases(ctx, 3)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				total += n
				mu.Unlock()
				if n == 0 {
					return
				}
			}
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
	e.clock.Advance(time.Minute)
	if err := rp.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := e.reg.GetInstance(context.Background(), admin, inst.ID)
		if got.State == registry.StateExpired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reaper did not expire the instance within 10 s")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline, not waiting for a condition
	}
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
