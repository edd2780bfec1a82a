package webui_test

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/federation"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/routingcontrol"
	"github.com/musterhq/muster/internal/testclock"
	"github.com/musterhq/muster/internal/webui"
)

// TestHoldsPage (issue 26): the removal holds page lists the lease gate's
// region hold with its numbers; a viewer sees no confirmation form and a
// forged post is refused (403, audited); a team operator's confirmation
// of the region is refused with the reason on the page (audited); an
// admin's is accepted, and the reaper then expires the held leases.
func TestHoldsPage(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	st.Seed(t)
	st.WaitReady(t)
	ctx := t.Context()
	var ins []registry.Instance
	for i := range 20 {
		in, err := st.Registry.Register(ctx, uiAdmin, netip.Addr{}, "web", registry.Registration{
			Address: fmt.Sprintf("10.8.0.%d", i+1), Port: 8080, Zone: []string{"az1", "az2"}[i%2]})
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, in)
	}
	// Four of twenty stop renewing: above the region's 15%.
	for range 6 {
		st.Clock.Advance(10 * time.Second)
		for _, in := range ins[4:] {
			if _, err := st.Registry.Renew(ctx, uiAdmin, in.ID); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := st.Reaper.RunOnce(ctx); err != nil || n != 0 {
			t.Fatalf("reaper: expired %d, %v", n, err)
		}
	}

	vera := newBrowser(t, st)
	vera.signIn("vera")
	p := vera.get("/ui/holds")
	if p.status != http.StatusOK || !strings.Contains(p.body, `data-gate="lease-expiry" data-scope="region"`) ||
		!strings.Contains(p.body, "4 of 20 would go at once (20%, above 15%)") {
		t.Fatalf("holds page for a viewer: %d\n%s", p.status, p.body)
	}
	if strings.Contains(p.body, "Confirm removal") {
		t.Error("a viewer is offered the confirmation form")
	}
	if !strings.Contains(p.body, `href="/ui/holds" aria-current="page"`) {
		t.Error("the nav does not mark Holds as the current page")
	}
	form := url.Values{"gate": {"lease-expiry"}, "scope": {"region"}, "reason": {"rack 7 is gone"}}
	if res := vera.do("POST", "/ui/holds/confirm", form, sameOrigin); res.status != http.StatusForbidden {
		t.Fatalf("a viewer's forged confirmation: %d\n%s", res.status, res.body)
	}

	oscar := newBrowser(t, st)
	oscar.signIn("oscar")
	if p := oscar.get("/ui/holds"); !strings.Contains(p.body, "Confirm removal") {
		t.Fatalf("an operator is not offered the confirmation form:\n%s", p.body)
	}
	res := oscar.do("POST", "/ui/holds/confirm", form, sameOrigin)
	if res.status != http.StatusForbidden || !strings.Contains(res.body, "spans teams and needs an admin") {
		t.Fatalf("a team operator confirms the region: %d\n%s", res.status, res.body)
	}
	if n, _ := st.Reaper.RunOnce(ctx); n != 0 {
		t.Fatalf("refused confirmations released %d", n)
	}

	alice := newBrowser(t, st)
	alice.signIn("alice")
	res = alice.do("POST", "/ui/holds/confirm", form, sameOrigin)
	if res.status != http.StatusSeeOther || res.location != "/ui/holds" {
		t.Fatalf("an admin confirms: %d %q\n%s", res.status, res.location, res.body)
	}
	if p := alice.get("/ui/holds"); !strings.Contains(p.body, "Confirmed: the removals lease-expiry holds in region may go ahead.") {
		t.Fatalf("after the confirmation the page does not say so:\n%s", p.body)
	}
	if n, err := st.Reaper.RunOnce(ctx); err != nil || n != 4 {
		t.Fatalf("after the confirmation: expired %d, %v; want 4", n, err)
	}
	if p := alice.get("/ui/holds"); !strings.Contains(p.body, `id="no-holds"`) {
		t.Fatalf("holds after the release:\n%s", p.body)
	}
	var refused, accepted int
	for _, e := range auditEvents(t, st, audit.Filter{Action: "lease.expiry.confirm"}) {
		switch e.Outcome {
		case audit.Refused:
			refused++
		case audit.Accepted:
			accepted++
		}
	}
	forged := auditEvents(t, st, audit.Filter{Action: "removal.confirm", Outcome: audit.Refused})
	if refused != 1 || accepted != 1 || len(forged) != 1 {
		t.Fatalf("audited: %d refused and %d accepted confirmations, %d refused forms; want 1, 1, 1", refused, accepted, len(forged))
	}
}

