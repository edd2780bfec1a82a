package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// TestReplicaStartsWithoutTheDatabase (issue 27): two replicas serve a
// region's views on one PostgreSQL; PostgreSQL stops; a third replica,
// started with the other two as its peers, becomes ready on their views
// and their authorisation copy, serves every service at the same version
// and checksum as they do (resolve, and a watch through the resolver
// client), refuses what it cannot authorise, and answers writes 503 with
// Retry-After. When PostgreSQL is back it joins the region's ownership,
// and no version it served ever goes back.
func TestReplicaStartsWithoutTheDatabase(t *testing.T) {
	realTime(t, "three muster processes across a PostgreSQL stop and start")
	t.Parallel() // its own cluster, ports and processes
	dir := devDir(t)
	ctx := context.Background()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	// The cluster is started here, so its address is known to hand the
	// third replica; the dev processes adopt it.
	cluster, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.EnsureDatabase(ctx, "muster"); err != nil {
		t.Fatal(err)
	}
	dsn := cluster.URL("muster")

	a, b, c := freeAddr(t), freeAddr(t), freeAddr(t)
	procs := []*exec.Cmd{startProcess(t, dir, a), startProcess(t, dir, b)}
	t.Cleanup(func() {
		for _, p := range procs {
			_ = p.Process.Signal(os.Interrupt)
		}
		for _, p := range procs {
			_ = p.Wait()
		}
	})

	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	services := []string{"api", "web", "db", "cache", "queue"}
	for i, s := range services {
		if code, body := call(t, "PUT", "http://"+a+"/v1/services/"+s, admin, `{"owner":"payments","capabilities":[]}`); code != 201 {
			t.Fatalf("create %s: %d %s", s, code, body)
		}
		for j := range 3 {
			inst := fmt.Sprintf(`{"address":"10.%d.0.%d","port":8080,"zone":"az%d"}`, i, j+1, j%2+1)
			if code, body := call(t, "POST", "http://"+b+"/v1/services/"+s+"/instances", admin, inst); code != 201 {
				t.Fatalf("register in %s: %d %s", s, code, body)
			}
		}
	}
	// The workload web may resolve api, and nothing else.
	if code, body := call(t, "PUT", "http://"+a+"/v1/services/api/grants", admin, `{"callers":["web"]}`); code != 200 {
		t.Fatalf("grant: %d %s", code, body)
	}
	web := token(t, dir, "--kind", "workload", "--service", "web")

	// view is one service's view at one replica: version and checksum.
	type view struct {
		Version  uint64 `json:"version"`
		Checksum string `json:"checksum"`
	}
	resolve := func(addr, tok, svc string) (int, view, http.Header) {
		t.Helper()
		req, err := http.NewRequest("GET", "http://"+addr+"/v1/resolve/"+svc, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var v view
		if res.StatusCode == 200 {
			if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
				t.Fatal(err)
			}
		}
		return res.StatusCode, v, res.Header
	}
	// agree: every service resolves at every replica named, all at one
	// version and checksum (for each service).
	agree := func(addrs ...string) func() bool {
		return func() bool {
			for _, s := range services {
				var first view
				for i, addr := range addrs {
					code, v, _ := resolve(addr, admin, s)
					if code != 200 || v.Version == 0 || v.Checksum == "" || (i > 0 && v != first) {
						return false
					}
					first = v
				}
			}
			return true
		}
	}
	wait.For(t, time.Minute, "both replicas serving every service at one version and checksum", agree(a, b))
	// The grant was written through a; b's copy of the grants takes it at
	// its next reload. The third replica takes its copy from either, so
	// both must hold the grant before PostgreSQL stops (on a loaded
	// machine b's reload can come after the views agree).
	wait.For(t, time.Minute, "web's grant to resolve api at both replicas", func() bool {
		for _, addr := range []string{a, b} {
			if code, _, _ := resolve(addr, web, "api"); code != 200 {
				return false
			}
		}
		return true
	})

	// PostgreSQL stops; the two replicas go on serving from memory.
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := db.StopDir(stopCtx, dir); err != nil {
		t.Fatal(err)
	}
	held := map[string]view{}
	for _, s := range services {
		code, v, _ := resolve(a, admin, s)
		if code != 200 {
			t.Fatalf("%s at %s with PostgreSQL stopped: %d", s, a, code)
		}
		held[s] = v
	}

	// The third replica: its database stopped, its peers named.
	procs = append(procs, startProcess(t, dir, c, "DATABASE_URL="+dsn, "MUSTER_PEERS=http://"+a+",http://"+b))
	wait.For(t, time.Minute, "the third replica ready without its database", func() bool {
		code, _ := call(t, "GET", "http://"+c+"/readyz", "", "")
		return code == 200
	})
	wait.For(t, 30*time.Second, "the third replica serving every service at the others' version and checksum", agree(a, b, c))
	for _, s := range services {
		if _, v, _ := resolve(c, admin, s); v.Version < held[s].Version {
			t.Fatalf("%s at the third replica: version %d, below the %d held before it started", s, v.Version, held[s].Version)
		}
	}
	// Authorised from the peers' copy of the grants, and fail closed.
	if code, _, _ := resolve(c, web, "api"); code != 200 {
		t.Fatalf("web resolving api (granted) at the third replica: %d", code)
	}
	if code, _, _ := resolve(c, web, "db"); code != 403 {
		t.Fatalf("web resolving db (not granted) at the third replica: %d, want 403", code)
	}

	// A watch, through the public client, on the third replica alone.
	viewer := func(context.Context) (string, error) { return admin, nil }
	rc, err := resolver.New(ctx, resolver.Config{URLs: []string{"http://" + c}, Token: viewer, Services: services,
		CacheDir: t.TempDir(), BaseBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	watched := map[string]uint64{}
	// watchedAgree: the watch holds every service at the version the
	// third replica resolves, and no version it held went back.
	watchedAgree := func() bool {
		ok := true
		for _, s := range services {
			r, err := rc.Resolve(s)
			if err != nil {
				ok = false
				continue
			}
			if r.Version() < watched[s] {
				t.Fatalf("the watch of %s went back from %d to %d", s, watched[s], r.Version())
			}
			watched[s] = r.Version()
			if _, v, _ := resolve(c, admin, s); v.Version != r.Version() {
				ok = false
			}
		}
		return ok
	}
	wait.For(t, 30*time.Second, "a watch on the third replica holding every service at its resolved version", watchedAgree)

	// Writes: 503 problem+json with Retry-After, nothing taken.
	writes := []struct{ method, path, body, problem string }{
		{"POST", "/v1/services/api/instances", `{"address":"10.9.9.9","port":8080,"zone":"az1"}`, "database-unavailable"},
		{"PUT", "/v1/services/api/grants", `{"callers":["web","db"]}`, "database-unavailable"},
		// Taken into memory by a replica that rebuilt; not by this one.
		{"POST", "/v1/reports", `{"reports":[]}`, "read-only"},
	}
	for _, w := range writes {
		req, err := http.NewRequest(w.method, "http://"+c+w.path, strings.NewReader(w.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+admin)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			Type string `json:"type"`
		}
		_ = json.NewDecoder(res.Body).Decode(&p)
		res.Body.Close()
		if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" || res.Header.Get("Content-Type") != "application/problem+json" ||
			p.Type != "https://muster.dev/problems/"+w.problem {
			t.Fatalf("%s %s at the third replica without its database: %d %s, Retry-After %q, %s; want 503 %s (problem+json) with Retry-After",
				w.method, w.path, res.StatusCode, p.Type, res.Header.Get("Retry-After"), res.Header.Get("Content-Type"), w.problem)
		}
	}

	// PostgreSQL is back: the third replica completes its start and joins
	// the region's ownership; no view goes back meanwhile.
	if _, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	third := ""
	wait.For(t, 2*time.Minute, "the third replica owning shards", func() bool {
		watchedAgree()
		code, body := call(t, "GET", "http://"+c+"/v1/replicas", admin, "")
		if code != 200 {
			return false
		}
		var r ownership.RegionStatus
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		third = r.Self
		for _, rep := range r.Replicas {
			if rep.ID == r.Self && rep.Shards > 0 && len(r.Owned) > 0 {
				return true
			}
		}
		return false
	})
	t.Logf("the third replica (%s) owns shards", third)
	wait.For(t, time.Minute, "all three replicas serving every service at one version and checksum", agree(a, b, c))
	wait.For(t, 30*time.Second, "the watch holding every service at its resolved version", watchedAgree)
	for _, s := range services {
		if _, v, _ := resolve(c, admin, s); v.Version < held[s].Version {
			t.Fatalf("%s at the third replica: version %d, below the %d held before it started", s, v.Version, held[s].Version)
		}
	}
	// And it takes writes again.
	wait.For(t, 30*time.Second, "the third replica taking a registration", func() bool {
		code, _ := call(t, "POST", "http://"+c+"/v1/services/api/instances", admin, `{"address":"10.9.9.9","port":8080,"zone":"az1"}`)
		return code == 201
	})
}
