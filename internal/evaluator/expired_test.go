package evaluator_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/uuid"

	st "github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/registry"
)

// TestLeaseExpiryCorroboration: health evidence heard by this process
// corroborates a lapsed lease when the instance fails on a class, or is
// silent on every class while its siblings are heard; an instance whose
// whole service is silent (muster deaf, or nothing reports) is not.
func TestLeaseExpiryCorroboration(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	p1 := f.Token(t, prober1)
	f.post(t, p1, report(f.web[0], "probe", "success"), report(f.web[1], "probe", "hard_failure"))
	f.Evaluator.EvaluateNow()
	ids := func(s string) uuid.UUID { return uuid.MustParse(s) }

	if why, ok := f.Evaluator.LeaseExpiryCorroborated(ids(f.web[0])); ok {
		t.Errorf("a heard, healthy instance is corroborated: %s", why)
	}
	if _, ok := f.Evaluator.LeaseExpiryCorroborated(ids(f.web[1])); !ok {
		t.Error("an instance ineligible by a hard failure is not corroborated")
	}
	if why, ok := f.Evaluator.LeaseExpiryCorroborated(ids(f.web[2])); !ok || why == "" {
		t.Error("an instance silent while its siblings are heard is not corroborated")
	}
	if why, ok := f.Evaluator.LeaseExpiryCorroborated(ids(f.api[0])); ok {
		t.Errorf("an instance of a silent service is corroborated: %s", why)
	}
}

// TestExpiredInstancesGoThroughTheGuard: two of cart's three instances
// in az1 expire at once: the zone would keep 1 of 3 (below 0.5), so the
// snapshot keeps listing them as lease-expired and the view keeps them;
// once replacements arrive and the zone holds its fraction without them,
// they are forgotten.
func TestExpiredInstancesGoThroughTheGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, st.Options{})
	if _, _, err := f.Registry.PutService(ctx, admin, "cart", registry.ServiceSpec{Owner: "payments", Capabilities: []registry.Capability{registry.CapPassive}}); err != nil {
		t.Fatal(err)
	}
	register := func(n int, prefix string) []uuid.UUID {
		var out []uuid.UUID
		for i := range n {
			in, err := f.Registry.Register(ctx, admin, netip.Addr{}, "cart", registry.Registration{Address: fmt.Sprintf("%s.%d", prefix, i+1), Port: 8080, Zone: "az1"})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, in.ID)
		}
		return out
	}
	cart := register(3, "10.0.2")
	if err := f.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	rp, err := registry.NewReaper(registry.ReaperConfig{Registry: f.Registry, RegionThreshold: 1, ZoneThreshold: 1, ServiceThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.Clock.Advance(35 * time.Second)
	keep := []uuid.UUID{cart[2], uuid.MustParse(f.api[0])}
	for _, id := range f.web {
		keep = append(keep, uuid.MustParse(id))
	}
	for _, id := range keep {
		if _, err := f.Registry.Renew(ctx, admin, id); err != nil {
			t.Fatal(err)
		}
	}
	f.Clock.Advance(10 * time.Second)
	if n, err := rp.RunOnce(ctx); err != nil || n != 2 {
		t.Fatalf("expired %d, %v; want cart's first two", n, err)
	}
	if err := f.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	expired := func() map[uuid.UUID]bool {
		snap, ok := f.Evaluator.Snapshot("cart")
		if !ok {
			t.Fatal("no snapshot of cart")
		}
		out := map[uuid.UUID]bool{}
		for _, ep := range snap.Instances {
			if ep.LeaseExpired {
				out[ep.ID] = true
			}
		}
		return out
	}
	if got := expired(); len(got) != 2 || !got[cart[0]] || !got[cart[1]] {
		t.Fatalf("lease-expired instances listed %v, want cart's first two (the guard needs them)", got)
	}
	// Three replacements: 4 of 6 in rotation without the expired two.
	register(3, "10.0.3")
	if err := f.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	if got := expired(); len(got) != 0 {
		t.Fatalf("lease-expired instances still listed after the guard cleared: %v", got)
	}
}
