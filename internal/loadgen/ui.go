package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/musterhq/muster/internal/cli"
)

// loadgenUI signs in to the admin UI as a dev user through the dev
// issuer's real code flow, then fetches each page --requests times in a
// row and prints its server round-trip latency (loopback, so close to the
// server-side render time) and size.
func loadgenUI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		base, user, pages string
		requests          int
	)
	fs := cli.NewFlags("loadgen ui", stderr)
	fs.StringVar(&base, "url", "http://127.0.0.1:8080", "muster dev to measure")
	fs.StringVar(&user, "user", "alice", "dev user to sign in as")
	fs.StringVar(&pages, "pages", "/ui/,/ui/audit", "comma-separated pages to time")
	fs.IntVar(&requests, "requests", 20, "fetches per page")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	client, err := uiSignIn(ctx, base, user)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "signed in as %s; %d fetches per page\n", user, requests)
	fmt.Fprintf(stdout, "%-40s %8s %8s %8s %10s\n", "page", "p50", "p95", "max", "bytes")
	for _, page := range strings.Split(pages, ",") {
		var took []time.Duration
		var size int64
		for range requests {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+page, nil)
			if err != nil {
				return err
			}
			start := time.Now()
			res, err := client.Do(req)
			if err != nil {
				return fmt.Errorf("GET %s: %w", page, err)
			}
			size, err = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			took = append(took, time.Since(start))
			if err != nil {
				return fmt.Errorf("GET %s: %w", page, err)
			}
			if res.StatusCode != http.StatusOK || res.Request.URL.Path != page {
				return fmt.Errorf("GET %s: %s (ended at %s)", page, res.Status, res.Request.URL.Path)
			}
		}
		slices.Sort(took)
		q := func(f float64) time.Duration {
			return took[min(len(took)-1, int(f*float64(len(took))))].Round(100 * time.Microsecond)
		}
		fmt.Fprintf(stdout, "%-40s %8s %8s %8s %10d\n", page, q(0.5), q(0.95), took[len(took)-1].Round(100*time.Microsecond), size)
	}
	return nil
}

// uiSignIn walks the UI's sign-in: /ui/login redirects to the dev
// issuer's authorization endpoint and its login page; posting the user
// completes the code flow and leaves the session cookie in the jar.
func uiSignIn(ctx context.Context, base, user string) (*http.Client, error) {
	jar, err := cookiejar.New(nil)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Jar: jar, Timeout: 60 * time.Second}
	get := func(u string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		return client.Do(req)
	}
	res, err := get(strings.TrimRight(base, "/") + "/ui/login")
	if err != nil {
		return nil, fmt.Errorf("start sign-in: %w", err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	loginURL := res.Request.URL
	id := loginURL.Query().Get("id")
	if res.StatusCode != http.StatusOK || id == "" {
		return nil, fmt.Errorf("start sign-in: %s at %s; is this a muster dev with the UI?", res.Status, loginURL)
	}
	post := *loginURL
	post.RawQuery = ""
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, post.String(), strings.NewReader(url.Values{"id": {id}, "user": {user}}.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	res, err = client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("sign in as %s: %w", user, err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Request.URL.Path, "/ui") {
		return nil, fmt.Errorf("sign in as %s: %s at %s", user, res.Status, res.Request.URL)
	}
	return client, nil
}
