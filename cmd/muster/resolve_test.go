package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

func deadServer(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// With muster down, resolve answers from the last-known-good cache.
func TestResolveDeadServerWithCache(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	eps := []resolver.Endpoint{{
		InstanceID: "00000000-0000-0000-0000-000000000001", Address: "10.0.0.1", Port: 8080,
		Zone: "a", State: "eligible", Weight: 1, Health: resolver.HealthKnown, Capabilities: []string{},
	}}
	cache, err := resolver.NewCache([]string{"web"}, resolver.WithDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	v := resolver.View{
		Service: "web", Version: 7, Endpoints: eps, Checksum: resolver.Checksum(eps),
		Zones:       map[string]resolver.Zone{"a": {Guard: resolver.GuardOK, Eligible: 1, Total: 1, MinHealthyFraction: 0.5}},
		GeneratedAt: time.Now().Add(-90 * time.Second),
	}
	if err := cache.ApplyView(v); err != nil {
		t.Fatal(err)
	}

	var out, errb bytes.Buffer
	dead := deadServer(t)
	err = run(context.Background(), []string{"resolve", "web", "--server", dead, "--cache", dir, "--token", "x", "--timeout", "5s"}, &out, &errb)
	if err != nil {
		t.Fatalf("resolve: %v\n%s", err, errb.String())
	}
	text := out.String()
	for _, want := range []string{"web version 7", "age 1m3", "cached", "00000000-0000-0000-0000-000000000001", "10.0.0.1:8080", "eligible", "known"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}

	out.Reset()
	if err := run(context.Background(), []string{"resolve", "--json", "--server", dead, "--cache", dir, "--token", "x", "web"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	got := decodeResolveJSON(t, out.Bytes())
	if got.Version != 7 || len(got.Endpoints) != 1 || got.Source != "cache" || !strings.Contains(got.SourceReason, "muster unreachable") ||
		got.AgeSeconds < 90 || got.AgeSeconds > 600 || math.Abs(got.ResolvedAt.Sub(got.GeneratedAt).Seconds()-got.AgeSeconds) > 0.001 {
		t.Fatalf("json output from the cache, want version 7, source cache, age 90 s or a little more: %s", out.String())
	}

	// Neither muster nor a cache: a clear error, exit status 1.
	err = run(context.Background(), []string{"resolve", "web", "--server", dead, "--cache", t.TempDir(), "--data", t.TempDir(), "--timeout", "5s"}, &out, &errb)
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "nothing is cached") {
		t.Fatalf("err %v (exit %d), want a clear no-view error", err, exitCode(err))
	}
}

// TestResolveWaitsForAView: muster accepts the subscription but holds no
// view of web yet (its evaluator rebuilding after a restart). muster
// resolve never prints an absent answer as the view: with nothing cached
// it fails clearly at its timeout; with a cached view it prints that, as
// cached, not live; and when the view is published while it waits, it
// prints the view, live.
func TestResolveWaitsForAView(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{WatchHeartbeat: 20 * time.Millisecond})
	s.Seed(t)
	tok := s.Token(t, apptest.Viewer)
	ctx := context.Background()
	var out, errb bytes.Buffer

	err := run(ctx, []string{"resolve", "web", "--server", s.URL, "--token", tok, "--cache", t.TempDir(), "--timeout", "1s"}, &out, &errb)
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "sent no view within 1s") || !strings.Contains(err.Error(), "nothing is cached") {
		t.Fatalf("no view anywhere: err %v, output %q; want a clear failure", err, out.String())
	}

	dir := t.TempDir()
	cache, err := resolver.NewCache([]string{"web"}, resolver.WithDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.ApplyView(webView(7, time.Now())); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(ctx, []string{"resolve", "web", "--server", s.URL, "--token", tok, "--cache", dir, "--timeout", "1s"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.Contains(got, "web version 7") || !strings.Contains(got, "cached; muster is connected but has not sent a current view yet") {
		t.Fatalf("cached view while muster has none:\n%s", got)
	}

	// The view is published while resolve waits.
	out.Reset()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"resolve", "web", "--server", s.URL, "--token", tok, "--cache", t.TempDir(), "--timeout", "20s"}, &out, &errb)
	}()
	wait.For(t, 10*time.Second, "resolve subscribed", func() bool {
		n, _ := s.Hub.Subscribers()
		return n > 0
	})
	b, err := json.Marshal(webView(1001, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	s.Hub.Publish([]stream.Update{{View: &stream.Frame{Kind: stream.KindView, Service: "web", Version: 1001, JSON: b}}})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.Contains(got, "web version 1001") || !strings.Contains(got, "(live)") {
		t.Fatalf("after the view was published:\n%s", got)
	}

	// --json says the same: live, and how old.
	out.Reset()
	if err := run(ctx, []string{"resolve", "web", "--json", "--server", s.URL, "--token", tok, "--cache", t.TempDir(), "--timeout", "20s"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if got := decodeResolveJSON(t, out.Bytes()); got.Version != 1001 || got.Source != "live" || got.SourceReason != "" || got.AgeSeconds < 0 || got.ReceivedAt.IsZero() {
		t.Fatalf("--json of the live view: %s", out.String())
	}
	// And a cached view while muster holds none is the cache's.
	out.Reset()
	if err := run(ctx, []string{"resolve", "api", "--json", "--server", s.URL, "--token", tok, "--cache", apiCache(t), "--timeout", "1s"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if got := decodeResolveJSON(t, out.Bytes()); got.Service != "api" || got.Source != "cache" || got.SourceReason != "muster is connected but has not sent a current view yet" {
		t.Fatalf("--json of a cached view muster has not sent: %s", out.String())
	}
}

// apiCache is a cache folder holding a view of api, version 3.
func apiCache(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cache, err := resolver.NewCache([]string{"api"}, resolver.WithDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	v := webView(3, time.Now())
	v.Service = "api"
	if err := cache.ApplyView(v); err != nil {
		t.Fatal(err)
	}
	return dir
}

// resolveOutput is what muster resolve --json prints, as a script reads it.
type resolveOutput struct {
	resolver.View
	Source       string    `json:"source"`
	SourceReason string    `json:"source_reason"`
	AgeSeconds   float64   `json:"age_seconds"`
	ReceivedAt   time.Time `json:"received_at"`
	ResolvedAt   time.Time `json:"resolved_at"`
}

func decodeResolveJSON(t *testing.T, b []byte) resolveOutput {
	t.Helper()
	var r resolveOutput
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("resolve --json printed %s: %v", b, err)
	}
	return r
}

func webView(version uint64, at time.Time) resolver.View {
	eps := []resolver.Endpoint{{
		InstanceID: "00000000-0000-0000-0000-000000000001", Address: "10.0.0.1", Port: 8080,
		Zone: "a", State: "eligible", Weight: 1, Health: resolver.HealthKnown, Capabilities: []string{},
	}}
	return resolver.View{
		Service: "web", Version: version, Endpoints: eps, Checksum: resolver.Checksum(eps),
		Zones:       map[string]resolver.Zone{"a": {Guard: resolver.GuardOK, Eligible: 1, Total: 1, MinHealthyFraction: 0.5}},
		GeneratedAt: at,
	}
}

// TestResolveShowsHold: muster (a loopback stand-in speaking the watch
// stream) sends web with ten endpoints, then with four and no registry
// counts to explain the shrink. resolve shows routing on the ten and the
// hold, in text and in --json.
func TestResolveShowsHold(t *testing.T) {
	t.Parallel()
	eps := make([]resolver.Endpoint, 10)
	for i := range eps {
		eps[i] = resolver.Endpoint{
			InstanceID: fmt.Sprintf("00000000-0000-0000-0000-%012d", i+1), Address: fmt.Sprintf("10.0.0.%d", i+1), Port: 8080,
			Zone: "a", State: "eligible", Weight: 1, Health: resolver.HealthKnown, Capabilities: []string{},
		}
	}
	viewOf := func(version uint64, eps []resolver.Endpoint) resolver.View {
		return resolver.View{
			Service: "web", Version: version, Endpoints: eps, Checksum: resolver.Checksum(eps), GeneratedAt: time.Now(),
			Zones: map[string]resolver.Zone{"a": {Guard: resolver.GuardOK, Eligible: len(eps), Total: 10, MinHealthyFraction: 0.5}},
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/watch" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, v := range []resolver.View{viewOf(123, eps), viewOf(130, eps[:4])} {
			b, err := json.Marshal(v)
			if err != nil {
				panic(err)
			}
			fmt.Fprintf(w, "event: view\nid: %d\ndata: %s\n\n", v.Version, b)
		}
		fmt.Fprint(w, "event: synced\ndata: {}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)

	var out, errb bytes.Buffer
	args := []string{"resolve", "web", "--server", srv.URL, "--token", "x", "--cache", t.TempDir(), "--timeout", "10s"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("resolve: %v\n%s", err, errb.String())
	}
	got := out.String()
	for _, want := range []string{"web version 123", "(live)", "held: v123 routes 10, newest v130 has 4 (shrink capped) since ", ", follows at ", "10.0.0.10:8080"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}

	out.Reset()
	if err := run(context.Background(), append(args, "--json"), &out, &errb); err != nil {
		t.Fatalf("resolve --json: %v\n%s", err, errb.String())
	}
	var res struct {
		Version   uint64              `json:"version"`
		Endpoints []resolver.Endpoint `json:"endpoints"`
		Hold      *struct {
			Reason         string    `json:"reason"`
			Since          time.Time `json:"since"`
			FollowAt       time.Time `json:"follow_at"`
			HeldVersion    uint64    `json:"held_version"`
			HeldRoutable   int       `json:"held_routable"`
			NewestVersion  uint64    `json:"newest_version"`
			NewestRoutable int       `json:"newest_routable"`
		} `json:"hold"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("json output %s: %v", out.String(), err)
	}
	h := res.Hold
	if res.Version != 123 || len(res.Endpoints) != 10 || h == nil || h.Reason != "shrink_capped" || h.HeldVersion != 123 || h.HeldRoutable != 10 ||
		h.NewestVersion != 130 || h.NewestRoutable != 4 || h.FollowAt.Sub(h.Since) != resolver.DefaultConfirmAfter {
		t.Fatalf("json output: %s", out.String())
	}
}

func TestHoldLine(t *testing.T) {
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := &resolver.Hold{
		Reason: resolver.ErrWouldEmpty, Since: since, FollowAt: since.Add(time.Minute),
		HeldVersion: 7, HeldRoutable: 3, NewestVersion: 9, NewestRoutable: 0,
	}
	for now, want := range map[time.Time]string{
		since.Add(15 * time.Second): "held: v7 routes 3, newest v9 has 0 (would empty) since 2026-01-02T03:04:05Z (15s ago), follows at 2026-01-02T03:05:05Z (in 45s) unless muster sends a larger set",
		since.Add(90 * time.Second): "held: v7 routes 3, newest v9 has 0 (would empty) since 2026-01-02T03:04:05Z (1m30s ago), follows at 2026-01-02T03:05:05Z (now) unless muster sends a larger set",
	} {
		if got := holdLine(h, now); got != want {
			t.Errorf("holdLine at %s:\n got %s\nwant %s", now, got, want)
		}
	}
}

// TestResolveWaitsThroughAStartingMuster: a muster that is still
// starting answers its first watch 503 (not ready: it has not loaded who
// may watch what). With nothing cached, muster resolve (and tgsync
// --once, which waits the same way) kept no wait after that first
// refusal and failed at once; it now waits through it while the client
// resubscribes, up to --timeout. In front of a real muster, a proxy
// answers the first watch as a starting muster does (named a stand-in
// for that moment only).
func TestResolveWaitsThroughAStartingMuster(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{})
	s.Seed(t)
	admin := s.Token(t, apptest.Admin)
	if r := s.JSON(t, "POST", "/v1/services/web/instances", admin, `{"address":"10.8.0.1","port":8080,"zone":"az1"}`); r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	s.SyncNow(t)
	s.Evaluator.EvaluateNow()
	s.Publisher.RunOnce()
	s.Clock.Advance(2 * time.Second)
	s.Publisher.RunOnce()
	target, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1 // a stream: pass every event on at once
	var refused atomic.Int32
	starting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/watch" && refused.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"type":"https://muster.dev/problems/not-ready","title":"Service Unavailable","status":503,"detail":"muster has not yet loaded who may watch and resolve what; retry in a moment"}`)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(starting.Close)
	var out, errb bytes.Buffer
	err = run(context.Background(), []string{"resolve", "web", "--server", starting.URL, "--token", s.Token(t, apptest.Viewer),
		"--cache", t.TempDir(), "--timeout", "30s"}, &out, &errb)
	if err != nil {
		t.Fatalf("resolve through a starting muster: %v\n%s", err, errb.String())
	}
	if got := out.String(); !strings.Contains(got, "web version") || !strings.Contains(got, "(live)") || refused.Load() < 2 {
		t.Fatalf("output after %d watches:\n%s", refused.Load(), got)
	}
}
