package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// TestAgentRefusesAddressesOffLoopback: muster agent serves without
// credentials, so an xDS or HTTP address anyone but the host could reach
// is refused at start, saying why, before anything is started (the cache
// folder is not even created); a command line without an upstream or an
// identity is a usage error.
func TestAgentRefusesAddressesOffLoopback(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("not-a-real-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "never-created")
	base := []string{"agent", "--upstream", "http://127.0.0.1:1", "--token-file", tok, "--cache", cache}
	for _, extra := range [][]string{
		{"--xds-addr", "0.0.0.0:0", "--http-addr", "127.0.0.1:0"},
		{"--xds-addr", ":0", "--http-addr", "127.0.0.1:0"},
		{"--xds-addr", "127.0.0.1:0", "--http-addr", "10.0.0.1:15011"},
		{"--xds-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--dns-addr", "0.0.0.0:15053"},
	} {
		_, _, err := runCmd(t, append(base, extra...)...)
		if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "only on loopback") {
			t.Fatalf("muster agent %v: %v; want a refusal naming loopback", extra, err)
		}
	}
	if _, err := os.Stat(cache); !os.IsNotExist(err) {
		t.Fatalf("a refused agent created its cache folder: %v", err)
	}
	for _, args := range [][]string{
		{"agent", "--token-file", tok},
		{"agent", "--upstream", "http://127.0.0.1:1"},
	} {
		if _, _, err := runCmd(t, args...); exitCode(err) != 2 {
			t.Fatalf("muster %v: %v; want a usage error", args, err)
		}
	}
}

// TestAgentCommandServes: `muster agent` with a token file and the
// region's view key file, against a real muster (in-process), serves
// web's view on its HTTP port without credentials, reports ready and its
// metrics, and ends cleanly on its context.
func TestAgentCommandServes(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{})
	s.Seed(t)
	admin := s.Token(t, apptest.Admin)
	if r := s.JSON(t, "POST", "/v1/services/web/instances", s.Token(t, apptest.Web), `{"address":"127.0.0.1","port":9000,"zone":"az1"}`); r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", admin, `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Fatalf("grant: %d %s", r.Status, r.Body)
	}
	s.SyncNow(t)
	s.Evaluator.EvaluateNow()
	s.Publisher.RunOnce()
	s.Clock.Advance(1100 * time.Millisecond)
	s.Publisher.RunOnce()

	dir := t.TempDir()
	tok, pub := filepath.Join(dir, "token"), filepath.Join(dir, "region.pub")
	if err := os.WriteFile(tok, []byte(s.Token(t, apptest.API)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(apptest.SealKey().Public())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	base, stop := runAgent(t, "--upstream", s.URL, "--token-file", tok, "--view-keys", pub, "--service", "web", "--dns-addr", freeAddr(t))
	res, err := http.Get(base + "/v1/resolve/web")
	if err != nil {
		t.Fatal(err)
	}
	var v resolver.View
	err = json.NewDecoder(res.Body).Decode(&v)
	res.Body.Close()
	// web's instance awaits its first probe: the view names it
	// registered in az1 and routes to nothing yet.
	if z, ok := v.Zones["az1"]; err != nil || res.StatusCode != http.StatusOK || v.Service != "web" || !ok || z.Registered == nil || *z.Registered != 1 {
		t.Fatalf("the agent's /v1/resolve/web: %d %+v %v", res.StatusCode, v, err)
	}
	res, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{"muster_agent_upstream_connected 1", "muster_agent_ready 1", "muster_dns_"} {
		if !strings.Contains(string(m), want) {
			t.Fatalf("the agent's metrics lack %q", want)
		}
	}
	// The exec probe the deployment examples give a sidecar: ready
	// answers 0, a port nothing serves an error.
	if out, errOut, err := runCmd(t, "agent", "readyz", "--http-addr", strings.TrimPrefix(base, "http://")); err != nil || out != "ok\n" {
		t.Fatalf("muster agent readyz against the ready agent: %v %q %s", err, out, errOut)
	}
	if _, _, err := runCmd(t, "agent", "readyz", "--http-addr", freeAddr(t)); err == nil || exitCode(err) != 1 {
		t.Fatalf("muster agent readyz against nothing: %v; want exit 1", err)
	}
	if out := stop(); !strings.Contains(out, "muster agent: xDS on") {
		t.Fatalf("stdout: %q", out)
	}
}

// runAgent runs `muster agent ARGS` in-process on free loopback ports
// with a cache folder of its own, waits until it is ready, and returns
// its HTTP base URL and a function that ends it (its context) and
// returns its standard output once it has.
func runAgent(t *testing.T, args ...string) (base string, stop func() string) {
	t.Helper()
	httpAddr := freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	var out, errw bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"agent", "--cache", filepath.Join(t.TempDir(), "cache"), "--xds-addr", freeAddr(t), "--http-addr", httpAddr}, args...), &out, &errw)
	}()
	stopped := false
	stop = func() string {
		t.Helper()
		if stopped {
			return out.String()
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("muster agent: %v\n%s", err, errw.String())
			}
		case <-time.After(15 * time.Second):
			t.Fatal("muster agent did not end within 15 s of its context")
		}
		return out.String()
	}
	t.Cleanup(func() { stop() })
	base = "http://" + httpAddr
	wait.For(t, 30*time.Second, "the agent ready", func() bool {
		select {
		case err := <-done:
			t.Fatalf("muster agent ended: %v\n%s", err, errw.String())
		default:
		}
		res, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	return base, stop
}
