// Package browsertest is what muster's browser tests share: finding
// Debian's Chromium (skipping without it, unless MUSTER_REQUIRE_BROWSER=1
// makes that a failure, as in CI), the folder screenshots go to, and a
// headless Chromium per test.
package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium returns the chromium binary. Without one the test skips, or
// fails when MUSTER_REQUIRE_BROWSER=1.
func Chromium(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		// Browser tests drive real pages in real time (seconds to
		// minutes); -short is the quick path. CI runs them in full.
		t.Skip("browser test: skipped with -short")
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no chromium binary on PATH: the browser tests need Debian's chromium (run scripts/ensure-chromium)"
	if os.Getenv("MUSTER_REQUIRE_BROWSER") == "1" {
		t.Fatal(msg + "; MUSTER_REQUIRE_BROWSER=1 makes this a failure")
	}
	t.Skip(msg)
	return ""
}

// Artifacts returns the folder screenshots go to, created if missing:
// $MUSTER_ARTIFACTS, or testdata/artifacts of the test's package (ignored
// by git).
func Artifacts(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("MUSTER_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("testdata", "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// New starts a headless Chromium with its own profile for the test, at a
// 1440×900 window, and returns the context of its tab. The browser lives
// as long as the test; give steps their own deadlines.
func New(t testing.TB, execPath string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(execPath),
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox cannot start
		chromedp.WindowSize(1440, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // start the browser now
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// OpenDetails opens the <details> element sel as an operator does, by
// clicking its summary, and returns once the page says it is open.
//
// Waiting for a field inside it to be visible is not enough: Chromium
// lays out a closed disclosure's content when asked for its size, so
// chromedp's visibility check passes on a field the operator cannot see,
// and typing into it then fails with "Element is not focusable". And a
// click can miss: it is aimed at where the summary was measured, and a
// late layout shift (a stylesheet applied after the page was parsed)
// moves it. So the open attribute is what is waited for, and a summary
// still closed after a bound is clicked again; the caller's context
// bounds the whole.
func OpenDetails(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		q, err := json.Marshal(sel + "[open]")
		if err != nil {
			return err
		}
		isOpen := chromedp.Evaluate[bool](fmt.Sprintf("document.querySelector(%s) !== null", q))
		for {
			if open, err := isOpen(ctx, t); err != nil || open {
				return err
			}
			if _, err := chromedp.Click(chromedp.CSS(sel+" > summary"))(ctx, t); err != nil {
				return fmt.Errorf("click the summary of %s: %w", sel, err)
			}
			// The summary's activation toggles the element in the click's
			// own task, so a click that landed shows at once; 2 s is
			// a generous bound on a loaded machine before trying again
			// (clicking sooner could close what a slow click opened).
			deadline := time.Now().Add(2 * time.Second)
			for time.Now().Before(deadline) {
				if open, err := isOpen(ctx, t); err != nil || open {
					return err
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("open %s: %w", sel, ctx.Err())
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
	})
}

// StaleNode reports whether err says a node went away between the query
// that found it and the call that used it: the page replaced it (a live
// refresh, a late navigation of a sign-in's redirects), or the DevTools
// protocol renumbered the document's nodes under chromedp.
func StaleNode(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "No node with given id") || strings.Contains(msg, "Could not find node with given id")
}

// Retry runs a, and runs it again (three times at most) when it failed
// on a stale node (StaleNode). That is safe for reads, and for chromedp's
// Click and SendKeys too, because every call of theirs that names a node
// (the visibility check, scrolling it into view, measuring it, focusing
// it) comes before the mouse or key events: a click or keystroke failed
// on a stale node was never sent. It is not for an action that sends
// input and then names a node.
func Retry[T any](a chromedp.Action[T]) chromedp.Action[T] {
	return func(ctx context.Context, t *chromedp.Target) (T, error) {
		var (
			v   T
			err error
		)
		for range 3 {
			if v, err = a(ctx, t); !StaleNode(err) {
				break
			}
		}
		return v, err
	}
}

// stepTimeout bounds one Read or Do.
const stepTimeout = 30 * time.Second

// Read runs one read (a node's text, the location, a screenshot) in the
// tab ctx with a deadline, failing the test on error. muster's pages
// refresh their live parts in place (static/refresh.js), so a node found
// by its id can be replaced before it is read ("No node with given id"):
// the read is tried again (Retry).
func Read[T any](t testing.TB, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(tctx, Retry(a))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// Do runs steps in the tab ctx with a deadline, failing the test on
// error. A step that failed on a stale node is tried again (Retry: it
// never took effect); the steps before it are not.
func Do(t testing.TB, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	retried := make([]chromedp.Action[chromedp.Void], len(steps))
	for i, s := range steps {
		retried[i] = Retry(s)
	}
	tctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	if _, err := chromedp.Run(tctx, chromedp.Steps(retried...)); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
