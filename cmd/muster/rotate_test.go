package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/wait"
)

// viewShape is what a view routes, as a string that stays the same across
// restarts (versions and times change): each endpoint's address, state,
// weight and override, and each zone's weight.
func viewShape(t *testing.T, base, tok string) (string, bool) {
	t.Helper()
	code, body := call(t, "GET", base+"/v1/resolve/web", tok, "")
	if code != 200 {
		return fmt.Sprintf("%d %s", code, body), false
	}
	var v struct {
		Endpoints []struct {
			Address  string
			State    string
			Weight   float64
			Override *struct{ Action string }
		}
		Zones map[string]struct {
			Weight float64 `json:"weight"`
		}
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, e := range v.Endpoints {
		o := "-"
		if e.Override != nil {
			o = e.Override.Action
		}
		parts = append(parts, fmt.Sprintf("%s %s %.2f %s", e.Address, e.State, e.Weight, o))
	}
	for z, s := range v.Zones {
		parts = append(parts, fmt.Sprintf("zone %s %.2f", z, s.Weight))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; "), len(v.Endpoints) > 0
}

// TestSealRotateRetiresTheOldKey (issue 25): the region's key is rotated
// the documented way, with muster running throughout: a replica signing
// with the new key and trusting the old one's public half takes over,
// muster seal rotate re-seals every live row under the new key beside it,
// seal status then shows the old key covering nothing, and a replica that
// trusts the new key alone serves the same view, applies the same
// override, keeps the same drain and can step it back.
func TestSealRotateRetiresTheOldKey(t *testing.T) {
	realTime(t, "muster processes restarted across a key rotation")
	t.Parallel() // its own data folder, ports and processes; keys reach every command through exec.Cmd
	dir := devDir(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	stop := func(p interface {
		Signal(os.Signal) error
	}) {
		_ = p.Signal(os.Interrupt)
	}

	// The old key: muster dev's own.
	addr := freeAddr(t)
	url := "http://" + addr
	first := startProcess(t, dir, addr, "MUSTER_LEASE_TTL=10m", "MUSTER_SHIFT_DWELL=1s")
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	for _, c := range []struct{ method, path, body string }{
		{"PUT", "/v1/services/web", `{"owner":"payments","capabilities":[]}`},
		{"PUT", "/v1/services/web/contract", `{"min_healthy_fraction":0.3}`},
		{"PUT", "/v1/services/api", `{"owner":"search","capabilities":[]}`},
		{"PUT", "/v1/services/web/grants", `{"callers":["api"]}`},
	} {
		if code, body := call(t, c.method, url+c.path, admin, c.body); code/100 != 2 {
			t.Fatalf("%s %s: %d %s", c.method, c.path, code, body)
		}
	}
	var ids []string
	for i, zone := range []string{"az1", "az1", "az1", "az2", "az2"} {
		code, body := call(t, "POST", url+"/v1/services/web/instances", admin,
			fmt.Sprintf(`{"address":"10.1.2.%d","port":8080,"zone":%q}`, i+1, zone))
		if code != 201 {
			t.Fatalf("register: %d %s", code, body)
		}
		var in struct{ ID string }
		_ = json.Unmarshal(body, &in)
		ids = append(ids, in.ID)
	}
	var code int
	var body []byte
	wait.For(t, 30*time.Second, "the override admitted or refused", func() bool {
		code, body = call(t, "POST", url+"/v1/overrides", admin,
			fmt.Sprintf(`{"instance_id":%q,"action":"mark_ineligible","justification":"disk errors","expires_in":86400}`, ids[0]))
		return code != 503
	})
	if code != 201 {
		t.Fatalf("override: %d %s", code, body)
	}
	// The budget check reads the contract the evaluator applies, which it
	// takes up within a refresh: until then the defaults refuse the drain.
	wait.For(t, 30*time.Second, "the drain admitted", func() bool {
		code, body = call(t, "POST", url+"/v1/shifts", admin, `{"scope":"zone","target":"az2","reason":"az2 packet loss","manual":true}`)
		return code != 409 && code != 503
	})
	if code != 201 {
		t.Fatalf("drain az2: %d %s", code, body)
	}
	var sh struct{ ID string }
	_ = json.Unmarshal(body, &sh)

	var want string
	wait.For(t, 30*time.Second, "web's view with the override and the drain", func() bool {
		s, ok := viewShape(t, url, admin)
		want = s
		return ok && strings.Contains(s, "mark_ineligible") && strings.Contains(s, "zone az2 0.00")
	})
	t.Logf("the view under the old key: %s", want)

	keyFile := filepath.Join(dir, "audit-signing.key")
	old, err := audit.LoadKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	newFile := filepath.Join(t.TempDir(), "new.key")
	newKey, err := audit.LoadOrCreateKeyFile(newFile)
	if err != nil {
		t.Fatal(err)
	}
	sameView := func(base, tok, who string) {
		t.Helper()
		var got string
		wait.For(t, 60*time.Second, who+" serving the same view", func() bool {
			got, _ = viewShape(t, base, tok)
			return got == want
		})
	}

	// Step 2 of docs/keys.md: a replica signing with the new key and
	// trusting the old one's public half takes over.
	stop(first.Process)
	_ = first.Wait()
	addr = freeAddr(t)
	url = "http://" + addr
	both := startProcess(t, dir, addr, "MUSTER_LEASE_TTL=10m", "MUSTER_SHIFT_DWELL=1s", "MUSTER_AUDIT_SIGNING_KEY_FILE="+newFile, "MUSTER_AUDIT_PUBLIC_KEY_FILES="+keyFile+".pub")
	admin = token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	sameView(url, admin, "the replica trusting both keys")

	// Step 3: re-seal, beside it. The commands run as child processes,
	// their keys in their own environment, so the test can run beside
	// others.
	rotateEnv := []string{"MUSTER_AUDIT_SIGNING_KEY_FILE=" + newFile, "MUSTER_AUDIT_PUBLIC_KEY_FILES=" + keyFile + ".pub"}
	out, errOut, err := runChild(t, rotateEnv, "seal", "rotate", "--data", dir, "--batch", "2")
	if err != nil {
		t.Fatalf("muster seal rotate: %v\n%s%s", err, out, errOut)
	}
	t.Logf("muster seal rotate:\n%s", out)
	for _, w := range []string{"instances: re-sealed 5 under key " + newKey.KeyID(), "contracts: re-sealed 1", "overrides: re-sealed 1", "shifts: re-sealed 1", "services: re-sealed 2", "grants: re-sealed 1"} {
		if !strings.Contains(out, w) {
			t.Errorf("muster seal rotate does not say %q", w)
		}
	}
	// Run again: there is nothing left to do.
	again, _, err := runChild(t, rotateEnv, "seal", "rotate", "--data", dir)
	if err != nil || !strings.Contains(again, "instances: re-sealed 0") || !strings.Contains(again, "shifts: re-sealed 0") {
		t.Errorf("a second muster seal rotate: %v\n%s", err, again)
	}
	// Step 4: the old key covers nothing.
	status, _, err := runChild(t, []string{"MUSTER_AUDIT_SIGNING_KEY_FILE=" + newFile, "MUSTER_AUDIT_PUBLIC_KEY_FILES="}, "seal", "status", "--data", dir)
	if err != nil || strings.Contains(status, "\n"+old.KeyID()) || !strings.Contains(status, newKey.KeyID()+"  yes (signs)") || strings.Contains(status, "would not start") {
		t.Errorf("muster seal status after the rotation, trusting the new key alone (old key %s): %v\n%s", old.KeyID(), err, status)
	}
	t.Logf("muster seal status:\n%s", status)
	sameView(url, admin, "the replica trusting both keys, after the rotation")

	// The old key retired: a replica trusting the new key alone starts
	// and serves the same view, override and drain.
	stop(both.Process)
	_ = both.Wait()
	addr = freeAddr(t)
	url = "http://" + addr
	alone := startProcess(t, dir, addr, "MUSTER_LEASE_TTL=10m", "MUSTER_SHIFT_DWELL=1s", "MUSTER_AUDIT_SIGNING_KEY_FILE="+newFile)
	t.Cleanup(func() {
		stop(alone.Process)
		_ = alone.Wait()
	})
	admin = token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	sameView(url, admin, "the replica trusting the new key alone")
	if code, body := call(t, "GET", url+"/v1/services/web/grants", admin, ""); code != 200 || !strings.Contains(string(body), `"api"`) {
		t.Errorf("web's grants under the new key alone: %d %s", code, body)
	}
	if code, body := call(t, "GET", url+"/v1/alarms", admin, ""); code != 200 || strings.Contains(string(body), "unsealed") {
		t.Errorf("alarms after the old key was retired: %d %s", code, body)
	}
	// The drain still steps back, in ADR-13's steps (the dwell is 1 s
	// here).
	wait.For(t, 30*time.Second, "the drain stepped back under the new key", func() bool {
		code, body = call(t, "POST", url+"/v1/shifts/"+sh.ID+"/step", admin, `{}`)
		return code == 200
	})
	if code, body := call(t, "GET", url+"/v1/shifts/"+sh.ID, admin, ""); code != 200 || !strings.Contains(string(body), `"step":1`) {
		t.Errorf("the drain after one step: %d %s", code, body)
	}
}

// runChild runs a muster command as a child process (the test binary as
// muster, as startProcess does) with env added to the test's environment,
// and returns its stdout and stderr: a parallel test cannot set the
// environment the in-process commands read.
func runChild(t *testing.T, env []string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := musterChild(ctx, t, env, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}
