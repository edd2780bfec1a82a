package webui_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/browsertest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/registry"
)

func chromiumPath(t *testing.T) string                    { return browsertest.Chromium(t) }
func artifactDir(t *testing.T) string                     { return browsertest.Artifacts(t) }
func newChrome(t *testing.T, exec string) context.Context { return browsertest.New(t, exec) }

// run runs one read (text, location, a screenshot) with a deadline,
// failing the test on error; a read that met a node the page's live
// refresh replaced is tried again (browsertest.Read).
func run[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	return browsertest.Read(t, ctx, what, a)
}

// do runs steps with a deadline, failing the test on error; a step that
// failed on a stale node is tried again, the steps before it are not
// (browsertest.Do).
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	browsertest.Do(t, ctx, what, steps...)
}

// screenshot writes a full-page PNG of the tab to dir/name.png.
func screenshot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	png := run(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// seedEstate gives the overview something to show: two services, a few
// instances over two zones, one view published.
func seedEstate(t *testing.T, st *apptest.Stack) {
	t.Helper()
	st.Seed(t)
	admin := st.Token(t, apptest.Admin)
	var ids []string
	for i, zone := range []string{"az1", "az1", "az2"} {
		body := fmt.Sprintf(`{"address":"10.0.0.%d","port":8080,"zone":"%s"}`, i+1, zone)
		r := st.JSON(t, "POST", "/v1/services/web/instances", admin, body)
		if r.Status != http.StatusCreated {
			t.Fatalf("register: %d %s", r.Status, r.Body)
		}
		ids = append(ids, apptest.Decode[registry.Instance](t, r).ID.String())
	}
	st.Admit(t, ids...) // web probes: new instances are not capacity before their first success
	st.Publisher.ServicesChanged([]string{"web", "api"})
	st.Publisher.RunOnce()
	// Additions wait out the assembler's addition window; step past it.
	st.Clock.Advance(assembler.DefaultMaxAdditionWindow + time.Second)
	st.Publisher.RunOnce()
	if _, ok := st.Publisher.View("web"); !ok {
		t.Fatal("no view of web was published")
	}
}

// TestBrowserSignInEachRole drives Chromium through the real sign-in of
// each development user: the UI sends it to the dev issuer's sign-in page,
// the user is picked, and the code flow brings it back signed in. It sees
// the overview with its role, the audit page with its own sign-in, and
// signs out. Screenshots of each page are written as artifacts.
func TestBrowserSignInEachRole(t *testing.T) {
	chrome := chromiumPath(t)
	dir := artifactDir(t)
	st := apptest.New(t, apptest.Options{UI: true})
	seedEstate(t, st)

	for _, u := range devissuer.Users() {
		t.Run(u.Subject, func(t *testing.T) {
			ctx := newChrome(t, chrome)
			name := func(step string) string { return u.Subject + "-" + step }

			do(t, ctx, "open the UI", chromedp.Navigate(st.URL+"/ui/"), chromedp.WaitVisible(chromedp.ID("user-"+u.Subject)))
			loginURL := run(t, ctx, "location", chromedp.Location())
			screenshot(t, ctx, dir, name("1-dev-sign-in"))

			do(t, ctx, "sign in", chromedp.Click(chromedp.ID("user-"+u.Subject)), chromedp.WaitVisible(chromedp.ID("role")))
			role := run(t, ctx, "role", chromedp.Text(chromedp.ID("role")))
			who := run(t, ctx, "who", chromedp.Text(chromedp.ID("signed-in-as")))
			overview := run(t, ctx, "services", chromedp.Text(chromedp.ID("services")))
			screenshot(t, ctx, dir, name("2-overview"))

			do(t, ctx, "open the audit page", chromedp.Click(chromedp.CSS(`a[href="/ui/audit"]`)), chromedp.WaitVisible(chromedp.ID("chain")))
			auditBody := run(t, ctx, "audit", chromedp.Text(chromedp.CSS("main")))
			screenshot(t, ctx, dir, name("3-audit"))

			do(t, ctx, "sign out", chromedp.Click(chromedp.ID("logout")), chromedp.WaitVisible(chromedp.ID("message")))
			signedOut := run(t, ctx, "signed out", chromedp.Text(chromedp.CSS("main")))
			screenshot(t, ctx, dir, name("4-signed-out"))

			if !strings.Contains(loginURL, "/dev/issuer/login") {
				t.Errorf("the UI sent the browser to %s, want the dev sign-in page", loginURL)
			}
			if role != string(u.Role) || !strings.Contains(who, u.Subject) {
				t.Errorf("header shows %q with role %q, want %s with %s", who, role, u.Subject, u.Role)
			}
			if !strings.Contains(overview, "web") || !strings.Contains(overview, "api") || !strings.Contains(overview, "az1") {
				t.Errorf("overview table lacks the seeded services and zones:\n%s", overview)
			}
			if !strings.Contains(auditBody, "chain verified") || !strings.Contains(auditBody, "operator:"+u.Subject) || !strings.Contains(auditBody, "ui.sign_in") {
				t.Errorf("audit page lacks the chain status or this sign-in:\n%s", auditBody)
			}
			if !strings.Contains(signedOut, "You are signed out") {
				t.Errorf("after sign-out: %q", signedOut)
			}
			// Signed out for real: the UI sends the browser to sign in again.
			do(t, ctx, "reopen the UI", chromedp.Navigate(st.URL+"/ui/"), chromedp.WaitVisible(chromedp.ID("user-"+u.Subject)))
			again := run(t, ctx, "location", chromedp.Location())
			if !strings.Contains(again, "/dev/issuer/login") {
				t.Errorf("after sign-out the overview is at %s", again)
			}
		})
	}
}
