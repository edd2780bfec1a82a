package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/resolver"
	"github.com/musterhq/muster/server/servertest"
	"github.com/musterhq/muster/stream"
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
	got := out.String()
	for _, want := range []string{"web version 7", "age 1m3", "cached", "00000000-0000-0000-0000-000000000001", "10.0.0.1:8080", "eligible", "known"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}

	out.Reset()
	if err := run(context.Background(), []string{"resolve", "--json", "--server", dead, "--cache", dir, "--token", "x", "web"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"version":7`) {
		t.Fatalf("json output: %s", out.String())
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
	s := servertest.New(t, servertest.Options{WatchHeartbeat: 20 * time.Millisecond})
	s.Seed(t)
	tok := s.Token(t, servertest.Viewer)
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
	for deadline := time.Now().Add(10 * time.Second); ; {
		if n, _ := s.Hub.Subscribers(); n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("resolve never subscribed")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
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
