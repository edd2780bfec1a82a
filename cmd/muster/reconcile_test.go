package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/wait"
)

// TestDevReconcilesASnapshot: muster dev --reconcile-config, wired as
// serve wires it: a snapshot's instances appear (source snapshot/fleet,
// no lease), and the diff API lists the never-ready one as a startup failure.
func TestDevReconcilesASnapshot(t *testing.T) {
	realTime(t, "muster dev with a reconcile config")
	t.Parallel() // its own data folder and in-process muster dev
	dir := devDir(t)
	snap := filepath.Join(dir, "fleet.json")
	if err := os.WriteFile(snap, []byte(`{"instances":[
		{"id":"i-1","service":"web","address":"10.20.0.1","port":8080,"zone":"az1"},
		{"id":"i-2","service":"web","address":"10.20.0.2","port":8080,"zone":"az1","ready":false}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "reconcile.yaml")
	if err := os.WriteFile(cfg, []byte("every: 200ms\nsnapshots:\n  - name: fleet\n    file: "+snap+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDev(t, dir, "--reconcile-config", cfg)
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	if st, body := call(t, "PUT", d.url+"/v1/services/web", admin, `{"owner":"payments","capabilities":["self","passive"]}`); st != http.StatusCreated {
		t.Fatalf("create web: %d %s", st, body)
	}
	wait.For(t, 30*time.Second, "the snapshot's ready instance reconciled", func() bool {
		_, body := call(t, "GET", d.url+"/v1/services/web/instances", admin, "")
		return strings.Contains(string(body), `"source":"snapshot/fleet"`)
	})
	_, body := call(t, "GET", d.url+"/v1/services/web/instances", admin, "")
	if strings.Contains(string(body), "lease_expires_at") || strings.Contains(string(body), "10.20.0.2") {
		t.Fatalf("instances: %s; want i-1 only, without a lease", body)
	}
	st, diff := call(t, "GET", d.url+"/v1/reconcile/diff", admin, "")
	if st != http.StatusOK || !strings.Contains(string(diff), `"missing":1`) || !strings.Contains(string(diff), "startup failure") {
		t.Fatalf("diff: %d %s", st, diff)
	}
	if !strings.Contains(d.stderr.String(), "muster is serving") {
		t.Fatalf("log: %s", d.stderr.String())
	}
}
