package main

import (
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/breakglass"
	"github.com/musterhq/muster/internal/policy"
)

// TestBreakglassCommand: muster breakglass, with the environment muster
// serve reads (DATABASE_URL, the signing key file), prints a token alone
// on stdout that a muster whose region's key is that file takes as an
// admin; a request without a reason or past the TTL cap is a usage error
// that writes nothing; list shows the grant live, revoke ends it (the
// server refuses it once the cache's bound has passed) and list then
// shows it revoked.
func TestBreakglassCommand(t *testing.T) {
	url := dbtest.URL(t)
	keyFile := filepath.Join(t.TempDir(), "signing.key")
	signer, err := audit.LoadOrCreateKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("DATABASE_URL", url)
	t.Setenv("MUSTER_AUDIT_SIGNING_KEY_FILE", keyFile)
	t.Setenv("MUSTER_REGION", "local")

	for _, args := range [][]string{
		{"breakglass", "--operator", "alice"},
		{"breakglass", "--operator", "alice", "--reason", "bootstrap", "--ttl", "5h"},
		{"breakglass", "--operator", "alice", "--reason", "bootstrap", "--role", "root"},
	} {
		out, errOut, err := runCmd(t, args...)
		if err == nil || exitCode(err) != 2 || out != "" || !strings.Contains(errOut, "muster breakglass:") {
			t.Errorf("muster %v: %v, stdout %q, stderr %q; want a usage error saying why", args, err, out, errOut)
		}
	}
	if out, _, err := runCmd(t, "breakglass", "list"); err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("list after refused requests: %v %q, want the header alone", err, out)
	}

	out, errOut, err := runCmd(t, "breakglass", "--operator", "alice", "--reason", "first admin of the region", "--ttl", "30m")
	if err != nil {
		t.Fatalf("muster breakglass: %v %s", err, errOut)
	}
	tok := strings.TrimSuffix(out, "\n")
	if strings.Count(tok, ".") != 2 || strings.ContainsAny(tok, " \n") {
		t.Fatalf("stdout %q: want the token alone", out)
	}
	if strings.Contains(errOut, tok) {
		t.Fatal("the token is on stderr too")
	}
	id := regexp.MustCompile(`grant ([0-9a-f-]{36})`).FindStringSubmatch(errOut)
	if id == nil || !strings.Contains(errOut, "muster breakglass revoke "+id[1]) {
		t.Fatalf("stderr %q: want the grant's id and how to revoke it", errOut)
	}

	st := apptest.New(t, apptest.Options{DatabaseURL: url, Policy: func(c *policy.Config) { c.Sealer = signer }})
	if r := st.JSON(t, "PUT", "/v1/services/web", tok, `{"owner":"payments","capabilities":["probe"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create web with the printed token: %d %s", r.Status, r.Body)
	}
	if out, _, err := runCmd(t, "breakglass", "list"); err != nil || !strings.Contains(out, id[1]) || !strings.Contains(out, " live ") ||
		!strings.Contains(out, `"first admin of the region"`) {
		t.Fatalf("list: %v\n%s", err, out)
	}
	if out, errOut, err := runCmd(t, "breakglass", "revoke", id[1]); err != nil || !strings.Contains(out, "revoked break-glass grant "+id[1]) {
		t.Fatalf("revoke: %v %s %s", err, out, errOut)
	}
	if _, _, err := runCmd(t, "breakglass", "revoke", id[1]); err == nil || !strings.Contains(err.Error(), "already revoked") {
		t.Fatalf("a second revoke: %v", err)
	}
	st.Clock.Advance(breakglass.DefaultCacheFor)
	if r := st.Do(t, "GET", "/v1/alarms", tok, "", ""); r.Status != http.StatusUnauthorized {
		t.Fatalf("the revoked token: %d %s", r.Status, r.Body)
	}
	if out, _, err := runCmd(t, "breakglass", "list"); err != nil || !strings.Contains(out, " revoked ") {
		t.Fatalf("list after revoke: %v\n%s", err, out)
	}
}
