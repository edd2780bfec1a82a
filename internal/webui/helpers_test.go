package webui_test

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app/apptest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// browser is a minimal cookie-keeping HTTP client. Go's cookie jar never
// sends Secure cookies over plain http, so the test keeps them itself
// (every cookie, every host: all hosts here are the one loopback server).
type browser struct {
	t       testing.TB
	base    string
	client  *http.Client
	mu      sync.Mutex
	cookies map[string]string
}

func newBrowser(t testing.TB, st *apptest.Stack) *browser {
	return &browser{t: t, base: st.URL, client: &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, cookies: map[string]string{}}
}

// page is a response with its body read.
type page struct {
	status   int
	location string
	body     string
	header   http.Header
}

// do sends one request (no redirects followed), sending and keeping cookies.
// A relative target is resolved against the stack's URL.
func (b *browser) do(method, target string, form url.Values, header map[string]string) page {
	b.t.Helper()
	if strings.HasPrefix(target, "/") {
		target = b.base + target
	}
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, target, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	b.mu.Lock()
	for k, v := range b.cookies {
		req.AddCookie(&http.Cookie{Name: k, Value: v})
	}
	b.mu.Unlock()
	res, err := b.client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	b.mu.Lock()
	for _, c := range res.Cookies() {
		if c.MaxAge < 0 || c.Value == "" {
			delete(b.cookies, c.Name)
		} else {
			b.cookies[c.Name] = c.Value
		}
	}
	b.mu.Unlock()
	return page{status: res.StatusCode, location: res.Header.Get("Location"), body: string(raw), header: res.Header}
}

func (b *browser) get(target string) page { b.t.Helper(); return b.do("GET", target, nil, nil) }

// sameOrigin is what a browser sends with a form from the UI's own page.
var sameOrigin = map[string]string{"Sec-Fetch-Site": "same-origin"}

// follow GETs target and follows redirects until a non-redirect answer or
// until stop says so for a redirect location.
func (b *browser) follow(target string, stop func(loc string) bool) (page, string) {
	b.t.Helper()
	for range 10 {
		p := b.get(target)
		if p.status < 300 || p.status > 399 {
			return p, target
		}
		next, err := url.Parse(p.location)
		if err != nil {
			b.t.Fatal(err)
		}
		if !next.IsAbs() {
			base, _ := url.Parse(target)
			next = base.ResolveReference(next)
		}
		if stop != nil && stop(next.String()) {
			return p, next.String()
		}
		target = next.String()
	}
	b.t.Fatal("too many redirects")
	return page{}, ""
}

// startSignIn opens the UI and follows it to the issuer's authorization
// request, returning that URL (not yet requested).
func (b *browser) startSignIn() string {
	b.t.Helper()
	_, authURL := b.follow("/ui/", func(loc string) bool { return strings.Contains(loc, "/dev/issuer/authorize") })
	if !strings.Contains(authURL, "/dev/issuer/authorize") {
		b.t.Fatalf("opening the UI did not lead to the issuer: %s", authURL)
	}
	return authURL
}

// atIssuer follows authURL to the dev sign-in page, picks user, and returns
// the issuer's redirect back to the UI's callback (not yet requested).
func (b *browser) atIssuer(authURL, user string) string {
	b.t.Helper()
	p, loginURL := b.follow(authURL, nil)
	if p.status != http.StatusOK || !strings.Contains(loginURL, "/dev/issuer/login") {
		b.t.Fatalf("authorize led to %s (%d), want the dev sign-in page", loginURL, p.status)
	}
	lu, _ := url.Parse(loginURL)
	id := lu.Query().Get("id")
	res := b.do("POST", b.base+"/dev/issuer/login", url.Values{"id": {id}, "user": {user}}, sameOrigin)
	if res.status != http.StatusFound {
		b.t.Fatalf("dev sign-in as %s: %d %s", user, res.status, res.body)
	}
	_, cb := b.follow(res.location, func(loc string) bool { return strings.Contains(loc, "/ui/auth/callback") })
	if !strings.Contains(cb, "/ui/auth/callback") {
		b.t.Fatalf("issuer did not redirect to the callback: %s", cb)
	}
	return cb
}

// signIn runs the whole sign-in as user and returns the page it lands on.
func (b *browser) signIn(user string) page {
	b.t.Helper()
	cb := b.atIssuer(b.startSignIn(), user)
	p, _ := b.follow(cb, nil)
	if p.status != http.StatusOK {
		b.t.Fatalf("sign-in as %s ended with %d: %s", user, p.status, p.body)
	}
	return p
}

// newUIStack starts a stack with the UI mounted.
func newUIStack(t testing.TB) *apptest.Stack {
	t.Helper()
	return apptest.New(t, apptest.Options{UI: true})
}
