package reconcile_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/musterhq/muster/internal/browsertest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
)

// TestBrowserReconcilePage drives Chromium through the real sign-in to
// the reconciliation page: it lists the source, a startup failure (in
// the snapshot, never ready) and a leak (registered, unknown to every
// source), then the leak is fixed and the page follows.
func TestBrowserReconcilePage(t *testing.T) {
	chrome := browsertest.Chromium(t)
	dir := browsertest.Artifacts(t)
	st, _ := diffStack(t)
	ctx := browsertest.New(t, chrome)
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		browsertest.Do(t, ctx, what, steps...)
	}
	// The page refreshes in place, so a read may meet a replaced node:
	// browsertest.Read tries it again.
	text := func(id string) string {
		t.Helper()
		return browsertest.Read(t, ctx, "text of #"+id, chromedp.Text(chromedp.ID(id)))
	}
	shot := func(name string) {
		t.Helper()
		png := browsertest.Read(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
		if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	do("sign in and open the reconciliation page",
		chromedp.Navigate(st.URL+"/ui/reconcile"), chromedp.WaitVisible(chromedp.ID("user-vera")),
		chromedp.Click(chromedp.ID("user-vera")), chromedp.WaitVisible(chromedp.ID("diff")))
	sources, counts, diff := text("sources"), text("diff-counts"), text("diff")
	shot("reconcile-1-diff")
	if !strings.Contains(sources, "snapshot/fleet") || !strings.Contains(sources, "in step") {
		t.Errorf("sources table:\n%s", sources)
	}
	if !strings.Contains(counts, "missing 1") || !strings.Contains(counts, "leak 1") || !strings.Contains(counts, "mismatch 0") {
		t.Errorf("counts: %q", counts)
	}
	for _, want := range []string{"10.6.0.3:8080", "startup failure", "i-3", "10.6.9.9:8080", "registration leak"} {
		if !strings.Contains(diff, want) {
			t.Errorf("diff table lacks %q:\n%s", want, diff)
		}
	}

	// The leak deregisters itself (its own token vouches for its
	// address): the page no longer lists it.
	admin := identity.Principal{Kind: identity.KindOperator, Subject: "test", Role: identity.RoleAdmin}
	ins, err := st.Registry.ListInstances(t.Context(), admin, "web", registry.InstanceFilter{}, registry.Page{})
	if err != nil {
		t.Fatal(err)
	}
	var leakID string
	for _, in := range ins {
		if in.Address == "10.6.9.9" {
			leakID = in.ID.String()
		}
	}
	if leakID == "" {
		t.Fatalf("no leak instance among %+v", ins)
	}
	self := st.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: []string{"10.6.9.9"}})
	if r := st.Do(t, "DELETE", "/v1/instances/"+leakID, self, "", ""); r.Status >= 300 {
		t.Fatalf("deregister the leak: %d %s", r.Status, r.Body)
	}
	do("reload", chromedp.Navigate(st.URL+"/ui/reconcile"), chromedp.WaitVisible(chromedp.ID("diff")))
	counts, diff = text("diff-counts"), text("diff")
	shot("reconcile-2-leak-gone")
	if !strings.Contains(counts, "leak 0") || strings.Contains(diff, "10.6.9.9") || !strings.Contains(diff, "startup failure") {
		t.Errorf("after deregistering the leak: counts %q, diff:\n%s", counts, diff)
	}
}
