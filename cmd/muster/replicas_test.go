package main

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/wait"
)

// TestTwoDevProcessesShareTheShards (issue 27): two muster dev processes
// on one data folder are two replicas of one region. One token (minted
// for the last started) is good at both, and each one's GET /v1/replicas
// comes to show both replicas holding 32 of the 64 shards, none unowned.
// When one is stopped (Ctrl-C), it hands its shards over and the other
// holds all 64.
func TestTwoDevProcessesShareTheShards(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two muster dev processes")
	}
	t.Parallel()
	dir := devDir(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	a, b := freeAddr(t), freeAddr(t)
	first := startProcess(t, dir, a, "MUSTER_LEASE_TTL=10m")
	second := startProcess(t, dir, b, "MUSTER_LEASE_TTL=10m")
	t.Cleanup(func() {
		for _, p := range []*os.Process{first.Process, second.Process} {
			_ = p.Signal(os.Interrupt)
		}
		_ = first.Wait()
		_ = second.Wait()
	})
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	region := func(addr string) ownership.RegionStatus {
		t.Helper()
		code, body := call(t, "GET", "http://"+addr+"/v1/replicas", admin, "")
		if code != 200 {
			t.Fatalf("GET /v1/replicas at %s: %d %s", addr, code, body)
		}
		var r ownership.RegionStatus
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	halves := func(addr string) func() bool {
		return func() bool {
			r := region(addr)
			return len(r.Replicas) == 2 && r.Replicas[0].Shards == 32 && r.Replicas[1].Shards == 32 && len(r.Unowned) == 0 && len(r.Owned) == 32
		}
	}
	wait.For(t, time.Minute, "both replicas holding 32 shards, as "+a+" reads it", halves(a))
	wait.For(t, time.Minute, "both replicas holding 32 shards, as "+b+" reads it", halves(b))

	if err := second.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := second.Wait(); err != nil {
		t.Fatalf("the second muster dev after Ctrl-C: %v", err)
	}
	wait.For(t, time.Minute, "the first replica holding all 64 shards", func() bool {
		r := region(a)
		return len(r.Replicas) == 1 && len(r.Owned) == 64 && len(r.Unowned) == 0
	})
}
