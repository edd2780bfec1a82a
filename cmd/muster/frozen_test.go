package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/wait"
)

// TestDevSurvivesAFrozenDatabase runs `muster dev` as wired for
// production (monitor, authz copy, readiness, request budget) and freezes
// its PostgreSQL with SIGSTOP: writes answer 503 database-unavailable with
// Retry-After within 2 s, resolve and a fresh watch keep working, /readyz
// stays 200, muster_database_up drops to 0 and database_unreachable is
// listed; after SIGCONT the database is up again and writes succeed.
// MUSTER_TEST_FREEZE (default 5s) sets how long it stays frozen.
func TestDevSurvivesAFrozenDatabase(t *testing.T) {
	realTime(t, "PostgreSQL frozen under muster dev")
	hold := 5 * time.Second
	if v := os.Getenv("MUSTER_TEST_FREEZE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("MUSTER_TEST_FREEZE: %v", err)
		}
		hold = d
	}
	dir := devDir(t)
	dev := startDev(t, dir)
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	web := token(t, dir, "--kind", "workload", "--service", "web")
	api := token(t, dir, "--kind", "workload", "--service", "api")
	for _, s := range []struct{ name, body string }{
		{"web", `{"owner":"payments","capabilities":["probe","self","passive"]}`},
		{"api", `{"owner":"search","capabilities":["passive"]}`},
	} {
		if code, body := call(t, "PUT", dev.url+"/v1/services/"+s.name, admin, s.body); code != 201 {
			t.Fatalf("create %s: %d %s", s.name, code, body)
		}
	}
	if code, body := call(t, "PUT", dev.url+"/v1/services/web/grants", admin, `{"callers":["api"]}`); code != 200 {
		t.Fatalf("grant: %d %s", code, body)
	}
	code, body := call(t, "POST", dev.url+"/v1/services/web/instances", web, `{"address":"127.0.0.1","port":9000,"zone":"az1"}`)
	if code != 201 {
		t.Fatalf("register: %d %s", code, body)
	}
	var inst struct {
		ID         string `json:"id"`
		Credential string `json:"credential"`
	}
	if err := json.Unmarshal(body, &inst); err != nil {
		t.Fatal(err)
	}
	// web probes, so its new instance is not capacity before its first
	// success: the workload reports one.
	wait.For(t, 30*time.Second, "web's view holds the instance", func() bool {
		callAs(t, "POST", dev.url+"/v1/reports", web, inst.Credential, `{"reports":[{"instance_id":"`+inst.ID+`","class":"self","outcome":"success"}]}`)
		code, body := call(t, "GET", dev.url+"/v1/resolve/web", api, "")
		return code == 200 && strings.Contains(string(body), `"127.0.0.1"`)
	})
	wait.For(t, 30*time.Second, "/readyz", func() bool { code, _ := call(t, "GET", dev.url+"/readyz", "", ""); return code == 200 })

	thaw := dbtest.Freeze(t, filepath.Join(dir, "pgdata"))
	frozen := time.Now()
	start := time.Now()
	res := do(t, "PUT", dev.url+"/v1/services/web/contract", admin, `{"min_healthy_fraction":0.3}`)
	took := time.Since(start)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" || res.Header.Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(res.body, "/problems/database-unavailable") || took > 2*time.Second {
		t.Fatalf("a write on a frozen database: %d after %s, Retry-After %q, %s", res.StatusCode, took, res.Header.Get("Retry-After"), res.body)
	}
	t.Logf("a write as PostgreSQL freezes: 503 after %s", took.Round(time.Millisecond))

	start = time.Now()
	if code, body := call(t, "GET", dev.url+"/v1/resolve/web", api, ""); code != 200 || !strings.Contains(string(body), `"127.0.0.1"`) {
		t.Fatalf("resolve on a frozen database: %d %s", code, body)
	}
	t.Logf("resolve on a frozen database: 200 after %s", time.Since(start).Round(time.Millisecond))
	watchOnce(t, dev.url, api)
	if code, body := call(t, "GET", dev.url+"/readyz", "", ""); code != 200 {
		t.Fatalf("/readyz on a frozen database: %d %s", code, body)
	}
	up := regexp.MustCompile(`(?m)^muster_database_up (\d)`)
	databaseUp := func() string {
		_, body := call(t, "GET", dev.url+"/metrics", admin, "") // operators may read metrics
		if m := up.FindSubmatch(body); m != nil {
			return string(m[1])
		}
		return ""
	}
	wait.For(t, 10*time.Second, "muster_database_up 0", func() bool { return databaseUp() == "0" })
	t.Logf("muster_database_up 0 after %s", time.Since(frozen).Round(time.Millisecond))
	if _, body := call(t, "GET", dev.url+"/v1/alarms", admin, ""); !strings.Contains(string(body), `"database_unreachable"`) {
		t.Fatalf("alarms on a frozen database: %s", body)
	}
	for time.Since(frozen) < hold {
		start := time.Now()
		res := do(t, "PUT", dev.url+"/v1/services/web/contract", admin, `{"min_healthy_fraction":0.3}`)
		if took := time.Since(start); res.StatusCode != 503 || took > 2*time.Second {
			t.Fatalf("a write during the freeze: %d after %s", res.StatusCode, took)
		}
		time.Sleep(500 * time.Millisecond) // pacing the checks through the hold
	}

	thaw()
	wait.For(t, 30*time.Second, "muster_database_up 1", func() bool { return databaseUp() == "1" })
	wait.For(t, 30*time.Second, "a write after the thaw", func() bool {
		code, _ := call(t, "PUT", dev.url+"/v1/services/web/contract", admin, `{"min_healthy_fraction":0.4}`)
		return code == 200
	})
	if _, body := call(t, "GET", dev.url+"/v1/alarms", admin, ""); strings.Contains(string(body), `"database_unreachable"`) {
		t.Fatalf("alarms after the thaw: %s", body)
	}
}

type response struct {
	*http.Response
	body string
}

// do is call that keeps the headers.
func do(t *testing.T, method, url, tok, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return response{res, string(b)}
}

// watchOnce opens a watch on web and reads its first two events: the
// view, then synced.
func watchOnce(t *testing.T, base, tok string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/watch?service=web", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("a fresh watch on a frozen database: %d %s", res.StatusCode, b)
	}
	var events []string
	sc := bufio.NewScanner(res.Body)
	for len(events) < 2 && sc.Scan() {
		if e, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			events = append(events, e)
		}
	}
	if len(events) < 2 || events[0] != "view" || events[1] != "synced" {
		t.Fatalf("a fresh watch on a frozen database: events %v (%v)", events, sc.Err())
	}
}
