package registry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
)

// sameDecision compares the cache's answer with the registry's: both nil,
// or both a refusal of the same kind and detail.
func sameDecision(t *testing.T, what string, fromDB, fromCache error) {
	t.Helper()
	var a, b *refusal.Error
	switch {
	case fromDB == nil && fromCache == nil:
	case errors.As(fromDB, &a) && errors.As(fromCache, &b) && a.Kind == b.Kind && a.Detail == b.Detail:
	default:
		t.Errorf("%s: database says %v, the copy says %v", what, fromDB, fromCache)
	}
}

// TestAuthzCacheDecidesAsTheRegistry: over a table of principals and
// services (granted, not granted, missing), the in-memory copy gives the
// answers Registry.MayResolve and ServiceExists give, before and after
// grants change; its own writes show at once, other writers' after a
// reload; with the database gone the last copy keeps serving.
func TestAuthzCacheDecidesAsTheRegistry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.mustService(t, "checkout", "payments")
	metrics := prometheus.NewRegistry()
	c, err := registry.NewAuthzCache(registry.AuthzCacheConfig{Registry: e.reg, Now: e.clock.Now, Registerer: metrics})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MayResolve(apiWL, "web"); !errors.Is(err, registry.ErrNotLoaded) {
		t.Fatalf("before the first load: %v", err)
	}
	if _, err := c.ServiceExists("web"); !errors.Is(err, registry.ErrNotLoaded) {
		t.Fatalf("before the first load: %v", err)
	}
	if err := c.MayResolve(admin, "web"); err != nil {
		t.Fatalf("an estate reader needs no copy: %v", err)
	}
	if _, ok := c.Age(); ok {
		t.Fatal("an age before the first load")
	}
	if err := c.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}

	checkoutWL := identity.Principal{Kind: identity.KindWorkload, Subject: "c-1", Service: "checkout"}
	principals := []identity.Principal{
		admin, oscar, olga, vera, webWL, apiWL, checkoutWL,
		{Kind: identity.KindProber, Subject: "prober-az1", Service: "web"},
		{Kind: identity.KindTool, Subject: "tgsync", Role: identity.RoleViewer},
		{Kind: identity.KindTool, Subject: "nobody"},
		{Kind: identity.KindWorkload, Subject: "orphan"},
		{Kind: identity.KindOperator, Subject: "nora"},
	}
	services := []string{"web", "api", "checkout", "no-such-service"}
	compare := func(stage string) {
		t.Helper()
		for _, p := range principals {
			for _, svc := range services {
				what := fmt.Sprintf("%s: %s resolving %s", stage, p, svc)
				sameDecision(t, what, e.reg.MayResolve(ctx, p, svc), c.MayResolve(p, svc))
			}
		}
		for _, svc := range services {
			a, errA := e.reg.ServiceExists(ctx, svc)
			b, errB := c.ServiceExists(svc)
			if a != b || errA != nil || errB != nil {
				t.Errorf("%s: %s exists: database %v (%v), copy %v (%v)", stage, svc, a, errA, b, errB)
			}
		}
	}
	compare("no grants")

	// Writes through this registry show in the copy without a reload.
	if _, err := e.reg.PutGrants(ctx, oscar, "web", []string{"api", "checkout"}); err != nil {
		t.Fatal(err)
	}
	e.mustService(t, "ledger", "payments")
	services = append(services, "ledger")
	compare("granted, not reloaded")
	if _, err := e.reg.PutGrants(ctx, oscar, "web", []string{"checkout"}); err != nil {
		t.Fatal(err)
	}
	compare("revoked, not reloaded")

	// A write the registry did not make (another replica) shows after a
	// reload.
	if _, err := e.pool.Exec(ctx, "INSERT INTO service_grants (service, caller, granted_at, granted_by) VALUES ('checkout', 'api', now(), 'elsewhere')"); err != nil {
		t.Fatal(err)
	}
	if err := c.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	compare("another replica's grant, reloaded")
	if err := c.MayResolve(apiWL, "checkout"); err != nil {
		t.Fatalf("the reloaded grant: %v", err)
	}

	// The database goes away: the reload fails, the last copy serves, and
	// its age grows.
	e.clock.Advance(30 * time.Second)
	e.pool.Close()
	if err := c.RunOnce(ctx); err == nil {
		t.Fatal("a reload from a closed pool succeeded")
	}
	if err := c.MayResolve(apiWL, "checkout"); err != nil {
		t.Fatalf("the last copy: %v", err)
	}
	if err := c.MayResolve(apiWL, "web"); !errors.Is(err, registry.ErrForbidden) {
		t.Fatalf("the last copy refuses what it refused: %v", err)
	}
	if ok, err := c.ServiceExists("ledger"); !ok || err != nil {
		t.Fatalf("ledger in the last copy: %v %v", ok, err)
	}
	if age, ok := c.Age(); !ok || age != 30*time.Second {
		t.Fatalf("age %s %v, want 30s", age, ok)
	}
	if got := gaugeValue(t, metrics, "muster_authz_cache_age_seconds"); got != 30 {
		t.Fatalf("muster_authz_cache_age_seconds = %v, want 30", got)
	}
}

// TestAuthzCacheWorker: started, the worker loads the copy by itself.
func TestAuthzCacheWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c, err := registry.NewAuthzCache(registry.AuthzCacheConfig{Registry: e.reg, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.Stop() // before Start: a no-op
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	wait.For(t, 10*time.Second, "the worker loading the copy", func() bool {
		ok, err := c.ServiceExists("web")
		return ok && err == nil
	})
	c.Stop()
	c.Stop()
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
