package browsertest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// page serves one disclosure, #d, with a field in it. When swallow is
// set, the summary's first click is swallowed (preventDefault), as a
// click that missed because the layout shifted under it would be.
func page(t *testing.T, swallow bool) string {
	t.Helper()
	script := ""
	if swallow {
		script = `<script>var s = document.querySelector("#d > summary"), n = 0;
s.addEventListener("click", function (e) { if (n++ === 0) e.preventDefault(); });</script>`
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><html><body><details id="d"><summary>Deregister…</summary>` +
			`<form><input name="j"></form></details>` + script + `</body></html>`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func typed(t *testing.T, ctx context.Context) string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS("#d input")))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestVisibleIsNotOpen pins the Chromium behaviour OpenDetails exists
// for: a field in a closed disclosure passes chromedp's visibility check,
// and typing into it fails.
func TestVisibleIsNotOpen(t *testing.T) {
	ctx := New(t, Chromium(t))
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Steps(chromedp.Navigate(page(t, false)), chromedp.WaitVisible(chromedp.CSS("#d input")))); err != nil {
		t.Fatalf("a field in a closed disclosure: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.SendKeys(chromedp.CSS("#d input"), "x")); err == nil {
		t.Fatal("typing into a closed disclosure worked: OpenDetails may no longer be needed")
	}
}

func TestOpenDetails(t *testing.T) {
	chrome := Chromium(t)
	for _, tc := range []struct {
		name    string
		swallow bool
	}{{"the first click lands", false}, {"the first click misses", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := New(t, chrome)
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := chromedp.Run(ctx, chromedp.Steps(
				chromedp.Navigate(page(t, tc.swallow)),
				OpenDetails("#d"),
				// Already open: nothing is clicked, so it stays open.
				OpenDetails("#d"),
				chromedp.SendKeys(chromedp.CSS("#d input"), "CHG-7"),
			))
			if err != nil {
				t.Fatal(err)
			}
			if v := typed(t, ctx); v != "CHG-7" {
				t.Fatalf("typed %q, want CHG-7", v)
			}
		})
	}
}

func TestRetryTriesAStaleNodeAgain(t *testing.T) {
	stale := errors.New("Could not find node with given id (-32000)")
	other := errors.New("Element is not focusable (-32000)")
	for _, tc := range []struct {
		name  string
		errs  []error
		calls int
		want  error
	}{
		{"succeeds at once", []error{nil}, 1, nil},
		{"stale, then succeeds", []error{stale, nil}, 2, nil},
		{"stale three times", []error{stale, stale, stale, nil}, 3, stale},
		{"another error is not tried again", []error{other, nil}, 1, other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			a := Retry(chromedp.Action[chromedp.Void](func(context.Context, *chromedp.Target) (chromedp.Void, error) {
				calls++
				return chromedp.Void{}, tc.errs[calls-1]
			}))
			if _, err := a(context.Background(), nil); !errors.Is(err, tc.want) || calls != tc.calls {
				t.Fatalf("err %v after %d calls, want %v after %d", err, calls, tc.want, tc.calls)
			}
		})
	}
}
