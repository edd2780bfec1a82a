package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
