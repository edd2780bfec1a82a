package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/routingcontrol"
	"github.com/musterhq/muster/internal/wait"
)

// TestRoutingControlFlags: malformed --routing-control values are refused
// at start, before any database is started, with the reason.
func TestRoutingControlFlags(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--routing-control", "ftp://controls"}, "want file:/PATH, https://HOST/PATH or dns:NAME"},
		{[]string{"--routing-control", "http://controls.example.org/"}, "must not travel in clear"},
		{[]string{"--routing-control", "dns:bad..name"}, "is not a DNS name"},
		{[]string{"--routing-control", "dns:_r.example.org@nohost"}, "is not HOST:PORT"},
		{[]string{"--routing-control", "https://c.example.org/", "--routing-control-ca", filepath.Join(dir, "missing.pem")}, "CA bundle"},
		{[]string{"--routing-control-ca", filepath.Join(dir, "ca.pem")}, "without --routing-control"},
	} {
		_, _, err := runCmd(t, append([]string{"dev", "--data", dir}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
	t.Setenv("MUSTER_ROUTING_CONTROL_INTERVAL", "soon")
	if _, _, err := runCmd(t, "dev", "--data", dir, "--routing-control", "file:/x.json"); err == nil || !strings.Contains(err.Error(), "MUSTER_ROUTING_CONTROL_INTERVAL") {
		t.Errorf("a bad interval: %v", err)
	}
}

// TestRoutingControlDev: muster dev reading a routing-control file
// answers GET /v1/routing-controls (a viewer may read it, a workload may
// not), picks up the file replaced by a rename, writes the change to the
// audit log as a system action, and keeps the last good controls when
// the file turns malformed.
func TestRoutingControlDev(t *testing.T) {
	t.Setenv("MUSTER_ROUTING_CONTROL_INTERVAL", "100ms")
	dir := devDir(t)
	path := filepath.Join(t.TempDir(), "controls.json")
	write := func(content string) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"regions":{"local":"on","eu-west-1":"on"}}`)
	dev := startDev(t, dir, "--routing-control", "file:"+path)
	viewer := token(t, dir, "--kind", "operator", "--subject", "vera", "--role", "viewer")
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	web := token(t, dir, "--kind", "workload", "--service", "web")

	get := func() routingcontrol.Status {
		t.Helper()
		code, body := call(t, "GET", dev.url+"/v1/routing-controls", viewer, "")
		if code != 200 {
			t.Fatalf("GET /v1/routing-controls: %d %s", code, body)
		}
		var st routingcontrol.Status
		if err := json.Unmarshal(body, &st); err != nil {
			t.Fatalf("GET /v1/routing-controls: %v: %s", err, body)
		}
		return st
	}
	state := func(st routingcontrol.Status, region string) routingcontrol.State {
		for _, r := range st.Regions {
			if r.Region == region {
				return r.State
			}
		}
		return ""
	}
	wait.For(t, 30*time.Second, "the first reading", func() bool { return !get().LastRead.IsZero() })
	st := get()
	if st.Source != "file" || st.Location != path || state(st, "eu-west-1") != routingcontrol.On || state(st, "local") != routingcontrol.On || st.Stale {
		t.Fatalf("first reading: %+v", st)
	}
	if code, body := call(t, "GET", dev.url+"/v1/routing-controls", web, ""); code != 403 {
		t.Fatalf("a workload reading the routing controls: %d %s", code, body)
	}

	write(`{"regions":{"local":"on","eu-west-1":"off"}}`)
	wait.For(t, 30*time.Second, "eu-west-1 turned off", func() bool { return state(get(), "eu-west-1") == routingcontrol.Off })
	// The audit row follows the change within the same read.
	var body []byte
	wait.For(t, 10*time.Second, "the change in the audit log", func() bool {
		var code int
		code, body = call(t, "GET", dev.url+"/v1/audit?action="+routingcontrol.ActionChange, admin, "")
		return code == 200 && strings.Contains(string(body), `"target":"eu-west-1"`)
	})
	if !strings.Contains(string(body), `"actor":"system:routing-control"`) || !strings.Contains(string(body), `"actor_kind":"system"`) ||
		!strings.Contains(string(body), "turned region eu-west-1 off") || strings.Count(string(body), `"seq"`) != 1 {
		t.Fatalf("GET /v1/audit: %s, want the one change as a system action", body)
	}

	// A malformed file: the last good controls stay in force.
	write(`{"regions":{"eu-west-1":"of"}}`)
	wait.For(t, 30*time.Second, "the malformed reading noticed", func() bool {
		return strings.HasPrefix(get().LastError, routingcontrol.ReasonMalformed)
	})
	if st := get(); state(st, "eu-west-1") != routingcontrol.Off || state(st, "local") != routingcontrol.On {
		t.Fatalf("after a malformed file: %+v", st)
	}
}