// TestReplicasPage (issue 27): the replicas page shows the one replica
// holding all 64 shards and lists its tenures.
func TestReplicasPage(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	if err := st.App.Ownership.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	vera := newBrowser(t, st)
	vera.signIn("vera")
	p := vera.get("/ui/replicas")
	if p.status != http.StatusOK || !strings.Contains(p.body, `data-replica="apptest"`) || !strings.Contains(p.body, "(this one)") ||
		!strings.Contains(p.body, `data-shard="63"`) || strings.Contains(p.body, `id="unowned"`) {
		t.Fatalf("replicas page: %d\n%s", p.status, p.body)
	}
	// Epochs left, and the relay: apptest has the region's signing key, so
	// the replica follows its peers (none here).
	if !strings.Contains(p.body, `id="epochs-left"`) || strings.Contains(p.body, `id="no-relay"`) {
		t.Errorf("replicas page without epochs left, or claiming no relay:\n%s", p.body)
	}
	if !strings.Contains(p.body, `href="/ui/replicas" aria-current="page"`) {
		t.Error("the nav does not mark Replicas as the current page")
	}
}

// TestRegionsPage (issue 29): the regions page names this region, each
// peer region followed with its link, age and staleness, and the
// routing controls read with each region's state. The aggregate is a
// real federation.Aggregate (no peer reached for a minute of its
// injected clock, so b is stale) and the controls a real routingcontrol.Controls reading a
// file.
func TestRegionsPage(t *testing.T) {
	t.Parallel()
	clk := testclock.New(time.Now())
	agg := federation.NewAggregate([]federation.PeerConfig{{Name: "b", URLs: []string{"https://muster.b.example"}}}, 30*time.Second, clk.Now)
	clk.Advance(time.Minute) // b never reached for a minute: stale
	file := filepath.Join(t.TempDir(), "routing.json")
	if err := os.WriteFile(file, []byte(`{"regions": {"b": "off", "local": "on"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := routingcontrol.ParseSource("file:"+file, "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	controls, err := routingcontrol.New(routingcontrol.Config{Source: src, Regions: []string{"b", "local"}})
	if err != nil {
		t.Fatal(err)
	}
	controls.RunOnce(t.Context())
	st := apptest.New(t, apptest.Options{UI: true, UIConfig: func(c *webui.Config) {
		c.PeerRegions, c.PeerStaleAfter, c.RoutingControls = agg, 30*time.Second, controls
	}})
	vera := newBrowser(t, st)
	vera.signIn("vera")
	p := vera.get("/ui/regions")
	if p.status != http.StatusOK || !strings.Contains(p.body, `id="this-region">local<`) || !strings.Contains(p.body, `data-region="b"`) ||
		!strings.Contains(p.body, "https://muster.b.example") || !strings.Contains(p.body, `class="stale"`) {
		t.Fatalf("regions page: %d\n%s", p.status, p.body)
	}
	if !strings.Contains(p.body, `data-control="b"`) || !strings.Contains(p.body, `<td class="control">off</td>`) {
		t.Errorf("regions page without b's routing control off:\n%s", p.body)
	}
	if !strings.Contains(p.body, `href="/ui/regions" aria-current="page"`) {
		t.Error("the nav does not mark Regions as the current page")
	}
	// Without peers or controls the page says so.
	plain := newUIStack(t)
	v2 := newBrowser(t, plain)
	v2.signIn("vera")
	if p := v2.get("/ui/regions"); p.status != http.StatusOK || !strings.Contains(p.body, `id="no-peers"`) || !strings.Contains(p.body, `id="no-controls"`) {
		t.Fatalf("regions page without peers: %d\n%s", p.status, p.body)
	}
}
