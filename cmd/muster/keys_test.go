package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/wait"
)

// runToExit runs this binary as muster with args and env and waits for it
// to exit (2 minutes at most), returning what it printed. It is for a
// muster that must refuse to start.
func runToExit(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out, err := musterChild(ctx, t, env, args...).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("muster %v still running after 2 minutes; it should have refused to start:\n%s", args, out)
	}
	return string(out), err
}

// musterChild is a command running this binary as muster with args and
// env added to the test's environment, ended with ctx.
func musterChild(ctx context.Context, t *testing.T, env []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, musterBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// TestKeyTroubleRefusesToStart (issue 25): a second replica whose keys do
// not verify the database's sealed rows refuses to start, saying which key
// and how many rows, while the replica running keeps serving the same
// view: one handed a rotated key without the old key's public half; a
// muster dev whose key file is gone (and it makes no new key over the
// sealed rows); a keyless muster serve. Given the old key's public half
// too (and the running replica the new key's, as a rotation's first step
// does), the rotated replica starts and serves the same view.
func TestKeyTroubleRefusesToStart(t *testing.T) {
	realTime(t, "muster processes started with the wrong keys beside a running one")
	t.Parallel() // its own data folder and ports; keys reach the children through exec.Cmd
	dir := devDir(t)
	addr := freeAddr(t)
	url := "http://" + addr
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	// Nobody renews the instance's lease here: a long one keeps it from
	// expiring under the test.
	first := startProcess(t, dir, addr, "MUSTER_LEASE_TTL=10m")
	t.Cleanup(func() {
		_ = first.Process.Signal(os.Interrupt)
		_ = first.Wait()
	})
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	if code, body := call(t, "PUT", url+"/v1/services/web", admin, `{"owner":"payments","capabilities":[]}`); code != 201 {
		t.Fatalf("create web: %d %s", code, body)
	}
	if code, body := call(t, "POST", url+"/v1/services/web/instances", admin, `{"address":"10.1.2.3","port":8080,"zone":"az1"}`); code != 201 {
		t.Fatalf("register: %d %s", code, body)
	}
	routes := func(base string) bool {
		code, body := call(t, "GET", base+"/v1/resolve/web", admin, "")
		return code == 200 && strings.Contains(string(body), `"address":"10.1.2.3"`)
	}
	wait.For(t, 30*time.Second, "web's view routing to 10.1.2.3", func() bool { return routes(url) })

	keyFile := filepath.Join(dir, "audit-signing.key")
	old, err := audit.LoadKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	rotatedFile := filepath.Join(t.TempDir(), "rotated.key")
	rotated, err := audit.LoadOrCreateKeyFile(rotatedFile)
	if err != nil {
		t.Fatal(err)
	}

	// A replica handed the rotated key alone refuses to start.
	out, err := runToExit(t, []string{"MUSTER_AUDIT_SIGNING_KEY_FILE=" + rotatedFile}, "dev", "--addr", freeAddr(t), "--data", dir)
	if err == nil {
		t.Fatalf("a replica with a rotated key started:\n%s", out)
	}
	for _, want := range []string{"sealed by key " + old.KeyID(), "it trusts " + rotated.KeyID(), "instances 1", "MUSTER_AUDIT_PUBLIC_KEY_FILES", "docs/keys.md"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	if !routes(url) {
		t.Fatal("the running replica stopped routing to 10.1.2.3 while another refused to start")
	}

	// Step 1 of a rotation (docs/keys.md): every replica trusts the new
	// key's public half before any signs with it, so that the replicas
	// keep authenticating each other (the relay of the views each owns)
	// through the roll. Without it, the rotated replica below could serve
	// only the services it owns, the others' relay refusing its signature.
	if err := first.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	first = startProcess(t, dir, addr, "MUSTER_LEASE_TTL=10m", "MUSTER_AUDIT_PUBLIC_KEY_FILES="+rotatedFile+".pub")
	admin = token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	wait.For(t, 30*time.Second, "the first replica, restarted trusting the new key, routing to 10.1.2.3", func() bool { return routes(url) })

	// Given the old key's public half too, it starts and routes the same.
	second := freeAddr(t)
	rep := startProcess(t, dir, second, "MUSTER_LEASE_TTL=10m", "MUSTER_AUDIT_SIGNING_KEY_FILE="+rotatedFile, "MUSTER_AUDIT_PUBLIC_KEY_FILES="+keyFile+".pub")
	// Tokens name the issuer of the muster dev that minted them, and the
	// dev issuer is each process's own: mint one for this replica.
	adminB := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("the replica trusting both keys answered: %s", last)
		}
	}()
	wait.For(t, 60*time.Second, "the replica trusting both keys routing to 10.1.2.3", func() bool {
		code, body := call(t, "GET", "http://"+second+"/v1/resolve/web", adminB, "")
		last = fmt.Sprintf("%d %s", code, body)
		return code == 200 && strings.Contains(string(body), `"address":"10.1.2.3"`)
	})
	t.Logf("the replica trusting both keys: %s", last)
	_ = rep.Process.Signal(os.Interrupt)
	_ = rep.Wait()

	// muster dev whose key file is gone refuses, and makes no new key.
	if err := os.Rename(keyFile, keyFile+".away"); err != nil {
		t.Fatal(err)
	}
	out, err = runToExit(t, nil, "dev", "--addr", freeAddr(t), "--data", dir)
	if err == nil || !strings.Contains(out, "is gone") || !strings.Contains(out, old.KeyID()) {
		t.Errorf("muster dev without its key file: err %v, want a refusal naming the key:\n%s", err, out)
	}
	if _, err := os.Stat(keyFile); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("muster dev made a new key over the sealed database: %v", err)
	}
	if err := os.Rename(keyFile+".away", keyFile); err != nil {
		t.Fatal(err)
	}

	// A keyless muster serve on the sealed database refuses.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cluster, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir}) // adopts the running cluster
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Stop()
	out, err = runToExit(t, []string{"DATABASE_URL=" + cluster.URL("muster"), "MUSTER_ISSUERS=" + url, "MUSTER_AUDIT_SIGNING_KEY_FILE="},
		"serve", "--addr", freeAddr(t))
	if err == nil || !strings.Contains(out, "no signing key, and the database's rows are sealed") || !strings.Contains(out, "instances 1") {
		t.Errorf("a keyless muster serve on a sealed database: err %v, want a refusal:\n%s", err, out)
	}
	if !routes(url) {
		t.Fatal("the running replica stopped routing to 10.1.2.3")
	}
}
