package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/db"
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
	// token` mints for the last one started, so the first also trusts the
	// second's.
	first := startProcess(t, dir, a, "MUSTER_ISSUERS=http://"+b+"/dev/issuer")
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
	out, _, err := runCmd(t, "audit", "verify", "--data", dir)
	if err != nil {
		t.Fatalf("audit verify: %v\n%s", err, out)
	}
}
