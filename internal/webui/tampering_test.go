package webui_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/registry"
)

// TestOverviewNamesRowsWrittenOutsideMuster: an override inserted into the
// table by hand is not applied, and the overview's alarm banner says so
// (override_unsealed), naming the override and the actor the row claims.
func TestOverviewNamesRowsWrittenOutsideMuster(t *testing.T) {
	t.Parallel()
	st := newUIStack(t)
	st.Seed(t)
	ctx := context.Background()
	in, err := st.Registry.Register(ctx, adminP, netip.Addr{}, "web", registry.Registration{Address: "10.0.0.1", Port: 8080, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	forged := uuid.Must(uuid.NewV7())
	if _, err := st.Pool.Exec(ctx, `INSERT INTO overrides (id, instance_id, service, zone, action, state, actor, justification, created_at, expires_at)
		VALUES ($1, $2, 'web', 'az1', 'mark_ineligible', 'active', 'operator:oscar', 'looks legitimate enough', $3, $4)`,
		forged, in.ID, st.Clock.Now(), st.Clock.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := st.App.InForce.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, st)
	p := b.signIn("vera")
	for _, want := range []string{"override_unsealed", forged.String(), "in the name of operator:oscar", "the table was written outside muster"} {
		if !strings.Contains(p.body, want) {
			t.Errorf("the overview's alarms do not say %q", want)
		}
	}
	if strings.Contains(p.body, "No open alarms") {
		t.Error("the overview says no alarms are open")
	}
}
