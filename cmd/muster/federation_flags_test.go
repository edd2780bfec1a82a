package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/federation"
)

// TestPeerRegionFlags: --peer, --peer-token and --peer-ca (repeatable)
// and the MUSTER_PEER_* variables become one PeerConfig per region; a
// flag replaces its variable; malformed values stop the start with the
// reason.
func TestPeerRegionFlags(t *testing.T) {
	dir := t.TempDir()
	tokB, tokC, ca := filepath.Join(dir, "b.token"), filepath.Join(dir, "c.token"), filepath.Join(dir, "c-ca.pem")
	for _, f := range []string{tokB, tokC, ca} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	parse := func(t *testing.T, args ...string) (federation.Config, error) {
		t.Helper()
		fs := flag.NewFlagSet("dev", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		ff := addFederationFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		cfg := Config{Region: "a", Dev: true, DataDir: "/data"}
		err := ff.apply(&cfg)
		return cfg.Federation, err
	}
	for _, k := range []string{"MUSTER_PEER_REGIONS", "MUSTER_PEER_TOKENS", "MUSTER_PEER_CAS", "MUSTER_PEER_STALE_AFTER", "MUSTER_PEER_DISCOVER_EVERY", "MUSTER_PEER_CACHE_DIR"} {
		t.Setenv(k, "")
	}

	t.Run("flags", func(t *testing.T) {
		got, err := parse(t, "--peer", "b=http://127.0.0.1:8081", "--peer", "c=https://c.example:8443", "--peer", "b=http://127.0.0.1:8082",
			"--peer-token", "b="+tokB, "--peer-token", "c="+tokC, "--peer-ca", "c="+ca, "--peer-stale-after", "5s")
		if err != nil {
			t.Fatal(err)
		}
		want := federation.Config{Peers: []federation.PeerConfig{
			{Name: "b", URLs: []string{"http://127.0.0.1:8081", "http://127.0.0.1:8082"}, TokenFile: tokB},
			{Name: "c", URLs: []string{"https://c.example:8443"}, TokenFile: tokC, CAFile: ca},
		}, StaleAfter: 5 * time.Second, CacheDir: "/data/federation"}
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("(-want +got):\n%s", d)
		}
	})
	t.Run("environment", func(t *testing.T) {
		t.Setenv("MUSTER_PEER_REGIONS", "b=http://127.0.0.1:8081, c=http://127.0.0.1:8083")
		t.Setenv("MUSTER_PEER_TOKENS", "b="+tokB+",c="+tokC)
		t.Setenv("MUSTER_PEER_DISCOVER_EVERY", "1s")
		t.Setenv("MUSTER_PEER_CACHE_DIR", "/var/cache/muster")
		got, err := parse(t)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Peers) != 2 || got.Peers[1].URLs[0] != "http://127.0.0.1:8083" || got.Discover != time.Second || got.CacheDir != "/var/cache/muster" {
			t.Fatalf("%+v", got)
		}
		// A flag replaces the variable.
		got, err = parse(t, "--peer", "d=http://127.0.0.1:9000", "--peer-token", "d="+tokB)
		if err != nil || len(got.Peers) != 1 || got.Peers[0].Name != "d" {
			t.Fatalf("%+v %v", got, err)
		}
	})
	t.Run("none", func(t *testing.T) {
		if got, err := parse(t); err != nil || len(got.Peers) != 0 {
			t.Fatalf("%+v %v", got, err)
		}
	})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--peer", "b"}, "want NAME=URL"},
		{[]string{"--peer", "a=https://x", "--peer-token", "a=" + tokB}, "this region's own name"},
		{[]string{"--peer", "B_1=https://x"}, "DNS label"},
		{[]string{"--peer", "b=x.example"}, "http:// or https://"},
		{[]string{"--peer", "b=http://muster.b.example:8080", "--peer-token", "b=" + tokB}, "in clear text"}, // the token would travel in clear
		{[]string{"--peer", "b=https://x"}, "has no token"},
		{[]string{"--peer", "b=https://x", "--peer-token", "b=" + filepath.Join(dir, "missing")}, "token file"},
		{[]string{"--peer", "b=https://x", "--peer-token", "b=" + tokB, "--peer-ca", "b=" + filepath.Join(dir, "missing")}, "CA bundle"},
		{[]string{"--peer", "b=https://x", "--peer-token", "c=" + tokB}, `no peer region "c"`},
		{[]string{"--peer", "b=https://x", "--peer-token", "b=" + tokB, "--peer-stale-after", "soon"}, "want a duration above 0"},
	} {
		if _, err := parse(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error with %q", tc.args, err, tc.want)
		}
	}
	// The commands refuse them before anything starts.
	for _, cmd := range []string{"dev", "serve"} {
		if _, _, err := runCmd(t, cmd, "--peer", "b=ftp://x"); err == nil || !strings.Contains(err.Error(), "http:// or https://") {
			t.Errorf("muster %s --peer b=ftp://x: %v", cmd, err)
		}
		if _, _, err := runCmd(t, cmd, "--peer", "b=http://muster.b.example:8080", "--peer-token", "b="+tokB); err == nil || !strings.Contains(err.Error(), "in clear text") {
			t.Errorf("muster %s --peer b=http://muster.b.example:8080: %v; want the plain-http refusal", cmd, err)
		}
	}
}
