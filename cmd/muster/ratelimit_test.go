package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/wait"
)

// TestTwoProcessesShareTheRateLimit (issue 6): two muster processes on one
// database count one actor's override attempts together, so the sixth
// attempt across both is refused with 429 and Retry-After. Attempts
// refused later (here: for want of a justification) still count.
func TestTwoProcessesShareTheRateLimit(t *testing.T) {
	t.Parallel()
	dir := devDir(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	a, b := freeAddr(t), freeAddr(t)
	// Each dev process runs its own issuer at its own address and `muster
	// token` mints for the last one started; dev processes on one data
	// folder are one issuer (its key), so the first trusts the second's
	// tokens with nothing configured.
	first := startProcess(t, dir, a)
	second := startProcess(t, dir, b) // adopts the cluster the first started
	t.Cleanup(func() {
		for _, p := range []interface {
			Signal(os.Signal) error
		}{second.Process, first.Process} {
			_ = p.Signal(os.Interrupt)
		}
		_ = second.Wait()
		_ = first.Wait()
	})

	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	if code, body := call(t, "PUT", "http://"+a+"/v1/services/web", admin, `{"owner":"payments","capabilities":[]}`); code != 201 {
		t.Fatalf("create web: %d %s", code, body)
	}
	code, body := call(t, "POST", "http://"+a+"/v1/services/web/instances", admin, `{"address":"10.1.2.3","port":8080,"zone":"az1"}`)
	if code != 201 {
		t.Fatalf("register: %d %s", code, body)
	}
	var inst struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &inst); err != nil {
		t.Fatal(err)
	}
	oscar := token(t, dir, "--kind", "operator", "--subject", "oscar", "--team", "payments", "--role", "operator")
	attempt := fmt.Sprintf(`{"instance_id":%q,"action":"mark_ineligible","justification":"x","expires_in":600}`, inst.ID)
	for i := range 6 {
		url := "http://" + []string{a, b}[i%2] + "/v1/overrides"
		code, body := call(t, "POST", url, oscar, attempt)
		want := 422 // justification-required, counted
		if i == 5 {
			want = 429
		}
		if code != want {
			t.Fatalf("attempt %d via %s: %d %s, want %d", i+1, url, code, body, want)
		}
	}

	// Both processes hold the data folder's signing key, so an override
	// one puts in force is sealed and the other applies it (docs/overrides.md:
	// overrides and shifts are sealed): alice pins the instance in rotation through
	// the first, and the second's copy in force has it, none unsealed.
	pin := fmt.Sprintf(`{"instance_id":%q,"action":"mark_eligible","justification":"pinned while the prober is rebuilt","expires_in":600}`, inst.ID)
	code, body = call(t, "POST", "http://"+a+"/v1/overrides", admin, pin)
	if code != 201 {
		t.Fatalf("override through the first: %d %s", code, body)
	}
	var o struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &o); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the second process's view carrying the first's sealed override", func() bool {
		_, v := call(t, "GET", "http://"+b+"/v1/resolve/web", admin, "")
		return strings.Contains(string(v), `"override":{"id":"`+o.ID+`"`)
	})
	if _, m := call(t, "GET", "http://"+b+"/metrics", admin, ""); !strings.Contains(string(m), "muster_overrides_unsealed 0\n") {
		t.Error("the second process counts unsealed overrides")
	}
	out, _, err := runCmd(t, "audit", "verify", "--data", dir)
	if err != nil {
		t.Fatalf("audit verify: %v\n%s", err, out)
	}
}
