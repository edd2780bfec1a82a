package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

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
