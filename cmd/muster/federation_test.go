package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/federation"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// TestTwoRegionsFollowAndHeal (issue 29, first slice): two muster dev
// processes on loopback, each with its own data folder and PostgreSQL,
// are regions a and b. Region a follows b (--peer b=URL through
// MUSTER_PEER_REGIONS) with a token b minted: a tool with the viewer
// role, which may list and resolve every service of b and write nothing.
//
// a's aggregate comes to hold b's billing exactly as b resolves it. With
// b stopped, a keeps resolving its own service unchanged, lists b stale
// with a growing age, and raises peer_stale. b is then changed while a
// cannot reach it (b restarted on another address, an instance
// registered, stopped again), and restarted on its address: a replaces
// its copy from b's current views and writes exactly one region.reconcile
// audit row naming billing's old and new versions and the endpoint
// added. b's audit log shows nothing done by a's token.
func TestTwoRegionsFollowAndHeal(t *testing.T) {
	realTime(t, "two regions, one stopped, changed and restarted")
	t.Parallel() // its own two regions, data folders and ports
	dirs := regionDirs(t, 2)
	dirA, dirB := dirs[0], dirs[1]
	p := newProcs(t)
	start, stop := p.start, p.stop
	addrA, addrB, addrB2 := freeAddr(t), freeAddr(t), freeAddr(t)
	urlA, urlB, urlB2 := "http://"+addrA, "http://"+addrB, "http://"+addrB2
	envB := []string{"MUSTER_REGION=b", "MUSTER_LEASE_TTL=10m", "MUSTER_XDS_ADDR=", "MUSTER_DNS_ADDR="}

	// Region b: billing with two instances.
	b := start(dirB, addrB, envB...)
	adminB := token(t, dirB, "--kind", "operator", "--subject", "alice", "--role", "admin")
	if code, body := call(t, "PUT", urlB+"/v1/services/billing", adminB, `{"owner":"payments","capabilities":[]}`); code != 201 {
		t.Fatalf("create billing in b: %d %s", code, body)
	}
	for _, addr := range []string{"10.2.0.1", "10.2.0.2"} {
		if code, body := call(t, "POST", urlB+"/v1/services/billing/instances", adminB, `{"address":"`+addr+`","port":8080,"zone":"az1"}`); code != 201 {
			t.Fatalf("register %s in b: %d %s", addr, code, body)
		}
	}
	resolveB := func(base string) resolver.View {
		t.Helper()
		code, body := call(t, "GET", base+"/v1/resolve/billing", adminB, "")
		if code != 200 {
			return resolver.View{}
		}
		var v resolver.View
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatalf("b's view of billing: %v: %s", err, body)
		}
		return v
	}
	wait.For(t, time.Minute, "b's view of billing with its two instances", func() bool { return len(resolveB(urlB).Endpoints) == 2 })

	// The token b issues to region a, in a file a reads.
	tokFile := filepath.Join(t.TempDir(), "b.token")
	if err := os.WriteFile(tokFile, []byte(token(t, dirB, "--kind", "tool", "--subject", "region-a", "--role", "viewer", "--ttl", "24h")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Region a follows b, with short thresholds for the test.
	start(dirA, addrA, "MUSTER_REGION=a", "MUSTER_LEASE_TTL=10m", "MUSTER_XDS_ADDR=", "MUSTER_DNS_ADDR=",
		"MUSTER_PEER_REGIONS=b="+urlB, "MUSTER_PEER_TOKENS=b="+tokFile,
		"MUSTER_PEER_STALE_AFTER=3s", "MUSTER_PEER_DISCOVER_EVERY=1s")
	adminA := token(t, dirA, "--kind", "operator", "--subject", "alice", "--role", "admin")
	viewerA := token(t, dirA, "--kind", "operator", "--subject", "vera", "--role", "viewer")
	if code, body := call(t, "PUT", urlA+"/v1/services/web", adminA, `{"owner":"storefront","capabilities":[]}`); code != 201 {
		t.Fatalf("create web in a: %d %s", code, body)
	}
	if code, body := call(t, "POST", urlA+"/v1/services/web/instances", adminA, `{"address":"10.1.0.1","port":8080,"zone":"az1"}`); code != 201 {
		t.Fatalf("register in a: %d %s", code, body)
	}
	var localWeb []byte
	wait.For(t, time.Minute, "a's view of its own web", func() bool {
		code, body := call(t, "GET", urlA+"/v1/resolve/web", adminA, "")
		localWeb = body
		return code == 200 && strings.Contains(string(body), "10.1.0.1")
	})

	regions := func() federation.PeerStatus {
		t.Helper()
		code, body := call(t, "GET", urlA+"/v1/regions", viewerA, "")
		var r struct {
			Region string                  `json:"region"`
			Peers  []federation.PeerStatus `json:"peers"`
		}
		if code != 200 || json.Unmarshal(body, &r) != nil || r.Region != "a" || len(r.Peers) != 1 || r.Peers[0].Region != "b" {
			t.Fatalf("GET /v1/regions at a: %d %s", code, body)
		}
		if strings.Contains(string(body), "eyJ") {
			t.Fatalf("GET /v1/regions shows a token: %s", body)
		}
		return r.Peers[0]
	}
	remote := func() (resolver.View, float64, bool) {
		t.Helper()
		code, body := call(t, "GET", urlA+"/v1/regions/b/views/billing", viewerA, "")
		if code != 200 {
			return resolver.View{}, 0, false
		}
		var r struct {
			AgeSeconds float64       `json:"age_seconds"`
			View       resolver.View `json:"view"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatalf("a's view of b's billing: %v: %s", err, body)
		}
		return r.View, r.AgeSeconds, true
	}
	alarms := func() []assembler.Alarm {
		t.Helper()
		code, body := call(t, "GET", urlA+"/v1/alarms", viewerA, "")
		var l struct {
			Alarms []assembler.Alarm `json:"alarms"`
		}
		if code != 200 || json.Unmarshal(body, &l) != nil {
			t.Fatalf("GET /v1/alarms at a: %d %s", code, body)
		}
		return slices.DeleteFunc(l.Alarms, func(a assembler.Alarm) bool { return a.Kind != federation.AlarmPeerStale })
	}
	// a follows b: connected, billing followed, and a's copy is b's view.
	wait.For(t, 90*time.Second, "a connected to b and following billing", func() bool {
		st := regions()
		return st.Connected && !st.Stale && slices.Contains(st.Services, "billing")
	})
	var before resolver.View
	wait.For(t, time.Minute, "a's copy of billing equal to b's GET /v1/resolve/billing", func() bool {
		got, _, ok := remote()
		want := resolveB(urlB)
		before = got
		return ok && got.Version == want.Version && cmp.Equal(got.Endpoints, want.Endpoints) && len(got.Endpoints) == 2
	})
	if al := alarms(); len(al) != 0 {
		t.Fatalf("peer_stale while b answers: %+v", al)
	}

	// b goes away: a's own resolution is untouched, b goes stale with a
	// growing age, peer_stale opens, and the copy is served as it was.
	stop(b)
	wait.For(t, 30*time.Second, "b stale at a, with peer_stale", func() bool {
		st := regions()
		return st.Stale && !st.Connected && st.AgeSeconds > 3 && len(alarms()) == 1
	})
	if al := alarms(); !strings.Contains(al[0].Detail, "peer region b") || !strings.Contains(al[0].Detail, "own resolution is unaffected") {
		t.Fatalf("peer_stale: %+v", al)
	}
	// The copy a holds from here on is the last view b published before
	// it went away: b's slow start may have moved a weight (a new
	// version) after the copy above matched, and a took that before b
	// stopped. It must not change while b is away.
	held, _, ok := remote()
	if !ok || held.Version < before.Version || len(held.Endpoints) != 2 {
		t.Fatalf("a's copy of billing once b is stale: %+v (%v); before %+v", held, ok, before)
	}
	before = held
	age := regions().AgeSeconds
	wait.For(t, 10*time.Second, "b's age growing at a", func() bool { return regions().AgeSeconds >= age+1 })
	if code, body := call(t, "GET", urlA+"/v1/resolve/web", adminA, ""); code != 200 || string(body) != string(localWeb) {
		t.Fatalf("a's own web while b is away: %d %s; before %s", code, body, localWeb)
	}
	if got, remoteAge, ok := remote(); !ok || got.Version != before.Version || !cmp.Equal(got.Endpoints, before.Endpoints) || remoteAge <= 3 {
		t.Fatalf("a's copy of billing while b is away: %+v age %.1f s (%v); before %+v", got, remoteAge, ok, before)
	}

	// b changes while a cannot reach it: restarted on another address
	// (a follows b's own), a third instance registered, stopped again.
	b2 := start(dirB, addrB2, envB...)
	if code, body := call(t, "POST", urlB2+"/v1/services/billing/instances", adminB, `{"address":"10.2.0.3","port":8080,"zone":"az1"}`); code != 201 {
		t.Fatalf("register 10.2.0.3 in b: %d %s", code, body)
	}
	var changed resolver.View
	wait.For(t, time.Minute, "b's view of billing with its third instance", func() bool {
		changed = resolveB(urlB2)
		return len(changed.Endpoints) == 3
	})
	if !regions().Stale {
		t.Fatal("b is not stale at a while only its other address answers")
	}
	stop(b2)

	// b is back on its address: a replaces its copy from b's current
	// views and audits the reconciliation once.
	start(dirB, addrB, envB...)
	wait.For(t, 90*time.Second, "a's copy of billing replaced from b's current view", func() bool {
		got, _, ok := remote()
		want := resolveB(urlB)
		return ok && got.Version >= changed.Version && got.Version == want.Version && cmp.Equal(got.Endpoints, want.Endpoints) && len(got.Endpoints) == 3
	})
	wait.For(t, 30*time.Second, "b reached again at a, peer_stale closed", func() bool {
		st := regions()
		return st.Connected && !st.Stale && st.Reconciliations == 1 && len(alarms()) == 0
	})
	rows := func() []audit.Event {
		t.Helper()
		code, body := call(t, "GET", urlA+"/v1/audit?action="+federation.ActionReconcile, adminA, "")
		var l struct {
			Items []audit.Event `json:"items"`
		}
		if code != 200 || json.Unmarshal(body, &l) != nil {
			t.Fatalf("GET /v1/audit at a: %d %s", code, body)
		}
		return l.Items
	}
	wait.For(t, 30*time.Second, "a region.reconcile audit row at a", func() bool { return len(rows()) >= 1 })
	got := rows()
	if len(got) != 1 || got[0].Actor != "system:federation" || got[0].Target != "b" || got[0].TargetKind != "region" {
		t.Fatalf("region.reconcile rows: %+v", got)
	}
	var rec federation.Reconciliation
	if err := json.Unmarshal(got[0].After, &rec); err != nil {
		t.Fatalf("the row's after: %v: %s", err, got[0].After)
	}
	if rec.Changed != 1 || rec.Appeared != 0 || rec.Vanished != 0 || len(rec.Services) != 1 {
		t.Fatalf("reconciliation: %+v", rec)
	}
	c := rec.Services[0]
	if c.Service != "billing" || c.Change != federation.ChangeChanged || c.OldVersion != before.Version || c.NewVersion < changed.Version ||
		c.EndpointsAdded != 1 || c.EndpointsRemoved != 0 {
		t.Fatalf("billing's change: %+v (before v%d, changed at b to v%d)", c, before.Version, changed.Version)
	}
	t.Logf("heal audited: %s; billing v%d -> v%d, +%d -%d ~%d endpoints", got[0].Reason, c.OldVersion, c.NewVersion, c.EndpointsAdded, c.EndpointsRemoved, c.EndpointsChanged)

	// b's registry was never written by a: its audit log names only
	// alice (and the system), never a's token.
	code, body := call(t, "GET", urlB+"/v1/audit?limit=500", adminB, "")
	if code != 200 {
		t.Fatalf("GET /v1/audit at b: %d %s", code, body)
	}
	var bl struct {
		Items []audit.Event `json:"items"`
	}
	if err := json.Unmarshal(body, &bl); err != nil {
		t.Fatal(err)
	}
	for _, e := range bl.Items {
		if strings.Contains(e.Actor, "region-a") {
			t.Errorf("b's audit log has a row by a's token: %+v", e)
		}
	}
	if len(rows()) != 1 {
		t.Fatalf("more than one region.reconcile row: %s", fmt.Sprint(rows()))
	}
}
