package evaluator_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	st "github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/registry"
)

// TestUnknownInstancesAreLookedUpWithinBounds (issue 12): ids a report
// names that the evaluator does not know are looked up in PostgreSQL, one
// query per batch for at most 100 of them; ids with no instance and ids
// of ended instances are refused as unknown_instance, each with its own
// reason, and remembered so that naming them again costs no lookup; ids
// that could not be looked up are refused as unverified_instance.
func TestUnknownInstancesAreLookedUpWithinBounds(t *testing.T) {
	t.Parallel()
	var up atomic.Bool
	up.Store(true)
	f := newFixture(t, st.Options{Evaluator: func(c *evaluator.Config) { c.DatabaseUp = up.Load }})
	ctx := context.Background()
	api := f.Token(t, st.API)

	// Registered and deregistered through another replica: this
	// evaluator never knew it.
	other, err := registry.New(registry.Config{Pool: f.Pool, Region: "local", Now: f.Clock.Now, LeaseClock: f.Clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := other.Register(ctx, admin, netip.Addr{}, "web", registry.Registration{Address: "10.0.0.9", Port: 8080, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Deregister(ctx, admin, gone.ID); err != nil {
		t.Fatal(err)
	}
	// Known, then deregistered and retired by a refresh.
	retired := uuid.MustParse(f.web[2])
	if _, err := f.Registry.Deregister(ctx, admin, retired); err != nil {
		t.Fatal(err)
	}
	if err := f.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	random := uuid.New()

	lookups := func() float64 { return metric(t, f, "muster_evaluator_instance_lookups_total", "result", "ok") }
	ids := func(result string) float64 {
		return metric(t, f, "muster_evaluator_instance_lookup_ids_total", "result", result)
	}
	batch := []string{
		report(random.String(), "passive", "success"),
		report(gone.ID.String(), "passive", "success"),
		report(retired.String(), "passive", "success"),
		report(f.api[0], "passive", "success"), // api's own: accepted
	}
	check := func(res evaluator.Result) {
		t.Helper()
		want := map[int]string{
			0: "no instance " + random.String(),
			1: fmt.Sprintf("instance %s ended (deregistered)", gone.ID),
			2: fmt.Sprintf("instance %s ended (deregistered)", retired),
		}
		if res.Accepted != 1 || len(res.Refused) != 3 {
			t.Fatalf("result %+v", res)
		}
		for _, r := range res.Refused {
			if r.Code != "unknown_instance" || !strings.HasPrefix(r.Reason, want[r.Index]) {
				t.Errorf("item %d refused as %s (%s), want unknown_instance (%s…)", r.Index, r.Code, r.Reason, want[r.Index])
			}
		}
	}
	check(f.post(t, api, batch...))
	// One query for the two ids it had to ask about; the retired one was
	// answered from memory.
	if n := lookups(); n != 1 {
		t.Fatalf("lookups after the first batch: %v, want 1", n)
	}
	if m, e, c := ids("missing"), ids("ended"), ids("cached"); m != 1 || e != 1 || c != 1 {
		t.Fatalf("ids missing %v, ended %v, cached %v; want 1 each", m, e, c)
	}
	// The same batch again costs no lookup, even with the database away.
	up.Store(false)
	check(f.post(t, api, batch...))
	if n, c := lookups(), ids("cached"); n != 1 || c != 4 {
		t.Fatalf("after the batch again: %v lookups (want 1), %v cached (want 4)", n, c)
	}
	// An id not remembered cannot be looked up while the database is away.
	res := f.post(t, api, report(uuid.NewString(), "passive", "success"))
	if len(res.Refused) != 1 || res.Refused[0].Code != "unverified_instance" || !strings.Contains(res.Refused[0].Reason, "database is unreachable") {
		t.Fatalf("unknown id with the database away: %+v", res)
	}
	if n := lookups(); n != 1 {
		t.Fatalf("lookups with the database away: %v, want 1", n)
	}
	up.Store(true)

	// A thousand made-up ids: one query for the first hundred, the rest
	// unchecked.
	many := make([]string, 1000)
	for i := range many {
		many[i] = report(uuid.NewString(), "passive", "success")
	}
	res = f.post(t, api, many...)
	codes := map[string]int{}
	for _, r := range res.Refused {
		codes[r.Code]++
	}
	if res.Accepted != 0 || codes["unknown_instance"] != 100 || codes["unverified_instance"] != 900 {
		t.Fatalf("a thousand made-up ids: accepted %d, refusals by code %v", res.Accepted, codes)
	}
	if n, m := lookups(), ids("missing"); n != 2 || m != 101 {
		t.Fatalf("after a thousand made-up ids: %v lookups (want 2), %v missing (want 101)", n, m)
	}

	// Items about instances it knows are decided before those it looks
	// up; the refusals are still listed in the batch's order.
	res = f.post(t, api,
		report(uuid.NewString(), "passive", "success"),
		report(f.api[0], "no-such-class", "success"),
		report(uuid.NewString(), "passive", "success"),
		report(f.api[0], "passive", "success"),
	)
	if res.Accepted != 1 || len(res.Refused) != 3 {
		t.Fatalf("a mixed batch: %+v", res)
	}
	for i, want := range []struct {
		index int
		code  string
	}{{0, "unknown_instance"}, {1, "invalid"}, {2, "unknown_instance"}} {
		if r := res.Refused[i]; r.Index != want.index || r.Code != want.code {
			t.Fatalf("refusal %d is item %d (%s), want item %d (%s): %+v", i, r.Index, r.Code, want.index, want.code, res.Refused)
		}
	}
}
