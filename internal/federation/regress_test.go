package federation

import (
	"context"
	"encoding/json"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

func remote(region, service string, version uint64, eps ...resolver.Endpoint) RemoteView {
	if eps == nil {
		eps = []resolver.Endpoint{}
	}
	return RemoteView{Region: region, View: resolver.View{Service: service, Version: version, Endpoints: eps, Checksum: resolver.Checksum(eps)}}
}

// TestRegressKeepsServedVersionsIncreasing: a regression of b's billing
// is served under the version after the last one served, and every later
// view of it on the peer's new line under its own version plus that
// offset, so this region's subscribers take them all; a second
// regression stacks; the mark clears when the peer passes the version
// held before the first, the offset stays. Nothing else moves: b's other
// service, c's billing. A regression is refused when nothing is held,
// when the version is not below the one held, and when no version is left
// to serve it under.
func TestRegressKeepsServedVersionsIncreasing(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	agg := NewAggregate([]PeerConfig{{Name: "b"}, {Name: "c"}}, time.Minute, func() time.Time { return now })
	var frames []*stream.Frame
	agg.SetSink(func(f []*stream.Frame) { frames = append(frames, f...) })
	put := func(v RemoteView) {
		t.Helper()
		if !agg.put(v) {
			t.Fatalf("put %s v%d refused", v.View.Service, v.View.Version)
		}
		agg.emit([]RemoteView{v})
	}
	served := func(region, service string) (uint64, *Regression) {
		t.Helper()
		v, _, ok := agg.View(region, service)
		if !ok {
			t.Fatalf("no %s@%s", service, region)
		}
		return v.Served(), v.Regressed
	}
	put(remote("b", "billing", 50, ep("00000000-0000-0000-0000-000000000001", "10.0.0.1", 80), ep("00000000-0000-0000-0000-000000000002", "10.0.0.2", 80)))
	put(remote("b", "search", 3))
	put(remote("c", "billing", 7))

	if agg.regress(remote("b", "billing", 50), now) || agg.regress(remote("b", "billing", 60), now) || agg.regress(remote("b", "ledger", 1), now) {
		t.Fatal("a regression taken that is none (same or higher version, or nothing held)")
	}
	// b restored: billing at v40, the second endpoint withdrawn.
	if !agg.regress(remote("b", "billing", 40, ep("00000000-0000-0000-0000-000000000001", "10.0.0.1", 80)), now) {
		t.Fatal("regression refused")
	}
	agg.emit([]RemoteView{remote("b", "billing", 40, ep("00000000-0000-0000-0000-000000000001", "10.0.0.1", 80))})
	if s, r := served("b", "billing"); s != 51 || r == nil || *r != (Regression{From: 50, To: 40, Served: 51, Since: now}) {
		t.Fatalf("after the regression: served v%d, %+v", s, r)
	}
	if v, _, _ := agg.View("b", "billing"); len(v.View.Endpoints) != 1 {
		t.Fatalf("the regressed view is not the peer's: %+v", v.View)
	}
	alarms := agg.Alarms()
	if len(alarms) != 1 || alarms[0].Kind != AlarmPeerRegressed || !strings.Contains(alarms[0].Detail, "billing (held v50, took v40, served as v51)") {
		t.Fatalf("alarms: %+v", alarms)
	}
	if st := agg.Regions()[0]; len(st.Regressed) != 1 || st.Regressed[0].Service != "billing" {
		t.Fatalf("b's status: %+v", st)
	}
	// The new line goes on; a stale view from the old line below the new
	// one is still refused by version.
	put(remote("b", "billing", 45))
	if agg.put(remote("b", "billing", 44)) {
		t.Fatal("a version below the one held taken by put")
	}
	if s, r := served("b", "billing"); s != 56 || r == nil {
		t.Fatalf("v45 on the new line: served v%d, %+v", s, r)
	}
	// A second restore, further back: stacked, From stays 50.
	now = now.Add(time.Minute)
	if !agg.regress(remote("b", "billing", 10), now) {
		t.Fatal("second regression refused")
	}
	agg.emit([]RemoteView{remote("b", "billing", 10)})
	if s, r := served("b", "billing"); s != 57 || r == nil || r.From != 50 || r.To != 10 {
		t.Fatalf("second regression: served v%d, %+v", s, r)
	}
	// The peer passes v50: the mark clears, the offset stays.
	put(remote("b", "billing", 51))
	if s, r := served("b", "billing"); s != 98 || r != nil {
		t.Fatalf("past the version held before: served v%d, %+v", s, r)
	}
	if a := agg.Alarms(); len(a) != 0 {
		t.Fatalf("alarms after the peer passed: %+v", a)
	}
	// Nothing else moved.
	if s, r := served("b", "search"); s != 3 || r != nil {
		t.Fatalf("b's search: v%d %+v", s, r)
	}
	if s, r := served("c", "billing"); s != 7 || r != nil {
		t.Fatalf("c's billing: v%d %+v", s, r)
	}
	// Every frame of billing@b above the one before, and the regressed
	// ones say so.
	var last uint64
	for _, f := range frames {
		if f.Service != "billing@b" {
			continue
		}
		if f.Version <= last {
			t.Fatalf("billing@b frames go back: v%d after v%d", f.Version, last)
		}
		last = f.Version
		regressed := strings.Contains(string(f.JSON), `"regressed"`)
		if want := f.Version == 51 || f.Version == 56 || f.Version == 57; regressed != want {
			t.Fatalf("frame v%d marked regressed: %v (%s)", f.Version, regressed, f.JSON)
		}
	}
	if last != 98 {
		t.Fatalf("last billing@b frame v%d, want v98", last)
	}
	// A peer at the top of the range has nothing left to regress to.
	put(remote("b", "top", math.MaxUint64))
	if agg.regress(remote("b", "top", 1), now) {
		t.Fatal("a regression taken with no version left to serve it under")
	}
	if s, _ := served("b", "top"); s != math.MaxUint64 {
		t.Fatalf("top served v%d", s)
	}
}

// TestJudgeTakesOnlyAConfirmedRegression: a version below the one held
// is suspected at the first read; a read that finds the peer back at or
// above it (a lagging replica of the peer caught up) clears the
// suspicion; only a version still below after RegressAfter is taken. A
// peer flapping its versions so makes this region go back at most once
// per RegressAfter.
func TestJudgeTakesOnlyAConfirmedRegression(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "b.token")
	if err := os.WriteFile(tok, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	fed, err := New(Config{Region: "a", Peers: []PeerConfig{{Name: "b", URLs: []string{"http://127.0.0.1:1"}, TokenFile: tok}},
		RegressAfter: 30 * time.Second, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	f := fed.Followers()[0]
	agg := fed.Aggregate
	agg.put(remote("b", "billing", 50))
	held := func() uint64 { v, _, _ := agg.View("b", "billing"); return v.View.Version }
	ctx := context.Background()
	steps := []struct {
		at   time.Duration
		peer uint64
		want uint64 // the peer's version held after the read
	}{
		{0, 40, 50},                 // suspected
		{10 * time.Second, 52, 50},  // caught up: no longer suspected (52 is the client's to take)
		{35 * time.Second, 40, 50},  // suspected again, from here
		{64 * time.Second, 40, 50},  // 29 s later: not yet
		{65 * time.Second, 41, 41},  // 30 s later, still below: taken
		{70 * time.Second, 20, 41},  // a new suspicion starts; nothing taken at once
		{99 * time.Second, 20, 41},  // 29 s
		{100 * time.Second, 20, 20}, // 30 s: taken
	}
	for i, s := range steps {
		f.judge(ctx, []RemoteView{remote("b", "billing", s.peer)}, t0.Add(s.at))
		if got := held(); got != s.want {
			t.Fatalf("step %d (peer v%d at +%s): held v%d, want v%d", i, s.peer, s.at, got, s.want)
		}
	}
	if v, _, _ := agg.View("b", "billing"); v.Served() != 52 || v.Regressed == nil || v.Regressed.From != 50 {
		t.Fatalf("after two regressions: %+v served v%d", v.Regressed, v.Served())
	}
	if !f.nextProbe.Equal(t0.Add(100*time.Second + DefaultRegressCheck)) {
		t.Fatalf("next read at %s, want the periodic one", f.nextProbe)
	}
}

// TestFollowerTakesARegressedPeer: region b's database is restored: its
// billing goes back from v50 (two endpoints) to v40 (the second one
// withdrawn). Its watch sends a follower that holds v50 nothing (as
// muster's hub does for a client ahead of it), so before this the
// follower kept the withdrawn endpoint for good. Now it reads b's current
// versions after the reconnect, confirms the regression RegressAfter
// later, and takes v40: served as billing@b v51 with "regressed", the
// peer_regressed alarm naming it, one region.regressed audit row. b's
// next views on its new line follow (v41 served as v52); when b passes
// v50 the mark and the alarm clear, the versions served still
// increasing. search, which did not go back, is untouched. A restart
// serves the same versions (the offset is kept on disk).
func TestFollowerTakesARegressedPeer(t *testing.T) {
	peer := newFakePeer()
	e1, e2, e3 := ep("00000000-0000-0000-0000-000000000001", "10.0.0.1", 80), ep("00000000-0000-0000-0000-000000000002", "10.0.0.2", 80), ep("00000000-0000-0000-0000-000000000003", "10.0.0.3", 80)
	peer.set(resolver.View{Service: "billing", Version: 50, Endpoints: []resolver.Endpoint{e1, e2}})
	peer.set(resolver.View{Service: "search", Version: 9, Endpoints: []resolver.Endpoint{e3}})
	srv := httptest.NewServer(peer)
	defer srv.Close()
	tok := filepath.Join(t.TempDir(), "b.token")
	if err := os.WriteFile(tok, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	var mu sync.Mutex
	var served []uint64 // billing@b's frames, in order
	start := func(au *fakeAudit) (*Aggregate, *Follower) {
		t.Helper()
		fed, err := New(Config{
			Region: "a", Peers: []PeerConfig{{Name: "b", URLs: []string{srv.URL}, TokenFile: tok}}, CacheDir: cache,
			StaleAfter: 10 * time.Second, Discover: 50 * time.Millisecond, Tick: 20 * time.Millisecond,
			BaseBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Audit: au,
			RegressAfter: 200 * time.Millisecond, RegressCheck: 100 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		fed.Aggregate.SetSink(func(fs []*stream.Frame) {
			mu.Lock()
			defer mu.Unlock()
			for _, f := range fs {
				if f.Service == "billing@b" {
					served = append(served, f.Version)
				}
			}
		})
		f := fed.Followers()[0]
		if err := f.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		return fed.Aggregate, f
	}
	au := &fakeAudit{}
	agg, f := start(au)
	billing := func() RemoteView { v, _, _ := agg.View("b", "billing"); return v }
	wait.For(t, 30*time.Second, "billing v50 at a", func() bool { return billing().View.Version == 50 })

	// b restored: billing v40 without 10.0.0.2; b restarts (streams cut).
	peer.set(resolver.View{Service: "billing", Version: 40, Endpoints: []resolver.Endpoint{e1}})
	peer.setDown(true)
	peer.setDown(false)
	wait.For(t, 30*time.Second, "b's billing v40 taken", func() bool { return billing().View.Version == 40 })
	v := billing()
	if v.Served() != 51 || v.Regressed == nil || v.Regressed.From != 50 || v.Regressed.To != 40 || len(v.View.Endpoints) != 1 {
		t.Fatalf("billing after the restore: served v%d %+v %+v", v.Served(), v.Regressed, v.View.Endpoints)
	}
	if a := agg.Alarms(); len(a) != 1 || a[0].Kind != AlarmPeerRegressed || !strings.Contains(a[0].Detail, "billing (held v50, took v40, served as v51)") {
		t.Fatalf("alarms: %+v", a)
	}
	if s, _, _ := agg.View("b", "search"); s.Served() != 9 || s.Regressed != nil {
		t.Fatalf("search moved: %+v", s)
	}
	wait.For(t, 10*time.Second, "the region.regressed row", func() bool { return len(au.entries()) == 1 })
	if row := au.entries()[0]; row.Action != ActionRegressed || row.Target != "b" || !strings.Contains(row.Reason, "billing") {
		t.Fatalf("audit row: %+v", row)
	}

	// b's new line goes on, then passes v50.
	peer.set(resolver.View{Service: "billing", Version: 41, Endpoints: []resolver.Endpoint{e1, e3}})
	peer.setDown(true)
	peer.setDown(false)
	wait.For(t, 30*time.Second, "billing v41 served as v52", func() bool { v := billing(); return v.Served() == 52 && v.Regressed != nil })
	peer.set(resolver.View{Service: "billing", Version: 60, Endpoints: []resolver.Endpoint{e3}})
	peer.setDown(true)
	peer.setDown(false)
	wait.For(t, 30*time.Second, "billing v60 served as v71, no longer regressed", func() bool {
		v := billing()
		return v.Served() == 71 && v.Regressed == nil && len(agg.Alarms()) == 0
	})
	mu.Lock()
	got := slices.Clone(served)
	mu.Unlock()
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("billing@b served versions go back: %v", got)
		}
	}
	if !slices.Contains(got, 51) || got[len(got)-1] != 71 {
		t.Fatalf("billing@b served versions %v, want v51 among them and v71 last", got)
	}
	wait.For(t, 10*time.Second, "the offset on disk", func() bool {
		b, err := os.ReadFile(filepath.Join(cache, "b", seriesFile))
		var st map[string]SeriesState
		return err == nil && json.Unmarshal(b, &st) == nil && st["billing"].Offset == 11 && st["billing"].Regressed == nil
	})
	f.Stop()

	// A restart serves billing under the same version.
	again, f2 := start(&fakeAudit{})
	defer f2.Stop()
	wait.For(t, 30*time.Second, "billing served as v71 after the restart", func() bool {
		v, _, ok := again.View("b", "billing")
		return ok && v.View.Version == 60 && v.Served() == 71
	})
}
