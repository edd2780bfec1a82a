package evaluator_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	st "github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/registry"
)

// TestZonePartitionExpiresNothing (issue 26): az1's prober and workloads
// lose their path to muster while az2 is heard, for four lease TTLs. The
// silence is muster's deafness to az1, not az1's death: no lease expires,
// and one removal_held alarm names the zone. Before, the sweep that raised
// prober_outage for az1's prober expired every az1 lease as "silent while
// its siblings are heard". When az1 is heard again the hold ends and
// nothing was lost.
func TestZonePartitionExpiresNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := st.New(t, st.Options{})
	s.Seed(t)
	s.WaitReady(t)
	if _, _, err := s.Registry.PutService(ctx, admin, "shop", registry.ServiceSpec{Owner: "payments", Capabilities: []registry.Capability{registry.CapProbe}}); err != nil {
		t.Fatal(err)
	}
	register := func(zone string, net int) []registry.Instance {
		var out []registry.Instance
		for i := range 6 {
			in, err := s.Registry.Register(ctx, admin, netip.Addr{}, "shop", registry.Registration{Address: fmt.Sprintf("10.9.%d.%d", net, i+1), Port: 8080, Zone: zone})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, in)
		}
		return out
	}
	az1, az2 := register("az1", 1), register("az2", 2)
	all := append(append([]registry.Instance(nil), az1...), az2...)
	ids := func(ins []registry.Instance) []uuid.UUID {
		var out []uuid.UUID
		for _, in := range ins {
			out = append(out, in.ID)
		}
		return out
	}
	for name, ins := range map[string][]registry.Instance{"prober-az1": az1, "prober-az2": az2} {
		if _, err := s.Registry.PutProberAssignments(ctx, admin, name, registry.ProberAssignments{Instances: ids(ins)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	p1, p2 := s.Token(t, prober1), s.Token(t, prober2)
	probe := func(tok string, ins []registry.Instance) {
		t.Helper()
		var items []string
		for _, in := range ins {
			items = append(items, report(in.ID.String(), "probe", "success"))
		}
		if r := s.JSON(t, "POST", "/v1/reports", tok, `{"reports":[`+strings.Join(items, ",")+`]}`); r.Status != http.StatusOK {
			t.Fatalf("reports: %d %s", r.Status, r.Body)
		}
	}
	renew := func(ins []registry.Instance) {
		t.Helper()
		for _, in := range ins {
			if _, err := s.Registry.Renew(ctx, admin, in.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	sweep := func(what string) {
		t.Helper()
		s.Evaluator.EvaluateNow()
		if n, err := s.Reaper.RunOnce(ctx); err != nil || n != 0 {
			t.Fatalf("%s: expired %d, %v; want none", what, n, err)
		}
	}
	// A healthy lease and more: both zones heard.
	for range 8 {
		s.Clock.Advance(5 * time.Second)
		probe(p1, az1)
		probe(p2, az2)
		renew(all)
		sweep("both zones heard")
	}
	// az1 cut off from muster for four TTLs: only az2 is heard.
	for i := range 24 {
		s.Clock.Advance(5 * time.Second)
		probe(p2, az2)
		renew(az2)
		sweep(fmt.Sprintf("%s into the partition", time.Duration(i+1)*5*time.Second))
	}
	var outage bool
	for _, a := range s.Evaluator.ProberAlarms() {
		outage = outage || a.Kind == evaluator.AlarmProberOutage && a.Prober == "prober-az1"
	}
	if !outage {
		t.Fatalf("no prober_outage for prober-az1: %+v (the partition did not happen)", s.Evaluator.ProberAlarms())
	}
	for _, in := range all {
		got, err := s.Registry.GetInstance(ctx, admin, in.ID)
		if err != nil || got.State != registry.StateActive {
			t.Fatalf("instance %s in %s after the partition: %+v %v; want active", in.ID, in.Zone, got.State, err)
		}
	}
	holds := s.Reaper.Holds()
	if len(holds) != 1 || holds[0].Scope != (disbelief.Scope{Kind: disbelief.Zone, Name: "az1"}) || holds[0].Held != 6 || !strings.Contains(holds[0].Partition, "az1") {
		t.Fatalf("holds %+v, want zone az1 holding its 6 leases as a partition", holds)
	}
	var held []assembler.Alarm
	for _, a := range st.Decode[struct{ Alarms []assembler.Alarm }](t, s.Do(t, "GET", "/v1/alarms", s.Token(t, st.Admin), "", "")).Alarms {
		if a.Kind == disbelief.AlarmRemovalHeld {
			held = append(held, a)
		}
	}
	if len(held) != 1 || held[0].Zone != "az1" || !strings.Contains(held[0].Detail, "zone az1") {
		t.Fatalf("removal_held alarms %+v, want one naming zone az1", held)
	}

	// az1 is heard again: the hold ends, nothing was lost.
	s.Clock.Advance(5 * time.Second)
	probe(p1, az1)
	probe(p2, az2)
	renew(all)
	sweep("az1 heard again")
	if h := s.Reaper.Holds(); len(h) != 0 {
		t.Fatalf("holds after the partition healed: %+v", h)
	}
}
